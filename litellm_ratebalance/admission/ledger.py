"""The admission ledger: windows, settles carried across windows, and the learned estimate, in memory.

Nothing here does I/O or reads a clock: callers pass ``now_ms``. The embedded store runs this ledger under
a lock; the Redis script ``store/lua/admission_acquire.lua`` implements the same steps on Redis hashes, and
the shared behavioural suite runs against both.

One call, :meth:`AdmissionLedger.acquire`, does in order:

1. **Apply settles** sent with it (a :class:`~litellm_ratebalance.admission.estimate.SettleBatch`), per
   window they were reserved in:

   * the current window: its counters move by the delta (never below zero);
   * the window just before it: the delta moves that window's final tokens, and the current window's
     *carry* (below) is recomputed from them;
   * an older window: a positive delta is added to the current window's tokens (the answer was served and
     must be paid for); a negative one is dropped (the room it would free is gone with its window);
   * no window at all (nothing for longer than the keys live): dropped.

   Samples are added to the model group's histogram and the estimate recomputed.
2. **Roll over** (only when a request is decided): when no window is live, the next starts now. If the
   ended window is the one just before (``now < start + 2 x window``) and the model has a tpm, tokens it
   used past its tpm are the **carry**: the new window starts with them already used. So an answer longer
   than its reservation delays others by what it overshot, and over consecutive saturated windows the
   tokens served stay within ``n x tpm`` plus the last window's overshoot.
   **Headroom.** The requests still in flight when a saturated window ends are mostly the long ones (a
   long answer stays in flight longer), so their corrections come out positive: a window that admits up
   to its tpm ends above it by about the same amount each time. So each model group learns that amount:
   at the roll-over after next, when a saturated window's corrections are in, ``headroom`` moves
   ``HEADROOM_WEIGHT`` of the way towards what that window ended above the limit it admitted against
   (``tpm - headroom``, plus the part of the headroom that requests within their pool's share took: the
   headroom comes out of borrowing, never out of a reservation, see
   :func:`~litellm_ratebalance.admission.policy.decide`), within ``0 .. HEADROOM_CAP x tpm``; new
   reservations that borrow leave it free. A window is *saturated* when it refused a request for the
   model's tokens. (While the headroom is still being learned, a window pays both for the carry of the
   one before and for the headroom: the weight is small so that this dip stays small.)
3. **Decide** the request (:func:`~litellm_ratebalance.admission.policy.decide`) with its cost: its fixed
   tokens plus, when its output is estimated, ``min(cap, estimate)``, keeping the headroom free; reserve it
   if admitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from litellm_ratebalance.admission.estimate import (
    SettleBatch,
    decayed,
    estimate_from_histogram,
    reserved_output,
)
from litellm_ratebalance.admission.policy import (
    AdmissionLimits,
    Decision,
    RejectReason,
    WindowCounters,
    decide,
    headroom_taken,
)

__all__ = ["HEADROOM_CAP", "HEADROOM_WEIGHT", "AdmissionLedger", "LedgerResult", "RequestCost", "WindowState"]

HEADROOM_WEIGHT = 0.3
"""How far the headroom moves towards a saturated window's measured overshoot at each update."""
HEADROOM_CAP = 0.2
"""The headroom never exceeds this share of the tpm."""


@dataclass(frozen=True, slots=True)
class RequestCost:
    """What one request reserves: ``fixed`` tokens, plus the learned output estimate capped at
    ``output_cap`` when that is not ``None``."""

    fixed: int
    output_cap: int | None = None
    prior: int = 0
    """Output tokens assumed before anything is learned."""


@dataclass(slots=True)
class WindowState:
    """One model group's live window and what is remembered of the one before it."""

    start_ms: int
    counts: dict[str, int] = field(default_factory=dict)
    """``r`` / ``t`` (model requests / tokens) and ``r:<pool>`` / ``t:<pool>``."""
    carry: int = 0
    """Tokens the previous window used past its tpm, counted in this window's ``t``."""
    prev_start_ms: int = -1
    prev_tokens: int = 0
    prev_tpm: int = -1
    """The previous window's tpm, -1 when it had none (then nothing is carried)."""
    full: bool = False
    """A request was refused for the model's tokens in this window (it is saturated)."""
    prev_full: bool = False
    headroom_taken: float = 0.0
    """The most of the headroom that requests within their pool's share reserved in this window."""
    prev_headroom_taken: float = 0.0


@dataclass(slots=True)
class _Estimate:
    histogram: dict[int, tuple[float, float]] = field(default_factory=dict)
    total: float = 0.0
    value: float | None = None
    headroom: float = 0.0


@dataclass(frozen=True, slots=True)
class LedgerResult:
    decision: Decision
    window: WindowState
    cost_tokens: int
    counters: WindowCounters
    estimate: float | None
    headroom: float


def _add(counts: dict[str, int], name: str, delta: int) -> None:
    if delta:
        counts[name] = max(0, counts.get(name, 0) + delta)


class AdmissionLedger:
    """Every model group's window and estimate; not thread-safe (the store holds a lock around it)."""

    __slots__ = ("_estimates", "windows")

    def __init__(self) -> None:
        self.windows: dict[str, WindowState] = {}
        self._estimates: dict[str, _Estimate] = {}

    def estimate(self, model_group: str) -> float | None:
        """The learned output estimate of a model group (``None`` before any sample)."""
        found = self._estimates.get(model_group)
        return None if found is None else found.value

    def apply(self, model_group: str, batch: SettleBatch | None, quantile: float | None) -> None:
        """Step 1 of the module doc: settles and samples, without rolling the window over."""
        if not batch:
            return
        window = self.windows.get(model_group)
        if window is not None:
            _settle(window, batch)
        if batch.samples:
            estimate = self._estimates.setdefault(model_group, _Estimate())
            histogram = dict(estimate.histogram)
            total = estimate.total
            for bucket, (count, tokens) in batch.samples.items():
                old_count, old_tokens = histogram.get(bucket, (0.0, 0.0))
                histogram[bucket] = (old_count + count, old_tokens + tokens)
                total += count
            estimate.histogram, estimate.total = decayed(histogram, total)
            estimate.value = estimate_from_histogram(estimate.histogram, quantile)

    def acquire(
        self,
        model_group: str,
        limits: AdmissionLimits,
        cost: RequestCost,
        *,
        now_ms: int,
        window_ms: int,
        batch: SettleBatch | None = None,
        quantile: float | None = None,
    ) -> LedgerResult:
        """Steps 1-3 of the module doc for one request."""
        self.apply(model_group, batch, quantile)
        window = self.windows.get(model_group)
        learned = self._estimates.get(model_group)
        if window is None or now_ms >= window.start_ms + window_ms:
            if window is not None and window.prev_full and window.prev_tpm >= 0:
                learned = self._estimates.setdefault(model_group, _Estimate())
                learned.headroom = next_headroom(
                    learned.headroom, window.prev_tokens, window.prev_tpm, window.prev_headroom_taken
                )
            window = _roll_over(window, now_ms, window_ms, limits.tpm)
            self.windows[model_group] = window
        estimate = None if learned is None else learned.value
        headroom = 0.0 if learned is None else learned.headroom
        cost_tokens = cost.fixed
        if cost.output_cap is not None:
            cost_tokens += reserved_output(cost.output_cap, estimate, cost.prior)
        counts = window.counts
        pool = limits.pool
        counters = WindowCounters(
            counts.get("r", 0),
            counts.get("t", 0),
            counts.get("r:" + pool, 0),
            counts.get("t:" + pool, 0),
            {f.pool: (counts.get("r:" + f.pool, 0), counts.get("t:" + f.pool, 0)) for f in limits.floors},
        )
        decision = decide(counters, limits, cost_tokens, headroom)
        if decision.reason is RejectReason.MODEL_TOKENS:
            window.full = True
        if decision.admitted:
            taken = headroom_taken(counters, limits, cost_tokens, headroom, counters.tokens + cost_tokens)
            window.headroom_taken = max(window.headroom_taken, taken)
            for name, delta in (("r", 1), ("r:" + pool, 1), ("t", cost_tokens), ("t:" + pool, cost_tokens)):
                counts[name] = counts.get(name, 0) + delta
            counters = WindowCounters(
                counts["r"], counts["t"], counts["r:" + pool], counts["t:" + pool], counters.other_pools
            )
        return LedgerResult(decision, window, cost_tokens, counters, estimate, headroom)

    def forget_ended(self, now_ms: int, window_ms: int) -> None:
        """Drop windows ended for a whole window (a removed model group must not stay forever)."""
        for name in [n for n, w in self.windows.items() if now_ms >= w.start_ms + 2 * window_ms]:
            del self.windows[name]


def _settle(window: WindowState, batch: SettleBatch) -> None:
    counts = window.counts
    prev_tokens = window.prev_tokens
    prev_moved = False
    for start, pool, tokens, requests in batch.delta_items():
        if start == window.start_ms:
            _add(counts, "t", tokens)
            _add(counts, "t:" + pool, tokens)
            _add(counts, "r", requests)
            _add(counts, "r:" + pool, requests)
        elif start == window.prev_start_ms:
            prev_tokens += tokens
            prev_moved = True
        elif tokens > 0:
            _add(counts, "t", tokens)
    if prev_moved:
        carry = max(0, prev_tokens - window.prev_tpm) if window.prev_tpm >= 0 else 0
        _add(counts, "t", carry - window.carry)
        window.prev_tokens, window.carry = prev_tokens, carry


def next_headroom(headroom: float, final_tokens: int, tpm: int, taken: float = 0.0) -> float:
    """The headroom after a saturated window with ``tpm`` ended at ``final_tokens``, where requests within
    their pool's share took ``taken`` of the headroom (module doc, step 2)."""
    overshoot = final_tokens - (tpm - headroom + min(max(0.0, taken), headroom))
    moved = (1 - HEADROOM_WEIGHT) * headroom + HEADROOM_WEIGHT * overshoot
    return min(max(0.0, moved), HEADROOM_CAP * tpm)


def _roll_over(ended: WindowState | None, now_ms: int, window_ms: int, tpm: int | None) -> WindowState:
    if ended is None:
        return WindowState(now_ms)
    tokens = ended.counts.get("t", 0)
    consecutive = now_ms < ended.start_ms + 2 * window_ms and tpm is not None
    carry = max(0, tokens - tpm) if consecutive and tpm is not None else 0
    state = WindowState(
        now_ms,
        carry=carry,
        prev_start_ms=ended.start_ms,
        prev_tokens=tokens,
        prev_tpm=tpm if consecutive and tpm is not None else -1,
        prev_full=ended.full,
        prev_headroom_taken=ended.headroom_taken,
    )
    if carry:
        state.counts["t"] = carry
    return state
