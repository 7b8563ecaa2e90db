"""Seeded routing scenarios: a set of mock deployments with their true behaviour over time, plus a workload.

Every scenario is built for a run ``duration`` (seconds of arrivals) so the same shape can run short (a smoke
run) or long; timeline events sit at fixed fractions of it. A scenario's :meth:`Scenario.plan` is the exact
request sequence (arrival offsets, prompt sizes, output lengths, streaming or not) drawn from its seed, so
every routing strategy compared on it meets the same requests and the same deployment behaviour.

The four scenarios of the routing benchmark:

- ``stable-heterogeneous``: four deployments with fixed, very different rates and ample capacity.
- ``drift``: the same four, whose rates swap (fastest <-> slowest, second <-> third) at 40 % of the run.
- ``contended``: the fastest deployment has only two slots at full speed (``share`` overload), the others
  plenty; piling onto the fastest makes it slower than the rest.
- ``flaky``: a fast deployment with 429 bursts and a token budget that runs out (``x-ratelimit-*`` headers),
  one that answers 5xx fast a quarter of the time, one that stalls completely for the middle third of the
  run (and occasionally otherwise), and one slow but reliable.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from litellm_ratebalance.simulate.mock_openai import Behaviour, Change, DeploymentSpec

__all__ = ["SCENARIOS", "PlannedRequest", "Scenario", "Workload", "build_scenario"]


@dataclass(frozen=True)
class Workload:
    """Open-loop Poisson arrivals (the offered load does not depend on how fast answers come back)."""

    arrival_rate: float
    """Requests per second."""
    duration: float
    """Seconds during which requests arrive."""
    prompt_tokens: tuple[int, int] = (100, 1500)
    """Uniform range of prompt sizes (tokens, as the mock counts them)."""
    max_tokens: tuple[int, int] = (24, 96)
    """Uniform range of ``max_tokens`` (the mock always generates exactly that many)."""
    stream_fraction: float = 0.25
    """Share of requests sent with ``stream=True``."""
    timeout: float = 5.0
    """Per-request timeout (seconds) given to the router / client."""


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a scenario's plan."""

    index: int
    at: float
    """Seconds after the run's epoch at which it is sent."""
    prompt_tokens: int
    max_tokens: int
    stream: bool

    def messages(self) -> list[dict[str, str]]:
        """Chat messages the mock counts as exactly ``prompt_tokens`` tokens (4 characters per token)."""
        words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
        chars = self.prompt_tokens * 4
        text = (words * (chars // len(words) + 1))[:chars]
        return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class Scenario:
    """Deployments (with their timelines) and the workload of one benchmark scenario."""

    name: str
    description: str
    deployments: tuple[DeploymentSpec, ...]
    workload: Workload
    seed: int
    events: tuple[tuple[float, str], ...] = ()
    """(time, label) of the notable timeline moments, for plots and reports."""

    def plan(self) -> list[PlannedRequest]:
        """The request sequence, a pure function of the workload and the seed."""
        rng = random.Random(f"plan/{self.name}/{self.seed}")
        workload = self.workload
        requests: list[PlannedRequest] = []
        at = rng.expovariate(workload.arrival_rate)
        while at < workload.duration:
            requests.append(
                PlannedRequest(
                    index=len(requests),
                    at=at,
                    prompt_tokens=rng.randint(*workload.prompt_tokens),
                    max_tokens=rng.randint(*workload.max_tokens),
                    stream=rng.random() < workload.stream_fraction,
                )
            )
            at += rng.expovariate(workload.arrival_rate)
        return requests

    def spec(self, name: str) -> DeploymentSpec:
        for spec in self.deployments:
            if spec.name == name:
                return spec
        raise KeyError(name)


def _specs(
    seed: int, behaviours: dict[str, Behaviour], timelines: Mapping[str, tuple[Change, ...]] | None = None
) -> tuple[DeploymentSpec, ...]:
    timelines = timelines or {}
    return tuple(DeploymentSpec(name, b, timelines.get(name, ()), seed) for name, b in behaviours.items())


# Four deployments whose one-request speeds differ ~5x: the spread that makes routing matter.
_HETEROGENEOUS = {
    "a": Behaviour(token_rate=150.0, base_latency=0.15, capacity=12, jitter=0.2),
    "b": Behaviour(token_rate=90.0, base_latency=0.10, capacity=12, jitter=0.2),
    "c": Behaviour(token_rate=60.0, base_latency=0.20, capacity=12, jitter=0.2),
    "d": Behaviour(token_rate=30.0, base_latency=0.10, capacity=12, jitter=0.2),
}


def stable_heterogeneous(duration: float = 9.0, seed: int = 1) -> Scenario:
    return Scenario(
        name="stable-heterogeneous",
        description="4 deployments at 150/90/60/30 tok/s, capacity 12 each, 20% jitter; 10 req/s",
        deployments=_specs(seed, dict(_HETEROGENEOUS)),
        workload=Workload(arrival_rate=10.0, duration=duration),
        seed=seed,
    )


def drift(duration: float = 9.0, seed: int = 1) -> Scenario:
    swap_at = 0.4 * duration
    rates = {name: b.token_rate for name, b in _HETEROGENEOUS.items()}
    swapped = {"a": rates["d"], "b": rates["c"], "c": rates["b"], "d": rates["a"]}
    timelines = {name: (Change(swap_at, {"token_rate": rate}),) for name, rate in swapped.items()}
    return Scenario(
        name="drift",
        description=(
            f"stable-heterogeneous, then at t={swap_at:.1f}s the rates swap (a 150->30, b 90->60, c 60->90, d 30->150)"
        ),
        deployments=_specs(seed, dict(_HETEROGENEOUS), timelines),
        workload=Workload(arrival_rate=10.0, duration=duration),
        seed=seed,
        events=((swap_at, "rates swap"),),
    )


def contended(duration: float = 9.0, seed: int = 1) -> Scenario:
    behaviours = {
        "a": Behaviour(token_rate=220.0, base_latency=0.10, capacity=2, jitter=0.15),
        "b": Behaviour(token_rate=100.0, base_latency=0.10, capacity=8, jitter=0.15),
        "c": Behaviour(token_rate=80.0, base_latency=0.15, capacity=8, jitter=0.15),
        "d": Behaviour(token_rate=60.0, base_latency=0.10, capacity=8, jitter=0.15),
    }
    return Scenario(
        name="contended",
        description="a 220 tok/s but only 2 slots (shared beyond), b/c/d 100/80/60 tok/s with 8 slots; 14 req/s",
        deployments=_specs(seed, behaviours),
        workload=Workload(arrival_rate=14.0, duration=duration),
        seed=seed,
    )


def flaky(duration: float = 9.0, seed: int = 1) -> Scenario:
    rng = random.Random(f"flaky/{seed}")
    workload = Workload(arrival_rate=10.0, duration=duration, timeout=4.0)
    # a: 429 bursts (each ~8% of the run, at seeded places in each third) and a token budget over a window of a
    # third of the run sized for about half the offered tokens, so sending everything there runs it dry.
    window = duration / 3
    mean_tokens = sum(workload.prompt_tokens) / 2 + sum(workload.max_tokens) / 2
    budget = int(0.5 * workload.arrival_rate * window * mean_tokens)
    burst = 0.08 * duration
    a_timeline: list[Change] = []
    events: list[tuple[float, str]] = []
    for third in range(3):
        start = (third + rng.uniform(0.1, 0.7)) * window
        a_timeline += [Change(start, {"rate_limited": True}), Change(start + burst, {"rate_limited": False})]
        events.append((start, "a: 429 burst"))
    stall_from, stall_to = duration / 3, 2 * duration / 3
    events += [(stall_from, "c stalls"), (stall_to, "c recovers")]
    behaviours = {
        "a": Behaviour(
            token_rate=160.0,
            base_latency=0.10,
            capacity=12,
            jitter=0.2,
            tpm=budget,
            limit_window=window,
            retry_after=math.ceil(burst),
        ),
        "b": Behaviour(token_rate=120.0, base_latency=0.10, capacity=12, jitter=0.2, error_rate=0.25),
        "c": Behaviour(token_rate=140.0, base_latency=0.10, capacity=12, jitter=0.2, stall_rate=0.03),
        "d": Behaviour(token_rate=70.0, base_latency=0.15, capacity=12, jitter=0.2),
    }
    timelines = {
        "a": tuple(a_timeline),
        "c": (Change(stall_from, {"stall_rate": 1.0}), Change(stall_to, {"stall_rate": 0.03})),
    }
    return Scenario(
        name="flaky",
        description=(
            f"a 160 tok/s with three 429 bursts and a {budget}-token budget per {window:.1f}s; b 120 tok/s, 25% fast "
            f"5xx; c 140 tok/s, stalls t={stall_from:.1f}-{stall_to:.1f}s (3% otherwise); d 70 tok/s reliable; "
            f"timeout {workload.timeout:.0f}s"
        ),
        deployments=_specs(seed, behaviours, timelines),
        workload=workload,
        seed=seed,
        events=tuple(sorted(events)),
    )


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "stable-heterogeneous": stable_heterogeneous,
    "drift": drift,
    "contended": contended,
    "flaky": flaky,
}
"""Scenario builders by name; each takes ``duration`` and ``seed``."""


def build_scenario(name: str, *, duration: float = 9.0, seed: int = 1) -> Scenario:
    """The named scenario for a run of ``duration`` seconds of arrivals."""
    try:
        builder = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return builder(duration=duration, seed=seed)
