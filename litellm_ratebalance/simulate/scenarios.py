"""Seeded routing scenarios: a set of mock deployments with their true behaviour over time, plus a workload.

Every scenario is built for a run ``duration`` (seconds of arrivals) so the same shape can run short (a smoke
run) or long; timeline events sit at fixed fractions of it. A scenario's :meth:`Scenario.plan` is the exact
request sequence (arrival offsets, prompt sizes, output lengths, streaming or not) drawn from its seed, so
every routing strategy compared on it meets the same requests and the same deployment behaviour.

Every request's prompt carries the length of its answer (an ``[answer:N]`` tag the mock reads, the way a real
model's answer length follows from the prompt). How requests ask for it is mixed, as users send traffic:
``exact`` requests set ``max_tokens`` to the answer's length, ``uncapped`` ones set no ``max_tokens``, ``loose``
ones set a ``max_tokens`` far above the answer (1024-4096). A router never sees the answer's length ahead.

The scenarios of the routing benchmark:

- ``stable-heterogeneous``: four deployments with fixed, very different rates and ample capacity.
- ``drift``: the same four, whose rates swap (fastest <-> slowest, second <-> third) at 40 % of the run.
- ``contended``: the fastest deployment has only two slots at full speed (``share`` overload), the others
  plenty; piling onto the fastest makes it slower than the rest.
- ``flaky``: a fast deployment with 429 bursts and a token budget that runs out (``x-ratelimit-*`` headers),
  one that answers 5xx fast a quarter of the time, one that stalls completely for the middle third of the
  run (and occasionally otherwise), and one slow but reliable.
- ``mixed-slots``: four deployments whose speeds and parallel slots differ (3 to 32), answers and prompts of
  very mixed sizes.
- ``degrading``: one deployment slows down step by step over most of the run.
- ``fluctuating``: four deployments whose rates swing (a sine wave of +-50 %, seeded periods of half to all
  of the run, seeded phases) around close means, so which one is fastest changes a few times a run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from litellm_ratebalance.simulate.mock_openai import Behaviour, Change, DeploymentSpec, answer_tag

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
    """Uniform range of the answers' lengths (output tokens; ``max_tokens`` of ``exact`` requests)."""
    log_uniform_sizes: bool = False
    """Draw prompt sizes and answer lengths log-uniformly in their ranges (many small, a few very large)."""
    uncapped_fraction: float = 0.25
    """Share of requests sent without ``max_tokens`` (the mock decides the length: the prompt's tag)."""
    loose_fraction: float = 0.25
    """Share of requests whose ``max_tokens`` (1024-4096) is far above the answer; the rest are ``exact``."""
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
    max_tokens: int | None
    """What the request sends (None: no ``max_tokens``)."""
    stream: bool
    answer_tokens: int = 0
    """Length of the answer the mock writes for this prompt (0: ``max_tokens``, the old plans' meaning)."""

    @property
    def kind(self) -> str:
        """``exact`` (max_tokens = the answer), ``uncapped`` (no max_tokens) or ``loose`` (far above)."""
        if self.max_tokens is None:
            return "uncapped"
        return "exact" if self.max_tokens <= max(self.answer_tokens, 1) else "loose"

    @property
    def output_tokens(self) -> int:
        """Output tokens the mock will write (the answer, capped by ``max_tokens``)."""
        if self.answer_tokens <= 0:
            return self.max_tokens or 64
        return min(self.answer_tokens, self.max_tokens) if self.max_tokens else self.answer_tokens

    def messages(self) -> list[dict[str, str]]:
        """Chat messages the mock counts as exactly ``prompt_tokens`` tokens (4 characters per token), starting
        with the ``[answer:N]`` tag that tells the mock the answer's length."""
        words = "lorem ipsum dolor sit amet consectetur adipiscing elit "
        chars = self.prompt_tokens * 4
        head = answer_tag(self.answer_tokens) + " " if self.answer_tokens > 0 else ""
        body = words * (chars // len(words) + 1)
        text = (head + body)[:chars] if len(head) < chars else head
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
            prompt_tokens = _draw(rng, workload.prompt_tokens, workload.log_uniform_sizes)
            answer = _draw(rng, workload.max_tokens, workload.log_uniform_sizes)
            kind_draw = rng.random()
            loose = rng.choice((1024, 2048, 4096))
            max_tokens: int | None = answer
            if kind_draw < workload.uncapped_fraction:
                max_tokens = None
            elif kind_draw < workload.uncapped_fraction + workload.loose_fraction:
                max_tokens = max(loose, 8 * answer)
            requests.append(
                PlannedRequest(
                    index=len(requests),
                    at=at,
                    prompt_tokens=prompt_tokens,
                    max_tokens=max_tokens,
                    stream=rng.random() < workload.stream_fraction,
                    answer_tokens=answer,
                )
            )
            at += rng.expovariate(workload.arrival_rate)
        return requests

    def spec(self, name: str) -> DeploymentSpec:
        for spec in self.deployments:
            if spec.name == name:
                return spec
        raise KeyError(name)


def _draw(rng: random.Random, bounds: tuple[int, int], log_uniform: bool) -> int:
    """A whole number in ``bounds`` (inclusive), uniform or log-uniform."""
    low, high = bounds
    if not log_uniform or low <= 0 or low == high:
        return rng.randint(low, high)
    return max(low, min(high, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))))


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


def mixed_slots(duration: float = 9.0, seed: int = 1) -> Scenario:
    behaviours = {
        "a": Behaviour(token_rate=180.0, base_latency=0.10, capacity=3, jitter=0.15),
        "b": Behaviour(token_rate=120.0, base_latency=0.10, capacity=6, jitter=0.15),
        "c": Behaviour(token_rate=70.0, base_latency=0.15, capacity=16, jitter=0.15),
        "d": Behaviour(token_rate=45.0, base_latency=0.10, capacity=32, jitter=0.15),
    }
    workload = Workload(
        arrival_rate=9.0,
        duration=duration,
        prompt_tokens=(50, 6000),
        max_tokens=(8, 400),
        log_uniform_sizes=True,
        timeout=12.0,
    )
    return Scenario(
        name="mixed-slots",
        description=(
            "a/b/c/d 180/120/70/45 tok/s with 3/6/16/32 slots (shared beyond); prompts 50-6000 and answers 8-400 "
            "tokens, log-uniform; 9 req/s, timeout 12 s"
        ),
        deployments=_specs(seed, behaviours),
        workload=workload,
        seed=seed,
    )


def degrading(duration: float = 9.0, seed: int = 1) -> Scenario:
    start, end, steps = 0.15 * duration, 0.85 * duration, 28
    first, last = 160.0, 35.0
    timeline = tuple(
        Change(start + (end - start) * i / steps, {"token_rate": round(first + (last - first) * i / steps, 1)})
        for i in range(1, steps + 1)
    )
    behaviours = {
        "a": Behaviour(token_rate=first, base_latency=0.10, capacity=12, jitter=0.2),
        "b": Behaviour(token_rate=110.0, base_latency=0.10, capacity=12, jitter=0.2),
        "c": Behaviour(token_rate=80.0, base_latency=0.15, capacity=12, jitter=0.2),
        "d": Behaviour(token_rate=55.0, base_latency=0.10, capacity=12, jitter=0.2),
    }
    return Scenario(
        name="degrading",
        description=(
            f"a slows down in {steps} steps from {first:.0f} to {last:.0f} tok/s between t={start:.1f}s and "
            f"t={end:.1f}s, never failing; b/c/d steady at 110/80/55 tok/s; capacity 12 each; 10 req/s"
        ),
        deployments=_specs(seed, behaviours, {"a": timeline}),
        workload=Workload(arrival_rate=10.0, duration=duration),
        seed=seed,
        events=((start, "a starts slowing"), (end, "a at its slowest")),
    )


def fluctuating(duration: float = 9.0, seed: int = 1) -> Scenario:
    rng = random.Random(f"fluctuating/{seed}")
    means = {"a": 120.0, "b": 100.0, "c": 85.0, "d": 70.0}
    behaviours = {}
    for name, mean in means.items():
        behaviours[name] = Behaviour(
            token_rate=mean,
            base_latency=0.10,
            capacity=12,
            jitter=0.2,
            wave_amplitude=0.5,
            # each deployment its own period (half to all of the run: a minute or two of real time) and
            # phase: the fastest one changes a few times a run, at moments no deployment announces
            wave_period=round(duration * rng.uniform(0.5, 1.0), 3),
            wave_phase=round(rng.random(), 3),
        )
    return Scenario(
        name="fluctuating",
        description=(
            "a/b/c/d 120/100/85/70 tok/s on average, each swinging +-50 % on a sine wave of its own period "
            f"({', '.join(f'{b.wave_period:.1f}' for b in behaviours.values())} s, seeded phases); capacity 12 "
            "each, 20% jitter; 10 req/s"
        ),
        deployments=_specs(seed, behaviours),
        workload=Workload(arrival_rate=10.0, duration=duration),
        seed=seed,
    )


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "stable-heterogeneous": stable_heterogeneous,
    "drift": drift,
    "contended": contended,
    "flaky": flaky,
    "mixed-slots": mixed_slots,
    "degrading": degrading,
    "fluctuating": fluctuating,
}
"""Scenario builders by name; each takes ``duration`` and ``seed``."""


def build_scenario(name: str, *, duration: float = 9.0, seed: int = 1) -> Scenario:
    """The named scenario for a run of ``duration`` seconds of arrivals."""
    try:
        builder = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return builder(duration=duration, seed=seed)
