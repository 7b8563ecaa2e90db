"""A deployment that starts failing loses its share within seconds: simulated traffic, simulated time.

Three deployments (100, 80 and 60 tokens/s) get 30 requests per simulated second through the default
settings; the background syncs of the balancer run as they would (tasks on the event loop, against the
embedded store on the same simulated clock). At t = 60 s the fastest one starts failing.
"""

from __future__ import annotations

import asyncio
import heapq
import random

import pytest

from litellm_ratebalance.routing import Candidate, RateBalancer, RoutingSettings
from litellm_ratebalance.store import MemoryStore
from tests.unit.routing_support import T0, Clock

CANDIDATES = (Candidate("fast"), Candidate("mid"), Candidate("slow"))
RATES = {"fast": 100.0, "mid": 80.0, "slow": 60.0}
T_FAIL = 60.0
TICK = 0.1
PER_TICK = 3
END = 90.0


async def simulate(failure: str, seed: int) -> tuple[RateBalancer, Clock, list[tuple[float, int]]]:
    """Run END simulated seconds; return the balancer, its clock and every (time, pick)."""
    clock = Clock()
    rng = random.Random(seed)
    balancer = RateBalancer(MemoryStore(clock=clock), RoutingSettings(), clock=clock, rng=random.Random(seed))
    in_flight: list[tuple[float, int, str, float, int, bool]] = []
    picks: list[tuple[float, int]] = []
    sequence = 0
    for step in range(int(END / TICK)):
        t = step * TICK
        clock.now = T0 + t
        for _ in range(PER_TICK):
            index = balancer.choose("g", CANDIDATES)
            picks.append((t, index))
            name = CANDIDATES[index].id
            output = max(10, int(rng.gauss(200, 40)))
            latency = output / max(5.0, rng.gauss(RATES[name], RATES[name] * 0.15))
            ok = True
            if name == "fast" and t >= T_FAIL:
                if failure == "errors":  # 5xx / 429 bursts: answered at once
                    latency, ok = 0.05, False
                else:  # stalled: no answer until a 60 s timeout
                    latency, ok = 60.0, False
            sequence += 1
            heapq.heappush(in_flight, (t + latency, sequence, name, latency, output, ok))
        while in_flight and in_flight[0][0] <= t + TICK:
            _, _, name, latency, output, ok = heapq.heappop(in_flight)
            balancer.record("g", name, latency=latency, output_tokens=output if ok else 0, ok=ok)
        # Let the balancer's background syncs run, as the proxy's event loop would between requests.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    return balancer, clock, picks


def share(picks: list[tuple[float, int]], start: float, end: float) -> float:
    chosen = [index for t, index in picks if start <= t < end]
    return sum(1 for index in chosen if index == 0) / len(chosen)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("failure", ["errors", "stall"])
async def test_failing_deployment_loses_90_percent_of_its_share_within_10_seconds(failure: str, seed: int) -> None:
    _, _, picks = await simulate(failure, seed)
    before = share(picks, T_FAIL - 10, T_FAIL)
    assert before > 0.5  # it was the favourite
    late = share(picks, T_FAIL + 8, T_FAIL + 10)
    assert late <= 0.1 * before, (before, late)
    # It is not dropped for good: the exploration share keeps probing it (20 s: ~10 probes expected, so a
    # run of bad luck in the draws does not read as zero).
    assert 0 < share(picks, T_FAIL + 10, END) < 0.1


async def test_weights_drop_while_the_deployment_fails() -> None:
    balancer, clock, _ = await simulate("errors", 5)
    await balancer.refresh("g")
    estimates = balancer.estimates("g", CANDIDATES)
    assert estimates["fast"].share is not None and estimates["fast"].share < 0.03
    assert estimates["fast"].recent_failures > 0 and estimates["mid"].recent_failures == 0
    assert estimates["mid"].share is not None and estimates["mid"].share > estimates["slow"].share  # type: ignore[operator]
    assert clock.now == pytest.approx(T0 + END - TICK)
