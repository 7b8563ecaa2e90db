"""Cost marks carried by the lease operations: no round trip of their own.

A local request's GPU time is measured on its deployment's processor-sharing clock
(:mod:`litellm_ratebalance.attribution.sharing`): a mark when it starts and one when it ends. Both change the
count of requests in flight at the same moment as the lease does, so they ride on the lease operations:
``lease_acquire(..., meter=MeterStart(...))`` marks the start in the same atomic step that takes the lease
(only when it is newly taken), ``lease_release(..., meter=MeterEnd(...))`` marks the end in the step that gives
it back, and charges the request its share. In Redis the mark is the shared Lua function of ``_sharing.lua``,
included in ``concurrency_acquire.lua`` and ``concurrency_release.lua``; here :class:`MemorySharing` is the
embedded store's copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from litellm_ratebalance.attribution.sharing import Efficiency, Mark, SharingClock, advance, decayed, gpu_share

__all__ = ["CostMark", "MemorySharing", "MeterEnd", "MeterStart"]


def positive_ms(value: int, what: str) -> int:
    """``value`` as an int; ValueError naming ``what`` unless it is at least 1 ms."""
    if value < 1:
        raise ValueError(f"{what} must be at least 1 ms (got {value})")
    return int(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Durations:
    half_life_ms: int
    """Half-life of the deployment's efficiency sums (> 0)."""
    ttl_ms: int
    """Time-to-live of the deployment's cost state; each mark pushes it out (> 0)."""

    def __post_init__(self) -> None:
        positive_ms(self.half_life_ms, "half-life")
        positive_ms(self.ttl_ms, "ttl")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeterStart(_Durations):
    """Mark the request's start with its lease."""

    def script_args(self) -> list[object]:
        """The seven mark arguments of ``_sharing.lua``."""
        return ["start", "", "", "", "", self.half_life_ms, self.ttl_ms]


@dataclass(frozen=True, slots=True)
class MeterEnd(_Durations):
    """Mark the request's end with its release and charge it its share (durations by keyword)."""

    start: Mark
    """The mark its lease acquire returned."""
    gpus: float
    """GPUs of the deployment: a busy second is this many GPU-seconds."""
    output_tokens: int
    """The response's output tokens (for the deployment's efficiency sums), >= 0."""

    def script_args(self) -> list[object]:
        """The seven mark arguments of ``_sharing.lua``."""
        return [
            "end",
            int(self.start.epoch_ms),
            repr(float(self.start.integral)),
            repr(float(self.gpus)),
            max(0, int(self.output_tokens)),
            self.half_life_ms,
            self.ttl_ms,
        ]


@dataclass(frozen=True, slots=True)
class CostMark:
    """What a mark returned."""

    mark: Mark
    """The integral after this mark, with its epoch (keep a start's to end the request)."""
    share: float | None
    """End marks: the request's GPU-seconds (``None`` when its start belongs to another epoch). Starts: ``None``."""
    now_ms: int

    @classmethod
    def from_script(cls, fields: Sequence[object], now_ms: int) -> CostMark:
        """Parse the mark's three fields of a script's reply: epoch, integral, share."""
        epoch, integral, share = (_text(value) for value in fields)
        return cls(Mark(int(epoch), float(integral)), float(share) if share else None, now_ms)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class _DeploymentCost:
    clock: SharingClock
    touched_ms: int
    efficiency_at_ms: int | None = None
    gpu_seconds: float = 0.0
    output_tokens: float = 0.0


@dataclass(slots=True)
class MemorySharing:
    """Every deployment's sharing clock and efficiency sums in process memory (the embedded store holds its
    lock around every call; the semantics are ``_sharing.lua``'s)."""

    _state: dict[str, _DeploymentCost] = field(default_factory=dict)

    def mark(self, deployment_id: str, now_ms: int, inflight: int, meter: MeterStart | MeterEnd) -> CostMark:
        """Advance ``deployment_id``'s clock to ``now_ms``, where ``inflight`` requests are in flight from now
        on; an end mark also charges its request and adds it to the efficiency sums."""
        state = self._advance(deployment_id, now_ms, inflight, meter.ttl_ms)
        mark = Mark(state.clock.epoch_ms, state.clock.integral)
        if isinstance(meter, MeterStart):
            return CostMark(mark, None, now_ms)
        share = gpu_share(meter.start, mark, meter.gpus)
        if share is not None:
            since = state.efficiency_at_ms if state.efficiency_at_ms is not None else now_ms
            elapsed = max(0, now_ms - since) / 1000.0
            half_life = meter.half_life_ms / 1000.0
            state.gpu_seconds = decayed(state.gpu_seconds, elapsed, half_life) + share
            state.output_tokens = decayed(state.output_tokens, elapsed, half_life) + max(0, meter.output_tokens)
            state.efficiency_at_ms = max(now_ms, since)
        return CostMark(mark, share, now_ms)

    def efficiency(self, deployment_id: str, now_ms: int, half_life_ms: int) -> Efficiency | None:
        """The efficiency sums decayed to ``now_ms``; ``None`` when no request has ended within the ttl."""
        half_life = positive_ms(half_life_ms, "half-life") / 1000.0
        state = self._state.get(deployment_id)
        if state is None or state.efficiency_at_ms is None:
            return None
        elapsed = max(0, now_ms - state.efficiency_at_ms) / 1000.0
        return Efficiency(
            decayed(state.gpu_seconds, elapsed, half_life), decayed(state.output_tokens, elapsed, half_life)
        )

    def _advance(self, deployment_id: str, now_ms: int, inflight: int, ttl_ms: int) -> _DeploymentCost:
        state = self._state.get(deployment_id)
        if state is not None and now_ms - state.touched_ms >= ttl_ms:
            state = None  # expired, as the Redis hash would have: a new epoch
        if state is None:
            state = self._state[deployment_id] = _DeploymentCost(advance(None, now_ms, inflight), now_ms)
        else:
            state.clock = advance(state.clock, now_ms, inflight)
            state.touched_ms = now_ms
        # Bounded memory: forget deployments idle past the ttl (Redis keys expire likewise).
        for stale in [d for d, s in self._state.items() if now_ms - s.touched_ms >= ttl_ms]:
            del self._state[stale]
        return state
