"""Pure load-shedding policy: utilisation from the signals, priority tiers, the admit/shed decision,
token-aware memory headroom, and the retry advice.

Nothing here reads a clock or does I/O; the adapter passes every count and measurement.

Definitions:

* **Signals** are fractions where 1.0 means "full": ``kv_cache`` and ``gpu_memory`` (memory pressure),
  ``gpu_compute`` and ``concurrency`` = in flight / limit (compute saturation), ``server_queue`` = requests
  waiting inside the inference server / its queue limit (queue overflow). **Utilisation** is the worst
  (largest) of them; its signal names the reason.
* **Tiers** are ordered lowest priority first. Tier ``i`` of ``n`` has the threshold
  ``shed + i * (hard - shed) / (n - 1)``: the lowest tier is shed at ``shed_threshold``, the next ones in
  turn, the highest at ``hard_threshold``. A single tier counts as the highest.
* **Decision** for a request of tier ``t`` (threshold ``θ``), in order:

  1. a server signal (memory, compute, server queue) at or above ``θ`` -> shed (503, that signal's reason);
  2. token-aware check, where a KV-cache capacity ``C`` is known: tokens held = the larger of the
     reservations in flight (prompt + the output reserved for each, see :mod:`.output`) and the measured
     KV-cache usage x ``C``; if held + this request's cost would exceed the tier's token cap -> shed (503
     ``memory_pressure``); a request whose cost alone exceeds it can never fit (advice ``reroute``). The
     token cap is ``θ x C``; below the highest tier, at most ``hard x C - headroom_tokens``: some typical
     requests' worth of the cache (one by default) always stays for the tiers above, as one slot does in 3.;
  3. concurrency: the highest tier may fill every slot of the limit; at the limit it gets 429
     ``concurrency_limit`` (or waits in the queue where one is enabled). A lower tier may take a slot while
     the concurrency signal, ``in flight / limit``, is below ``θ`` (judged before the admission, as the
     server signals in 1. are) and one slot at least stays free for the tiers above -> else shed (503
     ``compute_saturation``). With a top-tier reserve ``R`` (:mod:`.reserve`), a lower tier also leaves
     ``R`` less the top tier's requests already in flight free: ``in flight + 1 <= limit - max(0, R - top)``;
  4. a request of a higher tier is waiting for this deployment (``waiting_rank`` > ``t``) -> shed (503,
     ``memory_pressure`` when the tokens are the tighter resource, else ``compute_saturation``): what
     frees up goes to the waiting request, not to a lower tier arriving after it;
  5. admit.

  **Waiting** (:attr:`Verdict.queueable`): a refusal of the highest tier that draining can cure, a full
  limit (3.) or memory (1. on a memory signal, 2.) for a request that fits an idle deployment, may wait in
  the deployment's queue instead; lower tiers are shed, never queued.
* **Retry-after** comes from the drain rate, by Little's law: a deployment with ``N`` requests in flight
  and mean latency ``W`` completes ``N / W`` requests per second, so freeing ``k`` slots takes ``k / (N / W)``
  seconds. Each refusal says how many completions it waits for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "SIGNAL_REASONS",
    "DeploymentLoad",
    "Reason",
    "TierThresholds",
    "Tiers",
    "Utilisation",
    "Verdict",
    "advice",
    "decide",
    "retry_after_seconds",
    "store_refusal",
    "tier_slots",
    "tier_threshold",
    "worst_signal",
]


class Reason(str, Enum):
    """Why a request was refused (the ``reason`` clients see)."""

    MEMORY_PRESSURE = "memory_pressure"
    COMPUTE_SATURATION = "compute_saturation"
    QUEUE_OVERFLOW = "queue_overflow"
    CONCURRENCY_LIMIT = "concurrency_limit"


SIGNAL_REASONS: Mapping[str, Reason] = {
    "kv_cache": Reason.MEMORY_PRESSURE,
    "gpu_memory": Reason.MEMORY_PRESSURE,
    "gpu_compute": Reason.COMPUTE_SATURATION,
    "concurrency": Reason.COMPUTE_SATURATION,
    "server_queue": Reason.QUEUE_OVERFLOW,
}
"""Every signal name this package produces, and the reason it stands for."""


@dataclass(frozen=True, slots=True)
class Utilisation:
    value: float
    signal: str | None
    """Name of the worst signal (``None`` when there are none)."""

    @property
    def reason(self) -> Reason | None:
        return None if self.signal is None else SIGNAL_REASONS[self.signal]


def worst_signal(signals: Mapping[str, float]) -> Utilisation:
    """The largest signal (ties: the first in ``signals`` order); utilisation 0 when there are none."""
    best: Utilisation = Utilisation(0.0, None)
    for name, value in signals.items():
        if name not in SIGNAL_REASONS:
            raise ValueError(f"unknown signal {name!r}; known: {sorted(SIGNAL_REASONS)}")
        if math.isfinite(value) and (best.signal is None or value > best.value):
            best = Utilisation(max(0.0, value), name)
    return best


class Tiers:
    """Priority tiers, lowest first; resolves a priority name to its rank."""

    __slots__ = ("_names", "_rank", "fallback")

    def __init__(self, names: Sequence[str], default_name: str = "default") -> None:
        if not names:
            raise ValueError("need at least one tier")
        self._names = tuple(names)
        self._rank = {name: rank for rank, name in enumerate(self._names)}
        self.fallback = self._rank.get(default_name, 0)
        """Rank of callers without a configured priority: the ``default`` tier, else the lowest."""

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._rank

    def rank(self, priority: str | None) -> int:
        return self._rank.get(priority, self.fallback) if priority is not None else self.fallback

    def name(self, rank: int) -> str:
        return self._names[rank]

    def is_top(self, rank: int) -> bool:
        return rank == len(self._names) - 1


def tier_threshold(rank: int, n_tiers: int, shed_threshold: float, hard_threshold: float) -> float:
    """Utilisation at which tier ``rank`` (0 = lowest) is shed."""
    if n_tiers <= 1 or rank >= n_tiers - 1:
        return hard_threshold
    return shed_threshold + rank * (hard_threshold - shed_threshold) / (n_tiers - 1)


def tier_slots(rank: int, n_tiers: int, limit: int, shed_threshold: float, hard_threshold: float) -> int:
    """How many requests may be in flight, all tiers together, once a request of tier ``rank`` is admitted:
    the whole limit for the highest tier; below it ``ceil(threshold x limit)``, since such a request is
    admitted while ``in flight / limit < threshold``, but at most ``limit - 1`` (one slot always stays
    for the tiers above: a limit of 2 is not all the low tier's at 0.85).

    Judged before the admission, like the server signals: with a limit of 9 and a threshold of 0.85 the
    8th request (7 of 9 = 0.78 in flight) is admitted and the 9th (0.89) is not. (Judging the utilisation
    after it, ``(in flight + 1) / limit <= threshold``, would stop at 7: up to one slot fewer, which on a
    server whose limit sits near its knee keeps it below full speed whenever the top tier leaves a gap.)"""
    if n_tiers <= 1 or rank >= n_tiers - 1:
        return limit
    threshold = tier_threshold(rank, n_tiers, shed_threshold, hard_threshold)
    return max(0, min(limit - 1, math.ceil(threshold * limit - 1e-9)))


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of :func:`decide`."""

    admitted: bool
    reason: Reason | None = None
    status: int = 0
    """503 (shed) or 429 (concurrency limit); 0 when admitted."""
    utilisation: float = 0.0
    threshold: float = 1.0
    signal: str | None = None
    completions_needed: float = 0.0
    """Requests that must finish before this one would be admitted (for the retry-after estimate)."""
    never_fits: bool = False
    """True when the request would be refused even by an idle deployment (retrying cannot help)."""
    slots: int = 0
    """The tier's slot cap (see :func:`tier_slots`): the store's atomic check uses the same number."""
    token_cap: int | None = None
    """The tier's token cap (``θ x C``), or ``None`` without a KV-cache capacity."""
    lease_token_cap: int | None = None
    """The token cap the store's atomic check applies to the reservations: ``token_cap`` less what the
    measured KV-cache usage exceeds the reservations by, so the store refuses what the measurement refuses."""
    higher_waiting: bool = False
    """Refused because a request of a higher tier waits for this deployment (rule 4)."""
    queueable: bool = False
    """Refused, but waiting can cure it: the highest tier at the concurrency limit or short of memory (a
    request that fits an idle deployment). Shedding of the lower tiers is deliberate and never queued."""

    @property
    def count_based(self) -> bool:
        """A refusal on the shared in-flight counts (slots, reserved tokens) that the store's atomic check
        decides too: fresher counts (another replica's releases) can turn it into an admission."""
        if self.higher_waiting:
            return False
        return self.signal == "concurrency" or (self.signal == "kv_cache" and self.lease_token_cap is not None)


@dataclass(frozen=True, slots=True)
class TierThresholds:
    """The shedding thresholds of ``n_tiers`` priority tiers (see the module docstring): tier ``rank`` (0 =
    lowest) is shed at :meth:`threshold` and may fill :meth:`slots` of a limit."""

    n_tiers: int
    shed_threshold: float
    hard_threshold: float

    def is_top(self, rank: int) -> bool:
        return self.n_tiers <= 1 or rank >= self.n_tiers - 1

    def threshold(self, rank: int) -> float:
        return tier_threshold(rank, self.n_tiers, self.shed_threshold, self.hard_threshold)

    def slots(self, rank: int, limit: int) -> int:
        return tier_slots(rank, self.n_tiers, limit, self.shed_threshold, self.hard_threshold)


@dataclass(frozen=True, slots=True)
class DeploymentLoad:
    """One deployment as the policy sees it for one decision: what its server measures and what is in flight
    on it (all replicas), as the adapter last knew them."""

    server_signals: Mapping[str, float]
    """The measured signals other than ``concurrency`` (which is ``inflight / limit``)."""
    inflight: int
    limit: int
    reserved_tokens: int = 0
    """Tokens the requests in flight reserved (prompt + the output reserved for each)."""
    kv_cache_tokens: int | None = None
    """The KV-cache capacity ``C``; ``None``: unknown, the token-aware check is off."""
    waiting_rank: int | None = None
    """The highest tier of the requests waiting in this deployment's queue (``None``: none)."""
    headroom_tokens: int = 0
    """The KV-cache tokens a tier below the highest leaves for the tiers above (the tokens of a typical
    request times ``kv_headroom_requests``), so a top-tier request finds room without waiting for a lower one
    to end."""
    top_reserve: int = 0
    """Slots a tier below the highest leaves for the highest tier's own arrivals
    (:func:`~litellm_ratebalance.overload.reserve.reserve_slots`)."""
    top_inflight: int = 0
    """The highest tier's requests in flight, which count towards that reserve."""


def decide(thresholds: TierThresholds, rank: int, cost_tokens: int, load: DeploymentLoad) -> Verdict:
    """Decide one request of tier ``rank`` that reserves ``cost_tokens`` against one deployment's ``load``
    (rules 1. to 5. of the module docstring, in order)."""
    top = thresholds.is_top(rank)
    threshold = thresholds.threshold(rank)
    slots = thresholds.slots(rank, load.limit)
    if not top and load.top_reserve > 0:
        slots = max(0, min(slots, load.limit - max(0, load.top_reserve - max(0, load.top_inflight))))
    kv = load.kv_cache_tokens
    token_cap = None if kv is None else math.floor(threshold * kv)
    if token_cap is not None and kv is not None and not top and load.headroom_tokens > 0:
        token_cap = max(0, min(token_cap, math.floor(thresholds.hard_threshold * kv) - load.headroom_tokens))
    signals = dict(load.server_signals)
    signals["concurrency"] = load.inflight / load.limit if load.limit > 0 else 1.0
    overall = worst_signal(signals)
    measured = signals.get("kv_cache", 0.0) * kv if kv else 0.0
    lease_token_cap = (
        None if token_cap is None else max(0, token_cap - math.ceil(max(0.0, measured - load.reserved_tokens)))
    )
    admit = Verdict(
        True,
        utilisation=overall.value,
        threshold=threshold,
        signal=overall.signal,
        slots=slots,
        token_cap=token_cap,
        lease_token_cap=lease_token_cap,
    )
    return (
        _server_refusal(admit, load, top)
        or _token_refusal(admit, load, top, cost_tokens, measured)
        or _slot_refusal(admit, load, top)
        or _waiting_refusal(admit, load, rank, measured, signals["concurrency"])
        or admit
    )


def _server_refusal(admit: Verdict, load: DeploymentLoad, top: bool) -> Verdict | None:
    """Rule 1: a server signal at or above the tier's threshold."""
    server = worst_signal(load.server_signals)
    threshold = admit.threshold
    if server.signal is None or server.value < threshold:
        return None
    # Enough of the in-flight work must finish for the signal to fall back under the threshold.
    needed = load.inflight * (server.value - threshold) / server.value + 1 if server.value > 0 else 1.0
    drains = server.reason is Reason.MEMORY_PRESSURE and load.inflight > 0
    return replace(
        admit,
        admitted=False,
        reason=server.reason,
        status=503,
        signal=server.signal,
        completions_needed=needed,
        queueable=top and drains,
    )


def _token_refusal(
    admit: Verdict, load: DeploymentLoad, top: bool, cost_tokens: int, measured: float
) -> Verdict | None:
    """Rule 2: the tokens held (reserved, or measured when more) and this request's exceed the token cap."""
    token_cap, kv = admit.token_cap, load.kv_cache_tokens
    if token_cap is None or kv is None:
        return None
    held = max(float(load.reserved_tokens), measured)
    if held + cost_tokens <= token_cap:
        return None
    per_request = held / load.inflight if load.inflight > 0 else float(cost_tokens)
    needed = (held + cost_tokens - token_cap) / per_request if per_request > 0 else 1.0
    return replace(
        admit,
        admitted=False,
        reason=Reason.MEMORY_PRESSURE,
        status=503,
        utilisation=max(admit.utilisation, (held + cost_tokens) / kv),
        signal="kv_cache",
        completions_needed=max(1.0, needed),
        never_fits=cost_tokens > token_cap,
        queueable=top and cost_tokens <= token_cap,
    )


def _slot_refusal(admit: Verdict, load: DeploymentLoad, top: bool) -> Verdict | None:
    """Rule 3: no slot of the tier's share of the limit is free."""
    if load.inflight + 1 <= admit.slots:
        return None
    return _no_slot(admit, top, float(load.inflight + 1 - admit.slots))


def _no_slot(verdict: Verdict, top: bool, completions_needed: float) -> Verdict:
    """``verdict`` turned into a refusal for want of a slot: 429 ``concurrency_limit`` for the highest tier
    (which may wait for one), 503 ``compute_saturation`` below it."""
    return replace(
        verdict,
        admitted=False,
        reason=Reason.CONCURRENCY_LIMIT if top else Reason.COMPUTE_SATURATION,
        status=429 if top else 503,
        signal="concurrency",
        completions_needed=completions_needed,
        queueable=top,
    )


def _waiting_refusal(
    admit: Verdict, load: DeploymentLoad, rank: int, measured: float, concurrency: float
) -> Verdict | None:
    """Rule 4: a request of a higher tier waits for this deployment."""
    if load.waiting_rank is None or load.waiting_rank <= rank:
        return None
    # Capacity that frees up belongs to the request waiting above this one: name the tighter resource.
    kv = load.kv_cache_tokens
    memory = max(float(load.reserved_tokens), measured) / kv if kv else 0.0
    tokens_tighter = memory > concurrency
    return replace(
        admit,
        admitted=False,
        reason=Reason.MEMORY_PRESSURE if tokens_tighter else Reason.COMPUTE_SATURATION,
        status=503,
        signal="kv_cache" if tokens_tighter else "concurrency",
        completions_needed=1.0,
        higher_waiting=True,
    )


def store_refusal(fresh: Verdict, tokens: bool, top: bool) -> Verdict:
    """The verdict for a lease the shared store refused although ``fresh`` (this process's view, just
    updated with the store's counts) admits it: another replica's requests hold what the store counted.
    ``tokens``: the store refused on the token cap (else on the slot cap); ``top``: the highest tier."""
    if tokens:
        return replace(
            fresh,
            admitted=False,
            reason=Reason.MEMORY_PRESSURE,
            status=503,
            signal="kv_cache",
            completions_needed=1.0,
            queueable=top,
        )
    return _no_slot(fresh, top, 1.0)


def retry_after_seconds(
    completions_needed: float, inflight: int, mean_latency_seconds: float | None, *, floor: int = 1, cap: int = 30
) -> int:
    """Whole seconds until ``completions_needed`` requests finish at the drain rate (Little's law:
    ``inflight / mean_latency`` completions per second), within ``[floor, cap]``.

    Without a drain-rate estimate (nothing in flight, no latency measured yet) the answer is ``floor``.
    """
    if inflight <= 0 or not mean_latency_seconds or mean_latency_seconds <= 0:
        return floor
    drain_rate = inflight / mean_latency_seconds
    return int(max(floor, min(cap, math.ceil(max(0.0, completions_needed) / drain_rate))))


def advice(verdict: Verdict, retry_after: int, max_retry_after: int) -> str:
    """``retry`` when capacity should free within ``retry_after``; ``reroute`` when this deployment cannot
    take the request even when idle, or the estimated wait is beyond what we would ask a client to wait."""
    if verdict.never_fits or retry_after >= max_retry_after:
        return "reroute"
    return "retry"
