"""Pure admission policy: priorities, reservations, saturation, the admit/reject decision, 429 texts.

Nothing here does I/O or reads a clock: callers pass counts, limits and times. The Redis script
``store/lua/admission_acquire.lua`` implements :func:`decide` step for step; the embedded store calls
:func:`decide` itself, and the shared behavioural test suite checks that both agree.

Definitions (LiteLLM ``dynamic_rate_limiter_v3`` meaning, with our additions marked *):

* A **pool** is a configured priority (``priority_reservation`` key) or the shared default pool that every
  request without a configured priority uses. Pools are the only counters: an unknown priority string
  never creates one.
* **weight** of a pool: its reservation as a fraction of model capacity (``{type: rpm|tpm}`` values are
  divided by the model's rpm/tpm); configured weights summing past 1 are scaled to sum to 1. The default
  pool's weight is ``default_priority`` and is not scaled.
* **saturation** = max(requests / model rpm, tokens / model tpm) over the live window counters,
  reservations of requests in flight included, *before* the request being decided.
* **lenient** (saturation < threshold): only the model-wide caps apply. **strict** (>=): the request's
  pool is also capped at weight x capacity. *With no ``priority_reservation`` at all there are no shares
  to enforce and only the model-wide caps apply.*
* *floors*: a pool with ``lendable`` < 1 keeps ``(1 - lendable) x weight x capacity`` of each window for
  itself: requests of other pools are admitted only while that unused part stays free, in both modes.
* *oversize rule*: a request is never asked to fit more room than the limit it is checked against. A
  request whose token estimate exceeds a limit is admitted when that whole limit is still unused, and then
  uses it up: at most one such request per window and limit, never rejected forever.
* *headroom*: tokens of the tpm kept free of new reservations for what the requests in flight will use
  past theirs (learned by the ledger). It comes out of what pools may borrow, never out of a pool's own
  share: a request that keeps its pool within ``pool_tpm`` (:func:`within_share`) is checked against the
  tpm alone, any other request (and every request when no ``priority_reservation`` is configured) against
  the tpm less the headroom.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import IntEnum

__all__ = [
    "DEFAULT_POOL",
    "AdmissionLimits",
    "Decision",
    "Floor",
    "RejectReason",
    "ReservationValue",
    "WindowCounters",
    "build_limits",
    "decide",
    "effective_remaining",
    "fits",
    "headroom_taken",
    "pool_field",
    "protected_room",
    "rate_limit_headers",
    "rejection_message",
    "reset_seconds",
    "saturation",
    "scale_limits",
    "within_share",
]

DEFAULT_POOL = "d"
"""Field name of the shared default pool; configured priorities are ``p.<escaped name>``."""


def pool_field(priority: str | None, escaped: str | None = None) -> str:
    """Return the counter field of a pool: ``"d"`` for the default pool, else ``"p." + escaped name``."""
    if priority is None:
        return DEFAULT_POOL
    return "p." + (escaped if escaped is not None else priority)


class RejectReason(IntEnum):
    """Why a request was refused; the integer is what the Lua script returns."""

    NONE = 0
    MODEL_REQUESTS = 1
    MODEL_TOKENS = 2
    POOL_REQUESTS = 3
    POOL_TOKENS = 4

    @property
    def is_model_wide(self) -> bool:
        return self in (RejectReason.MODEL_REQUESTS, RejectReason.MODEL_TOKENS)

    @property
    def limit_type(self) -> str:
        """``requests`` or ``tokens``, the word LiteLLM's messages use."""
        return "requests" if self in (RejectReason.MODEL_REQUESTS, RejectReason.POOL_REQUESTS) else "tokens"


@dataclass(frozen=True, slots=True)
class Floor:
    """The non-lendable part of another pool's reservation, per window."""

    pool: str
    requests: float
    tokens: float


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Everything the decision needs about limits for one (model group, pool). ``None`` = no limit."""

    rpm: int | None
    tpm: int | None
    saturation_threshold: float
    pool: str
    pool_rpm: float | None
    pool_tpm: float | None
    floors: tuple[Floor, ...] = ()


@dataclass(frozen=True, slots=True)
class WindowCounters:
    """Live counts of the current window (reservations in flight included)."""

    requests: int = 0
    tokens: int = 0
    pool_requests: int = 0
    pool_tokens: int = 0
    other_pools: Mapping[str, tuple[int, int]] | None = None
    """(requests, tokens) of the pools named in ``AdmissionLimits.floors``."""


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    reason: RejectReason
    saturation: float
    strict: bool


def saturation(requests: float, tokens: float, rpm: float | None, tpm: float | None) -> float:
    """max(requests / rpm, tokens / tpm); 0 when neither limit is configured."""
    value = 0.0
    if rpm:
        value = max(value, requests / rpm)
    if tpm:
        value = max(value, tokens / tpm)
    return value


def fits(used: float, need: float, limit: float) -> bool:
    """True if ``need`` more fits under ``limit`` given ``used``, with the oversize rule (module doc)."""
    if limit <= 0:
        return False
    return used + min(need, limit) <= limit


def protected_room(limits: AdmissionLimits, counters: WindowCounters) -> tuple[float, float]:
    """(requests, tokens) other pools' floors still hold back from this request."""
    if not limits.floors:
        return 0.0, 0.0
    others = counters.other_pools or {}
    held_requests = held_tokens = 0.0
    for floor in limits.floors:
        used_requests, used_tokens = others.get(floor.pool, (0, 0))
        held_requests += max(0.0, floor.requests - used_requests)
        held_tokens += max(0.0, floor.tokens - used_tokens)
    return held_requests, held_tokens


def within_share(counters: WindowCounters, limits: AdmissionLimits, cost_tokens: int) -> bool:
    """True when ``cost_tokens`` more keeps the request's pool within its share of the tpm (``pool_tpm``,
    oversize rule included): the request takes its own reservation, not borrowed room. Never true when no
    share is configured."""
    return limits.pool_tpm is not None and fits(counters.pool_tokens, cost_tokens, limits.pool_tpm)


def decide(counters: WindowCounters, limits: AdmissionLimits, cost_tokens: int, headroom: float = 0.0) -> Decision:
    """Admit or refuse one request that reserves one request and ``cost_tokens`` tokens.

    ``headroom``: tokens of the model's tpm kept free of new reservations for what the requests in flight
    will use past theirs (learned, see :mod:`litellm_ratebalance.admission.ledger`). A request within its
    pool's share is not asked to leave it free (module doc): a pool's reservation is never cut by it."""
    sat = saturation(counters.requests, counters.tokens, limits.rpm, limits.tpm)
    strict = sat >= limits.saturation_threshold
    held_requests, held_tokens = protected_room(limits, counters)
    reason = RejectReason.NONE
    if limits.rpm is not None and not fits(counters.requests, 1, limits.rpm - held_requests):
        reason = RejectReason.MODEL_REQUESTS
    elif limits.tpm is not None and not fits(
        counters.tokens, cost_tokens, limits.tpm - held_tokens - _kept(counters, limits, cost_tokens, headroom)
    ):
        reason = RejectReason.MODEL_TOKENS
    elif strict and limits.pool_rpm is not None and not fits(counters.pool_requests, 1, limits.pool_rpm):
        reason = RejectReason.POOL_REQUESTS
    elif strict and limits.pool_tpm is not None and not fits(counters.pool_tokens, cost_tokens, limits.pool_tpm):
        reason = RejectReason.POOL_TOKENS
    return Decision(reason is RejectReason.NONE, reason, sat, strict)


def _kept(counters: WindowCounters, limits: AdmissionLimits, cost_tokens: int, headroom: float) -> float:
    """The part of ``headroom`` this request must leave free: all of it when borrowing, none within its share."""
    if headroom <= 0 or within_share(counters, limits, cost_tokens):
        return 0.0
    return headroom


def headroom_taken(
    counters: WindowCounters, limits: AdmissionLimits, cost_tokens: int, headroom: float, tokens_after: int
) -> float:
    """How much of ``headroom`` an admitted request took (0..headroom): the part of its reservation past
    what borrowing may reach (``tpm - floors - headroom``), when it was within its share. ``counters`` are
    the counts it was decided on, ``tokens_after`` the model's tokens once it is reserved. The ledger keeps
    the largest per window, so that learning the headroom knows what the window admitted against."""
    if limits.tpm is None or _kept(counters, limits, cost_tokens, headroom) > 0 or headroom <= 0:
        return 0.0
    _, held_tokens = protected_room(limits, counters)
    return min(headroom, max(0.0, tokens_after - (limits.tpm - held_tokens - headroom)))


def effective_remaining(
    counters: WindowCounters, limits: AdmissionLimits, strict: bool
) -> tuple[int | None, int | None]:
    """(requests, tokens) this pool could still be admitted in the window; ``None`` = unlimited."""
    held_requests, held_tokens = protected_room(limits, counters)
    requests: float | None = None
    tokens: float | None = None
    if limits.rpm is not None:
        requests = limits.rpm - held_requests - counters.requests
    if limits.tpm is not None:
        tokens = limits.tpm - held_tokens - counters.tokens
    if strict:
        if limits.pool_rpm is not None:
            pool_requests = limits.pool_rpm - counters.pool_requests
            requests = pool_requests if requests is None else min(requests, pool_requests)
        if limits.pool_tpm is not None:
            pool_tokens = limits.pool_tpm - counters.pool_tokens
            tokens = pool_tokens if tokens is None else min(tokens, pool_tokens)
    return (
        None if requests is None else max(0, math.floor(requests)),
        None if tokens is None else max(0, math.floor(tokens)),
    )


# -- building limits from configuration --------------------------------------------------------------

ReservationValue = float | Mapping[str, object]


def _weight(value: ReservationValue, rpm: int | None, tpm: int | None) -> float:
    """A reservation as a fraction of capacity (LiteLLM's conversion; unknown capacity gives 0)."""
    if isinstance(value, int | float):
        return float(value)
    kind = str(value.get("type", "percent"))
    amount = float(value.get("value", 1.0))  # type: ignore[arg-type]
    if kind == "percent":
        return amount
    if kind == "rpm":
        return amount / rpm if rpm else 0.0
    if kind == "tpm":
        return amount / tpm if tpm else 0.0
    raise ValueError(f"reservation type must be percent, rpm or tpm, got {kind!r}")


def normalised_weights(
    reservations: Mapping[str, ReservationValue], rpm: int | None, tpm: int | None
) -> dict[str, float]:
    """Configured priorities' weights, scaled to sum to 1 when they sum past 1."""
    weights = {name: max(0.0, _weight(value, rpm, tpm)) for name, value in reservations.items()}
    total = sum(weights.values())
    if total > 1.0:
        return {name: weight / total for name, weight in weights.items()}
    return weights


def build_limits(
    *,
    rpm: int | None,
    tpm: int | None,
    priority: str | None,
    reservations: Mapping[str, ReservationValue],
    default_priority: float,
    saturation_threshold: float,
    lendable: Mapping[str, float],
    field_of: Mapping[str, str],
) -> AdmissionLimits:
    """Limits for one request of ``priority`` (a configured priority name, or ``None`` = default pool).

    ``field_of`` maps each configured priority to its escaped counter field name.
    """
    weights = normalised_weights(reservations, rpm, tpm)
    if priority is not None and priority in weights:
        weight = weights[priority]
        pool = field_of[priority]
    else:
        priority = None
        weight = default_priority
        pool = DEFAULT_POOL
    floors = tuple(
        Floor(
            pool=field_of[name],
            requests=(1.0 - lendable[name]) * weights[name] * (rpm or 0),
            tokens=(1.0 - lendable[name]) * weights[name] * (tpm or 0),
        )
        for name in weights
        if name != priority and lendable.get(name, 1.0) < 1.0 and weights[name] > 0
    )
    # With no priority configured there is nothing to divide: only the model-wide caps apply (a lone
    # key may use the whole model), rather than capping all traffic at default_priority once saturated.
    divided = bool(weights)
    return AdmissionLimits(
        rpm=rpm,
        tpm=tpm,
        saturation_threshold=saturation_threshold,
        pool=pool,
        pool_rpm=weight * rpm if divided and rpm is not None else None,
        pool_tpm=weight * tpm if divided and tpm is not None else None,
        floors=floors,
    )


# -- messages -----------------------------------------------------------------------------------------


def scale_limits(limits: AdmissionLimits, share: float) -> AdmissionLimits:
    """``limits`` with every limit, pool share and floor multiplied by ``share`` (0 < share <= 1), model
    limits rounded up and at least 1: one replica's part of the limits when it decides alone."""
    if share >= 1.0:
        return limits

    def whole(limit: int | None) -> int | None:
        return None if limit is None else max(1, math.ceil(limit * share))

    def part(limit: float | None) -> float | None:
        return None if limit is None else limit * share

    return replace(
        limits,
        rpm=whole(limits.rpm),
        tpm=whole(limits.tpm),
        pool_rpm=part(limits.pool_rpm),
        pool_tpm=part(limits.pool_tpm),
        floors=tuple(Floor(f.pool, f.requests * share, f.tokens * share) for f in limits.floors),
    )


def _fmt(limit: int | None) -> str:
    return "not configured" if limit is None else str(limit)


def rejection_message(
    *,
    model: str,
    priority: str | None,
    reason: RejectReason,
    rpm: int | None,
    tpm: int | None,
    remaining: int | None,
    saturation_value: float,
) -> str:
    """The 429 text, in the structure of LiteLLM's two v3 limiter messages."""
    common = (
        f"Priority: {priority}, Rate limit type: {reason.limit_type}, "
        f"Model TPM: {_fmt(tpm)}, Model RPM: {_fmt(rpm)}, Remaining: {remaining if remaining is not None else 0}"
    )
    if reason.is_model_wide:
        return f"Model capacity reached for {model}. {common}"
    return (
        f"Priority-based rate limit exceeded. Model: {model}, {common}, Model saturation: {saturation_value * 100:.1f}%"
    )


def reset_seconds(now_ms: int, window_end_ms: int) -> int:
    """Whole seconds until the window ends (and its capacity frees), at least 1."""
    return max(1, math.ceil((window_end_ms - now_ms) / 1000))


def rate_limit_headers(
    *,
    limits: AdmissionLimits,
    counters: WindowCounters,
    strict: bool,
    saturation_value: float,
    priority_label: str,
    now_ms: int,
    window_end_ms: int,
) -> dict[str, str]:
    """OpenAI-style ``x-ratelimit-*`` headers from this pool's point of view, plus ``x-litellm-*``.

    ``limit`` is what applies to the pool now (its share in strict mode, the model cap otherwise);
    ``remaining`` is what it could still be admitted (floors of other pools held back).
    """
    remaining_requests, remaining_tokens = effective_remaining(counters, limits, strict)
    reset = f"{reset_seconds(now_ms, window_end_ms)}s"
    headers = {"x-litellm-priority": priority_label, "x-litellm-saturation": f"{saturation_value:.3f}"}
    limit_requests = limits.pool_rpm if strict and limits.pool_rpm is not None else limits.rpm
    limit_tokens = limits.pool_tpm if strict and limits.pool_tpm is not None else limits.tpm
    if limit_requests is not None and remaining_requests is not None:
        headers["x-ratelimit-limit-requests"] = str(math.floor(limit_requests))
        headers["x-ratelimit-remaining-requests"] = str(remaining_requests)
        headers["x-ratelimit-reset-requests"] = reset
    if limit_tokens is not None and remaining_tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(math.floor(limit_tokens))
        headers["x-ratelimit-remaining-tokens"] = str(remaining_tokens)
        headers["x-ratelimit-reset-tokens"] = reset
    return headers
