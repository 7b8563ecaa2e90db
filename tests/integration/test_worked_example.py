"""The documentation's worked example, window by window, through the limiter's hooks.

Model tpm 1000, reservations team_a 0.5 / team_b 0.5. Team A always asks for more than the whole model;
team B asks for what the row says. Requests of 20 tokens arrive spread evenly over each 60 s window in
proportion to demand, and each finishes (and is reconciled) before the next one arrives. A fake clock
drives the embedded store, so windows roll over without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from litellm_ratebalance.store import MemoryStore
from tests.integration.limiter_support import auth, call, finish, make_limiter, make_router, request

REQUEST_TOKENS = 20


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def run_windows(threshold: float, demands_b: list[int]) -> list[tuple[int, int]]:
    """Tokens served to (A, B) in each window; A demands 2000 tokens per window."""
    clock = Clock()
    settings = {
        "priority_reservation": {"team_a": 0.5, "team_b": 0.5},
        "priority_reservation_settings": {"saturation_threshold": threshold},
        "ratebalance": {"limiter": {"token_rate_limit_type": "output"}},
    }
    limiter = make_limiter(MemoryStore(clock=clock), make_router(tpm=1000), settings)
    served: list[tuple[int, int]] = []
    for demand_b in demands_b:
        window_start = clock.now
        arrivals = [(i / 100, "team_a") for i in range(100)]  # 100 x 20 = 2000 tokens
        count_b = demand_b // REQUEST_TOKENS
        arrivals += [((j + 0.5) / count_b, "team_b") for j in range(count_b)]
        got = {"team_a": 0, "team_b": 0}
        for offset, team in sorted(arrivals):
            clock.now = window_start + offset * 59.0
            data = request(max_tokens=REQUEST_TOKENS)
            if await call(limiter, data, auth(team_priority=team)) is None:
                await finish(limiter, data, 2 * REQUEST_TOKENS)  # output half = 20 tokens
                got[team] += REQUEST_TOKENS
        served.append((got["team_a"], got["team_b"]))
        clock.now = window_start + 60.0
    return served


async def test_worked_example_threshold_half() -> None:
    served = await run_windows(0.5, [0, 500, 400])
    # Window 1: A alone saturates the model to 50% and strict mode caps it at its own 500 floor.
    assert served[0] == (500, 0)
    # Window 2: strict mode splits the capacity 50/50.
    assert served[1] == (500, 500)
    # Window 3: B below its floor is fully served; A takes its share.
    assert served[2] == (500, 400)


async def test_worked_example_threshold_point_eight() -> None:
    served = await run_windows(0.8, [0, 500])
    # Window 1: A borrows up to the threshold.
    assert served[0] == (800, 0)
    # Window 2: A grabs its part of the first 800 tokens in lenient mode (4:1 arrival ratio), which is
    # not given back; B then runs into the model-wide cap before reaching its 500.
    a, b = served[1]
    assert a == pytest.approx(640, abs=REQUEST_TOKENS)
    assert a + b == 1000
    assert b < 500
