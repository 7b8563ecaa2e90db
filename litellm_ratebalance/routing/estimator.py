"""Pure rate-balancing estimator: window aggregates -> pooled SLA percentile -> weights.

Nothing here does I/O or reads a clock. :class:`~litellm_ratebalance.routing.balancer.RateBalancer` keeps
the aggregates (from the store) and calls :func:`compute_shares` when it needs the weights of a set of
candidate deployments.

Definitions (the proposal's meaning, with our additions marked *):

* **effective rate** of one finished request = ``(output_tokens + input_tokens / ratio) / latency`` in
  tokens per second, ``ratio`` the input-to-output token ratio (250 by default). *A failed request (error,
  timeout, 429, stall) is a sample with rate 0.
* *A deployment's window is summarised by a :class:`RateAggregate`: count, failures, sum and sum of
  squares of the rates, latency, tokens, time-to-first-token, and a fixed log-spaced histogram of rates
  (:data:`BINS_PER_DECADE` bins per decade from :data:`RATE_FLOOR` up). Aggregates add, so time buckets
  merge into a window and replicas into one picture, and a decision never walks samples.
* **SLA** = the ``greediness`` percentile of the pooled samples of all candidates. *It is read from the
  merged histogram (linear interpolation of ranks as numpy's default, log-linear inside a bin), so it is
  exact up to the bin width (about 12 %).
* **weight** = the estimated probability that the deployment's rate exceeds the SLA: ``normal`` fits a
  normal distribution to the deployment's samples (the proposal), ``empirical`` takes the share of its own
  samples above the SLA (from its histogram). A normal fit of identical samples (zero spread) gives 1, 1/2
  or 0 as the mean is above, at or below the SLA (the proposal's code gave such a deployment weight 1).
* **bootstrap**: while some candidate has no sample in the window every candidate gets the same weight. A
  candidate measured before whose samples have all aged out of the window (``DeploymentState.stale``) does
  not count here: it gets no weight, only its exploration share (an addition: the proposal would send the
  whole set back to equal chances each time a little-used deployment's last sample ages out).
* *prior*: with ``prior_samples = k``, a deployment's probability from ``n`` samples is blended with the
  pooled share above the SLA (``1 - greediness``) as ``(n p + k (1 - greediness)) / (n + k)``: a deployment
  with few samples in the window is neither written off nor crowned on their strength.
* *failure penalty*: the weight is multiplied by ``(1 - f) ** failure_penalty``, ``f`` the share of the
  deployment's recent attempts (a shorter window) that failed, so a failing deployment loses its share in
  seconds rather than after a window.
* *exploration*: shares are mixed with the uniform distribution, ``share = (1 - e) * share + e / n``, so a
  deployment with a poor estimate still gets the odd request and its recovery is seen.
* *capacity*: the share is then multiplied by a headroom factor in 0..1 from provider rate-limit headers
  and configured tpm/rpm (:func:`headroom_multiplier`); a deployment near exhaustion is avoided (not
  explored).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

__all__ = [
    "BINS_PER_DECADE",
    "NUM_BINS",
    "RATE_FLOOR",
    "DeploymentState",
    "EstimatorName",
    "LoadFit",
    "RateAggregate",
    "RateLimitObservation",
    "Shares",
    "SizeFit",
    "bin_bounds",
    "bin_index",
    "compute_shares",
    "effective_rate",
    "failure_multiplier",
    "headroom_multiplier",
    "parse_reset_seconds",
    "pooled_percentile",
    "probability_above",
    "recency_weight",
    "reweigh",
    "weigh",
]

EstimatorName = Literal["normal", "empirical"]

RATE_FLOOR = 1e-3
"""Rates below this many tokens per second (failures included) fall into bin 0 and count as 0."""
BINS_PER_DECADE = 20
_DECADES = 9
NUM_BINS = 2 + BINS_PER_DECADE * _DECADES
"""Bin 0: rate < RATE_FLOOR; bins 1..: log-spaced from RATE_FLOOR; the last bin is open-ended (>= 1e6)."""
_GROWTH = 10.0 ** (1.0 / BINS_PER_DECADE)
_LOG_GROWTH = math.log(_GROWTH)
MIN_LATENCY_SECONDS = 1e-3
"""Latencies below this are clamped (a zero latency would make the rate infinite)."""


def effective_rate(output_tokens: float, input_tokens: float, latency_seconds: float, ratio: float) -> float:
    """Tokens per second of one finished request: ``(output + input / ratio) / latency``."""
    return (output_tokens + input_tokens / ratio) / max(latency_seconds, MIN_LATENCY_SECONDS)


_SQRT2: Final = math.sqrt(2.0)


def bin_index(rate: float) -> int:
    """Histogram bin of ``rate``; 0 for rates below :data:`RATE_FLOOR` (and for failures)."""
    if not rate >= RATE_FLOOR:  # also catches NaN
        return 0
    index = 1 + int(math.log(rate / RATE_FLOOR) / _LOG_GROWTH)
    return min(index, NUM_BINS - 1)


def bin_bounds(index: int) -> tuple[float, float]:
    """``(lower, upper)`` rate bounds of a bin; bin 0 is ``(0, 0)`` (its samples count as rate 0)."""
    if index <= 0:
        return 0.0, 0.0
    lower = RATE_FLOOR * _GROWTH ** (index - 1)
    return lower, lower * _GROWTH


_AGGREGATE_FIELDS = (
    "bins",
    "count",
    "failures",
    "ok_latency_sum",
    "rate_sq_sum",
    "rate_sum",
    "tokens",
    "ttft_count",
    "ttft_sum",
)
"""What :class:`RateAggregate` equality compares: every field."""


class RateAggregate:
    """Summary of a set of rate samples of one deployment (a time bucket, a window, pending samples).

    Aggregates are added with :meth:`merge`; nothing in them depends on the order of samples. ``bins``
    maps a bin index to its sample count (only non-empty bins are present).
    """

    __slots__ = _AGGREGATE_FIELDS

    def __init__(
        self,
        count: float = 0,
        failures: float = 0,
        rate_sum: float = 0.0,
        rate_sq_sum: float = 0.0,
        ok_latency_sum: float = 0.0,
        tokens: float = 0,
        ttft_sum: float = 0.0,
        ttft_count: float = 0,
        bins: Mapping[int, float] | None = None,
    ) -> None:
        self.count = count
        """Samples, failures included (whole numbers, except in a recency-weighted window)."""
        self.failures = failures
        self.rate_sum = rate_sum
        self.rate_sq_sum = rate_sq_sum
        self.ok_latency_sum = ok_latency_sum
        """Sum of the latencies of the successful samples (seconds)."""
        self.tokens = tokens
        """Input + output tokens (for configured tpm)."""
        self.ttft_sum = ttft_sum
        self.ttft_count = ttft_count
        self.bins: dict[int, float] = dict(bins) if bins else {}

    def add(
        self, rate: float, *, ok: bool = True, latency: float = 0.0, tokens: int = 0, ttft: float | None = None
    ) -> None:
        """Add one sample (``rate`` is ignored and 0 is used when ``ok`` is false)."""
        if not ok or not rate > 0.0:
            rate = 0.0
        self.count += 1
        if ok:
            self.ok_latency_sum += latency
        else:
            self.failures += 1
        self.rate_sum += rate
        self.rate_sq_sum += rate * rate
        self.tokens += tokens
        if ttft is not None:
            self.ttft_sum += ttft
            self.ttft_count += 1
        index = bin_index(rate)
        self.bins[index] = self.bins.get(index, 0) + 1

    def merge(self, other: RateAggregate) -> None:
        """Add ``other``'s samples to this aggregate."""
        self.count += other.count
        self.failures += other.failures
        self.rate_sum += other.rate_sum
        self.rate_sq_sum += other.rate_sq_sum
        self.ok_latency_sum += other.ok_latency_sum
        self.tokens += other.tokens
        self.ttft_sum += other.ttft_sum
        self.ttft_count += other.ttft_count
        bins = self.bins
        for index, n in other.bins.items():
            bins[index] = bins.get(index, 0) + n

    def merge_scaled(self, other: RateAggregate, factor: float) -> None:
        """Add ``other``'s samples, each counting ``factor`` (a recency weight in 0..1)."""
        if factor == 1.0:
            self.merge(other)
            return
        self.count += factor * other.count
        self.failures += factor * other.failures
        self.rate_sum += factor * other.rate_sum
        self.rate_sq_sum += factor * other.rate_sq_sum
        self.ok_latency_sum += factor * other.ok_latency_sum
        self.tokens += factor * other.tokens
        self.ttft_sum += factor * other.ttft_sum
        self.ttft_count += factor * other.ttft_count
        bins = self.bins
        for index, n in other.bins.items():
            bins[index] = bins.get(index, 0) + factor * n

    def copy(self) -> RateAggregate:
        return RateAggregate(
            self.count,
            self.failures,
            self.rate_sum,
            self.rate_sq_sum,
            self.ok_latency_sum,
            self.tokens,
            self.ttft_sum,
            self.ttft_count,
            self.bins,
        )

    @property
    def mean(self) -> float:
        return self.rate_sum / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation of the rates (as the proposal: divide by n)."""
        if not self.count:
            return 0.0
        mean = self.rate_sum / self.count
        return math.sqrt(max(self.rate_sq_sum / self.count - mean * mean, 0.0))

    def ok_moments(self) -> tuple[float, float, float] | None:
        """(weight, mean rate, variance of the rates) of the successful samples; None without any."""
        ok = self.count - self.failures
        if ok <= 1e-9:
            return None
        mean = self.rate_sum / ok
        return ok, mean, self.rate_sq_sum / ok - mean * mean

    @property
    def mean_ok_rate(self) -> float | None:
        """Mean rate of the successful samples."""
        ok = self.count - self.failures
        return self.rate_sum / ok if ok > 1e-9 else None

    @property
    def mean_ok_latency(self) -> float | None:
        ok = self.count - self.failures
        return self.ok_latency_sum / ok if ok > 1e-9 else None

    @property
    def mean_ttft(self) -> float | None:
        return self.ttft_sum / self.ttft_count if self.ttft_count else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RateAggregate):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _AGGREGATE_FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"RateAggregate(count={self.count}, failures={self.failures}, mean={self.mean:.4g}, "
            f"std={self.std:.4g}, tokens={self.tokens})"
        )


@dataclass(frozen=True, slots=True)
class RateLimitObservation:
    """The provider's ``x-ratelimit-*`` headers of a deployment's latest response (``None``: not sent)."""

    remaining_requests: float | None = None
    remaining_tokens: float | None = None
    limit_requests: float | None = None
    limit_tokens: float | None = None
    reset_seconds: float | None = None
    """Seconds until the limit resets (the smaller of the two reset headers); the observation is ignored
    after that."""
    observed_ms: int = 0
    """Store clock (Redis ``TIME``) when the observation was written; 0 before it reached the store."""

    def fraction_left(self) -> float | None:
        """Smallest remaining/limit over requests and tokens; 0 for a reported ``remaining`` of 0 without a
        limit; ``None`` when nothing usable was reported."""
        fractions: list[float] = []
        for remaining, limit in (
            (self.remaining_requests, self.limit_requests),
            (self.remaining_tokens, self.limit_tokens),
        ):
            if remaining is None:
                continue
            if limit is not None and limit > 0:
                fractions.append(min(max(remaining / limit, 0.0), 1.0))
            elif remaining <= 0:
                fractions.append(0.0)
        return min(fractions) if fractions else None

    def is_current(self, now_ms: int, max_age_seconds: float) -> bool:
        age_limit = max_age_seconds if self.reset_seconds is None else min(max_age_seconds, self.reset_seconds)
        return now_ms - self.observed_ms < age_limit * 1000.0


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_reset_seconds(value: object) -> float | None:
    """Seconds in a reset header: a number (``"12"``, ``1.5``) or a Go duration (``"6m0s"``, ``"20ms"``).

    Returns ``None`` for anything else (negative numbers included).
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number if number >= 0 and math.isfinite(number) else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(number) * scale[unit] for number, unit in parts)


def pooled_percentile(aggregates: Iterable[RateAggregate], q: float) -> float:
    """The ``q`` quantile (0..1) of all samples of ``aggregates``, from their merged histograms.

    Rank as numpy's default (``h = q * (n - 1)``); inside a bin the value is interpolated on a log scale
    (bin 0 is rate 0). Raises ValueError when there are no samples.
    """
    merged: dict[int, float] = {}
    for aggregate in aggregates:
        for index, n in aggregate.bins.items():
            merged[index] = merged.get(index, 0) + n
    return _quantile_of_bins(merged, q)


def _quantile_of_bins(bins: Mapping[int, float], q: float) -> float:
    total = sum(bins.values())
    if total <= 0:
        raise ValueError("no samples")
    rank = q * max(total - 1, 0.0)
    low = math.floor(rank)
    fraction = rank - low
    ordered = sorted(bins.items())
    value_low = _order_statistic(ordered, low)
    if fraction <= 0.0:
        return value_low
    return value_low + fraction * (_order_statistic(ordered, min(low + 1, total - 1)) - value_low)


def _order_statistic(ordered: Sequence[tuple[int, float]], k: float) -> float:
    """Value of the k-th smallest sample (0-based): the n samples of a bin sit at the midpoints of n equal
    log-slices of it; bin 0 samples are 0."""
    seen = 0.0
    for index, n in ordered:
        if k < seen + n:
            if index == 0:
                return 0.0
            lower, upper = bin_bounds(index)
            # (clamped: with recency-weighted, fractional counts the slice may run past the bin)
            position = min(max((k - seen + 0.5) / n, 0.0), 1.0)
            return float(lower * (upper / lower) ** position)
        seen += n
    return bin_bounds(ordered[-1][0])[1]


def probability_above(
    aggregate: RateAggregate,
    sla: float,
    estimator: EstimatorName,
    shift: float = 0.0,
    spread: float | None = None,
) -> float:
    """Estimated probability that a request to this deployment beats rate ``sla`` >= 0 (0 with no samples).

    A failure is a sample of rate 0, which never beats the SLA. ``normal``: the share of successful samples
    times the probability from a normal fit of their rates (the proposal's fit, of the answers only);
    ``empirical``: the share of all samples above the SLA.

    ``shift`` moves the deployment's rate distribution (tokens/s; the load correction, see
    :class:`LoadFit`): the normal fit's mean moves by it, the empirical estimator compares its samples with
    ``sla - shift``.
    """
    if aggregate.count <= 0:
        return 0.0
    if estimator == "empirical":
        return _share_above(aggregate, max(sla - shift, 0.0))
    moments = aggregate.ok_moments()
    if moments is None:
        return 0.0
    ok, mean, variance = moments
    # Failures are samples of rate 0, so the rates are a mixture: zeros, and the successful answers. The
    # normal fit is of the answers alone, times their share; one normal through the zeros and the answers
    # together would put its mass between them, where neither lies (for a deployment that fails a quarter
    # of its requests fast, a mean three quarters of its rate and a spread as wide as the gap).
    ok_share = min(ok / aggregate.count, 1.0)
    ok_std = math.sqrt(max(variance, 0.0))
    mean += shift
    std = ok_std if spread is None else min(ok_std, spread)
    if std <= 1e-12 * max(1.0, abs(mean)):
        # Identical answers: the normal fit degenerates to a point mass at their mean.
        if math.isclose(mean, sla, rel_tol=1e-9, abs_tol=1e-12):
            return 0.5 * ok_share
        return ok_share if mean > sla else 0.0
    return ok_share * 0.5 * math.erfc((sla - mean) / (std * _SQRT2))


def _share_above(aggregate: RateAggregate, sla: float) -> float:
    above = 0.0
    sla_bin = bin_index(sla) if sla > 0 else 0
    for index, n in aggregate.bins.items():
        if index > sla_bin:
            above += n
        elif index == sla_bin and index > 0:
            lower, upper = bin_bounds(index)
            # Samples spread log-uniformly inside the bin: the part of it above the SLA.
            above += n * (1.0 - math.log(sla / lower) / math.log(upper / lower))
    return min(max(above / aggregate.count, 0.0), 1.0)


def failure_multiplier(failures: float, attempts: float, penalty: float) -> float:
    """``(1 - failures/attempts) ** penalty``; 1 with no attempts or no penalty."""
    if attempts <= 0 or penalty <= 0 or failures <= 0:
        return 1.0
    share_ok = max(1.0 - failures / attempts, 0.0)
    return float(share_ok**penalty)


def headroom_multiplier(fraction_left: float | None, headroom: float) -> float:
    """Scale 0..1 for a deployment with ``fraction_left`` of its rate limit: 1 above ``headroom``, then
    linear down to 0 at exhaustion (``None``: unknown, 1)."""
    if fraction_left is None:
        return 1.0
    if fraction_left <= 0.0:
        return 0.0
    if headroom <= 0.0 or fraction_left >= headroom:
        return 1.0
    return fraction_left / headroom


class DeploymentState(NamedTuple):
    """What :func:`compute_shares` knows about one candidate.

    (A named tuple rather than a frozen dataclass: one is built per decision that works in-flight evidence
    out, and a frozen dataclass's ``__init__`` costs three times as much.)"""

    window: RateAggregate
    """Samples in the window (the adaptive window when enabled)."""
    recent_attempts: float = 0.0
    recent_failures: float = 0.0
    capacity: float = 1.0
    """Headroom multiplier from rate-limit headers and configured tpm/rpm, 0..1."""
    load_shift: float = 0.0
    """Expected change of the deployment's rate (tokens/s) at its current load against the load its samples
    were taken at (:meth:`LoadFit.shift`); 0 without load awareness."""
    load_spread: float | None = None
    """Spread of the rate once the load is known (:meth:`LoadFit.spread`); the normal fit uses it when it
    is smaller than the window's, so the estimate at the current load is as sharp as the load model is."""
    stale: bool = False
    """No samples in the window, but the deployment has been measured before (its samples aged out): it gets
    no weight, only its exploration share, instead of sending the whole candidate set back to the bootstrap
    (which is for deployments never measured). The balancer sets it only with an exploration share above 0."""


Mode = Literal["round_robin", "bootstrap", "weighted"]


class Shares(NamedTuple):
    """The choice probabilities of a candidate set (same order as the candidates), and how they came.

    (A named tuple, as :class:`DeploymentState`: one is built per decision that works in-flight evidence out.)"""

    shares: tuple[float, ...]
    mode: Mode
    sla: float | None
    probabilities: tuple[float, ...]
    """The estimator's value per candidate (1.0 each in bootstrap and round-robin modes)."""
    weights: tuple[float, ...] = ()
    """Per candidate: the probability times the failure multiplier, before exploration, capacity and
    normalisation (what :func:`reweigh` starts from)."""
    exploit: tuple[float, ...] = ()
    """The shares without the exploration part (weights times capacity, normalised; empty when they are
    all 0): what a selection that explores on its own (``least_loaded``) follows."""


def compute_shares(
    states: Sequence[DeploymentState],
    *,
    greediness: float,
    estimator: EstimatorName = "normal",
    exploration_share: float = 0.0,
    failure_penalty: float = 0.0,
    prior_samples: float = 0.0,
    round_robin: bool = False,
    sla: float | None = None,
) -> Shares:
    """Choice probabilities of the candidates ``states`` (see the module docstring for the rules).

    ``round_robin`` (window 0) and ``greediness == 0`` give exactly equal shares, as the proposal defines.
    ``sla``: the pooled percentile when the caller already has it (it depends on the windows only, so the
    balancer computes it once per sync and candidate set); computed from ``states`` when None.
    """
    n = len(states)
    if n == 0:
        return Shares((), "round_robin", None, ())
    if round_robin or greediness <= 0.0:
        return Shares((1.0 / n,) * n, "round_robin", None, (1.0,) * n)
    mode: Mode
    if any(state.window.count <= 0 and not state.stale for state in states) or not any(
        state.window.count > 0 for state in states
    ):
        mode = "bootstrap"
        sla = None
        probabilities = [1.0] * n
    else:
        mode = "weighted"
        if sla is None:
            sla = pooled_percentile((state.window for state in states), greediness)
        probabilities = [_probability(state, sla, greediness, estimator, prior_samples) for state in states]
    weights = [
        p * failure_multiplier(state.recent_failures, state.recent_attempts, failure_penalty)
        for p, state in zip(probabilities, states, strict=True)
    ]
    return _normalise(weights, states, exploration_share, mode, sla, probabilities)


def weigh(
    state: DeploymentState,
    sla: float,
    greediness: float,
    estimator: EstimatorName = "normal",
    failure_penalty: float = 0.0,
    prior_samples: float = 0.0,
) -> tuple[float, float]:
    """(probability, weight) of one candidate with samples in weighted mode: what :func:`compute_shares`
    gives it before exploration, capacity and normalisation."""
    p = _probability(state, sla, greediness, estimator, prior_samples)
    return p, p * failure_multiplier(state.recent_failures, state.recent_attempts, failure_penalty)


def reweigh(
    base: Shares,
    states: Sequence[DeploymentState],
    changed: Mapping[int, tuple[float, float]],
    *,
    exploration_share: float = 0.0,
) -> Shares:
    """:func:`compute_shares` of ``states`` with ``sla=base.sla``, when ``base`` is in weighted mode and
    only the candidates at the indices of ``changed`` differ from the states ``base`` came from, each with
    samples and its :func:`weigh` result in ``changed``. The others' weights are reused: O(changed)
    estimates plus one normalisation."""
    if base.mode != "weighted" or len(base.weights) != len(states):
        raise ValueError("reweigh() needs shares in weighted mode of as many candidates as states")
    probabilities = list(base.probabilities)
    weights = list(base.weights)
    for i, (p, w) in changed.items():
        probabilities[i] = p
        weights[i] = w
    return _normalise(weights, states, exploration_share, "weighted", base.sla, probabilities)


def _probability(
    state: DeploymentState, sla: float, greediness: float, estimator: EstimatorName, prior_samples: float
) -> float:
    p = probability_above(state.window, sla, estimator, state.load_shift, state.load_spread)
    if prior_samples > 0:
        # A few samples say little: pull the estimate toward the share of all samples above the SLA
        # (1 - greediness) as if prior_samples typical samples were added, so a quiet deployment is tried
        # often enough to show that it got better.
        count = state.window.count
        p = (count * p + prior_samples * (1.0 - greediness)) / (count + prior_samples)
    return p


def _normalise(
    weights: list[float],
    states: Sequence[DeploymentState],
    exploration_share: float,
    mode: Mode,
    sla: float | None,
    probabilities: Sequence[float],
) -> Shares:
    """Weights to shares: exploration, capacity, normalisation (see :func:`compute_shares`)."""
    n = len(weights)
    if len(states) != n:
        raise ValueError(f"{n} weights but {len(states)} states")
    raw = tuple(weights)
    total = sum(raw)
    if total <= 0.0:
        # Nobody is expected to beat the SLA (or everybody fails): no preference left to express.
        weights = [1.0] * n
        total = float(n)
    explore = exploration_share / n
    keep = 1.0 - exploration_share
    scale = keep / total
    # (one pass with local lists, the weights read by index, the lengths checked above: this runs on every
    # decision that works in-flight evidence out afresh, and zipping the two, strict or not, cost more)
    shares: list[float] = []
    exploit: list[float] = []
    share_total = 0.0
    exploit_total = 0.0
    for i, state in enumerate(states):
        w = weights[i]
        capacity = state.capacity
        share = (scale * w + explore) * capacity
        shares.append(share)
        share_total += share
        useful = w * capacity
        exploit.append(useful)
        exploit_total += useful
    if share_total <= 0.0:
        # Every candidate is at its rate limit: spread evenly and let the providers answer.
        shares = [1.0] * n
        share_total = float(n)
    return Shares(
        tuple([s / share_total for s in shares]),
        mode,
        sla,
        tuple(probabilities),
        raw,
        tuple([e / exploit_total for e in exploit]) if exploit_total > 0.0 else (),
    )


def _load_level(load: float, lightest: float, levels: int) -> int:
    """Index of the load level of ``load``: 0 up to ``lightest``, then one per doubling (the last open)."""
    level = 0
    top = lightest
    while load > top and level < levels - 1:
        level += 1
        top *= 2.0
    return level


def recency_weight(age_seconds: float, half_life_seconds: float) -> float:
    """``0.5 ** (age / half-life)``: how much a sample of that age counts; 1 when the half-life is 0 (off)."""
    if half_life_seconds <= 0.0:
        return 1.0
    return float(0.5 ** (max(age_seconds, 0.0) / half_life_seconds))


SATURATION_EVIDENCE = 0.8
"""A deployment counts as seen saturated when its peak throughput is below this share of what its busiest
load would give at the unloaded rate."""
SATURATION_MIN_WEIGHT = 3.0
"""Recency-weighted samples a load level needs to count in the peak throughput and the busiest load: the mean
of one or two answers of mixed sizes can sit 25 % below the light-load rate on a deployment with slots to
spare. (The light-load rate itself needs only ``LoadFit.MIN_LEVEL_WEIGHT``: a deployment with few slots is
seldom seen nearly idle.)"""


class LoadFit:
    """How a deployment's rate depends on its load (requests in flight there), from its successful samples.

    Each sample adds ``(load, rate)``, ``load`` = the requests in flight at the deployment during the
    request, itself included (their mean over the request's life). Recency-weighted figures (times
    are explicit, no clock; they fade with ``half_life_seconds``):

    * the **peak throughput**, the highest ``mean load x mean rate`` of a load level: a deployment with ``c``
      slots at ``r`` tokens/s each peaks at about ``c x r``, so at a load above ``c`` each request gets about
      ``peak / load``. Level means, not single samples: one answer that met a crowd which left at once
      would set a peak far above what the deployment serves, hiding its saturation;
    * the **light-load rate**: the mean rate of the samples at the lightest load level seen (levels: a load
      of at most :data:`UNLOADED_LOAD`, then doubling ranges above it). For a deployment that is sometimes
      nearly idle that is its unloaded rate; one that is never idle (every sample met a few requests) is
      judged by its lightest loads, so its load fit does not go blank while it is busy.

    :meth:`expected_rate` at a load is the smaller of the two once the peak shows the deployment saturated,
    before that the mean rate seen at that load's level; :meth:`shift` is how far it is from the
    deployment's window mean. So a deployment with few slots is not piled onto, gets its full rate back in
    the estimate when it is idle, and one with many slots is not held back once it has been seen busy. At a
    load above any level seen, an unsaturated fit predicts nothing (the window mean stands).

    ``carried_slots``: the slots a deployment's previous fit had learnt, when a change of its rate was
    detected (its rates from before are dropped, its capacity seldom changes with them). They stand until
    this fit sees saturation of its own, or sees the deployment busier than them and no slower for it.
    """

    __slots__ = (
        "_derived",
        "base_latency",
        "carried_slots",
        "last",
        "level_latencies",
        "level_loads",
        "level_sized",
        "level_sums",
        "level_weights",
        "level_works",
        "residual_sq_sum",
        "residual_weight",
        "samples",
    )

    MIN_SAMPLES: Final = 3
    """Samples before the fit says anything."""
    UNLOADED_LOAD: Final = 2.0
    """Upper bound of the lightest load level; level ``k`` above it holds loads up to ``UNLOADED_LOAD * 2**k``."""
    LEVELS: Final = 8
    MIN_LEVEL_WEIGHT: Final = 0.5
    """Recency-weighted samples a load level needs before its mean rate stands for anything (the light-load
    rate, or the prediction at a load of that level)."""

    def __init__(self, carried_slots: float | None = None) -> None:
        self.carried_slots = carried_slots
        """Slots learnt before a change of regime, standing until this fit learns its own."""
        self.samples = 0
        self.level_sums = [0.0] * self.LEVELS
        self.level_loads = [0.0] * self.LEVELS
        self.level_weights = [0.0] * self.LEVELS
        self.level_works = [0.0] * self.LEVELS
        self.level_latencies = [0.0] * self.LEVELS
        self.level_sized = [0.0] * self.LEVELS
        self.base_latency = 0.0
        """The part of a request's latency that does not depend on its size (seconds), as last given."""
        self.residual_sq_sum = 0.0
        self.residual_weight = 0.0
        self.last = float("-inf")
        self._derived: tuple[float | None, float | None, float | None, float | None] = (None, None, carried_slots, None)
        """(light-load rate, top of its load level, slots, spread) as of the last sample."""

    def add(
        self,
        now: float,
        load: float,
        rate: float,
        half_life_seconds: float,
        *,
        work: float | None = None,
        latency: float | None = None,
        base_latency: float | None = None,
    ) -> None:
        """Add one successful sample: ``rate`` at ``load`` requests in flight. With its ``work`` and
        ``latency`` (both positive) it also counts in how many slots a saturated deployment has, judged on
        the part of the latency above ``base_latency`` (the size fit's fixed part, when known): that is the
        part the load stretches, and the fixed part, counted in, makes a saturated deployment look to lose
        less than it does, its slots more than it has."""
        if half_life_seconds > 0.0 and self.samples and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.level_sums = [x * factor for x in self.level_sums]
            self.level_loads = [x * factor for x in self.level_loads]
            self.level_weights = [x * factor for x in self.level_weights]
            self.level_works = [x * factor for x in self.level_works]
            self.level_latencies = [x * factor for x in self.level_latencies]
            self.level_sized = [x * factor for x in self.level_sized]
            self.residual_sq_sum *= factor
            self.residual_weight *= factor
        predicted = self.expected_rate(load)
        if predicted is not None:
            # How far samples fall from the prediction at their own load: the spread left once load is known.
            self.residual_sq_sum += (rate - predicted) ** 2
            self.residual_weight += 1.0
        self.last = max(self.last, now)
        self.samples += 1
        level = _load_level(load, self.UNLOADED_LOAD, self.LEVELS)
        self.level_sums[level] += rate
        self.level_loads[level] += load
        self.level_weights[level] += 1.0
        if work is not None and latency is not None and work > 0.0 and latency > 0.0:
            self.level_works[level] += work
            self.level_latencies[level] += latency
            self.level_sized[level] += 1.0
        if base_latency is not None and base_latency >= 0.0:
            self.base_latency = base_latency
        light = self._light()
        self._derived = (*light, self._slots(light), self._spread())

    def _throughput(self) -> tuple[float, float]:
        """(peak, busiest load): the highest ``mean load x mean rate`` of a load level with weight enough
        (:data:`SATURATION_MIN_WEIGHT`), and the highest mean load of such a level. Level means, not single
        samples: one answer that met a crowd which left at once would otherwise set a peak far above what the
        deployment can serve."""
        peak = 0.0
        busiest = 0.0
        for level in range(self.LEVELS):
            weight = self.level_weights[level]
            if weight >= SATURATION_MIN_WEIGHT:
                load = self.level_loads[level] / weight
                peak = max(peak, load * self.level_sums[level] / weight)
                busiest = max(busiest, load)
        return peak, busiest

    def expected_rate(self, load: float) -> float | None:
        """Rate one request is expected to get at ``load`` requests in flight (None: unknown): the light-load
        rate up to the top of its load level, capped by ``slots x light-load rate / load`` (``peak / load``)
        once the deployment has been seen saturated, or carries slots. Before that, above the light-load
        level: the mean rate seen at ``load``'s own level (at most the light-load rate) when that level has
        samples enough, else None (a load never seen says nothing either way)."""
        rate, ceiling, slots, _ = self._derived
        if rate is None or ceiling is None or load <= 0 or self.samples < self.MIN_SAMPLES:
            return None
        if slots is None:
            if load <= ceiling:
                return rate
            # Busier than the light level and never seen saturated by the peak test: what this deployment
            # gave at about this load is the best guess. (The peak test alone misses a deployment whose
            # lightest samples were already slowed down, e.g. a 2-slot one first measured at 4 in flight:
            # its peak / light-load rate then stays near its busiest load.)
            seen = self._level_mean(_load_level(load, self.UNLOADED_LOAD, self.LEVELS))
            return None if seen is None else min(rate, seen)
        return min(rate, rate * slots / load)

    def slowdown(self, load: float) -> float:
        """How many times longer a request takes at ``load`` than at light load: ``light-load rate /
        expected_rate(load)``, at least 1; 1 when the fit does not know."""
        light = self._derived[0]
        expected = self.expected_rate(load)
        if light is None or expected is None or expected <= 0.0 or expected >= light:
            return 1.0
        return light / expected

    def _level_mean(self, level: int) -> float | None:
        """Recency-weighted mean rate of the samples at load level ``level`` (None: too little weight)."""
        weight = self.level_weights[level]
        return self.level_sums[level] / weight if weight > self.MIN_LEVEL_WEIGHT else None

    def _light(self) -> tuple[float | None, float | None]:
        """(light-load rate, top of its load level), or (None, None) without a level of enough weight."""
        for level in range(self.LEVELS):
            mean = self._level_mean(level)
            if mean is not None:
                return mean, self.UNLOADED_LOAD * 2.0**level
        return None, None

    def slots(self) -> float | None:
        """:meth:`_slots` as of the last sample (kept: it is read at every decision)."""
        return self._derived[2]

    def spread(self) -> float | None:
        """:meth:`_spread` as of the last sample."""
        return self._derived[3]

    def _slots(self, light: tuple[float | None, float | None]) -> float | None:
        """Requests the deployment serves at full speed, ``peak / light-load rate``, once it has been seen
        saturated (busier than that, and slower for it); else the carried slots while no load beyond them
        has been seen; else None: every load seen was served at about full speed (its capacity is then
        unknown, not small).

        Whether it is saturated is judged on the samples' own rates; how many slots it then has, on the
        load-stretched part of the latency (:meth:`_stretched_rates`) where the samples have sizes, if that
        says fewer. Not the other way round: taking the fixed part out of the latencies also magnifies their
        noise, and a saturation test on that alone called deployments with slots to spare saturated (stable
        and drift lost about 2 % of their mean rate in benchmark runs)."""
        rate = light[0]
        if self.samples < self.MIN_SAMPLES or rate is None or rate <= 0.0:
            return self.carried_slots
        peak, busiest = self._throughput()
        slots = peak / rate
        if slots < SATURATION_EVIDENCE * busiest:
            stretched = self._stretched_rates()
            if stretched is not None and stretched[0] > 0.0:
                slots = min(slots, stretched[0] / stretched[1])
            return slots
        # Not seen saturated in this regime: the slots carried over stand while it has not been seen busier.
        carried = self.carried_slots
        return carried if carried is not None and busiest < carried else None

    def _stretched_rates(self) -> tuple[float, float] | None:
        """(peak, light-load rate) as :meth:`_throughput` and :meth:`_light` give them, but
        from each level's pooled ``work / (latency - base latency)`` (its sized samples' sums, so one short
        answer with next to nothing above the base cannot swing it); None when the lightest level with
        weight enough has no sized samples. A level whose latencies are hardly above the base (a tenth or
        less) counts that tenth: the base is an estimate, and a pool with nothing left above it says little."""
        light_rate: float | None = None
        peak = 0.0
        for level in range(self.LEVELS):
            weight = self.level_weights[level]
            if weight <= self.MIN_LEVEL_WEIGHT:
                continue
            sized = self.level_sized[level]
            if sized <= self.MIN_LEVEL_WEIGHT:
                if light_rate is None:
                    return None
                continue
            latency = self.level_latencies[level]
            stretched = self.level_works[level] / max(latency - sized * self.base_latency, 0.1 * latency)
            if light_rate is None:
                light_rate = stretched
            if weight >= SATURATION_MIN_WEIGHT and sized >= SATURATION_MIN_WEIGHT:
                peak = max(peak, self.level_loads[level] / weight * stretched)
        if light_rate is None or light_rate <= 0.0:
            return None
        return peak, light_rate

    def _spread(self) -> float | None:
        """Root mean square distance of the samples from the prediction at their load (None: too few)."""
        if self.residual_weight < self.MIN_SAMPLES:
            return None
        return math.sqrt(self.residual_sq_sum / self.residual_weight)

    def shift(self, load: float, mean_rate: float) -> float:
        """``expected_rate(load) - mean_rate`` (0 when unknown): negative when the deployment is busier than
        its learnt slots, positive (up to its unloaded rate) when it has room and its window mixes in
        slower, loaded samples."""
        expected = self.expected_rate(load)
        if expected is None:
            return 0.0
        return expected - mean_rate


class SizeFit:
    """How a deployment's latency grows with the size of a request, from its successful samples.

    A request's **work** is what its effective rate divides by its latency: ``output + input / ratio`` tokens.
    The fit is the recency-weighted least-squares line ``latency = base + per_token * work`` (times are
    explicit, no clock; samples fade with ``half_life_seconds``). With it, one request's latency is judged
    against what a request of its own size takes there, not against the deployment's mean rate: a short
    answer pays the fixed part of the latency on few tokens, so its rate is low without anything being wrong,
    and the spread of the rates mixes that in. :meth:`spread` is the root mean square of
    ``log(latency / predicted)`` over the samples, each against the prediction made before it was added.
    """

    __slots__ = (
        "_line",
        "cross_sum",
        "last",
        "latency_sum",
        "residual_sq_sum",
        "residual_weight",
        "weight",
        "work_sq_sum",
        "work_sum",
    )

    MIN_SAMPLES: Final = 3
    """Samples (recency-weighted) before the fit predicts anything."""
    MIN_WORK_SPREAD: Final = 0.1
    """Relative spread of the works below which the line's slope is not trusted (the line then goes through
    the origin and the mean: latency proportional to work)."""

    def __init__(self) -> None:
        self.weight = 0.0
        self.work_sum = 0.0
        self.work_sq_sum = 0.0
        self.latency_sum = 0.0
        self.cross_sum = 0.0
        self.residual_sq_sum = 0.0
        self.residual_weight = 0.0
        self.last = float("-inf")
        self._line: tuple[float, float] | None = None
        """(base seconds, seconds per unit of work) as of the last sample."""

    def add(self, now: float, work: float, latency: float, half_life_seconds: float) -> None:
        """Add one successful request of ``work`` tokens that took ``latency`` seconds (ignored unless both
        are positive)."""
        if not (work > 0.0 and latency > 0.0):
            return
        if half_life_seconds > 0.0 and self.weight > 0.0 and now > self.last:
            factor = 0.5 ** ((now - self.last) / half_life_seconds)
            self.weight *= factor
            self.work_sum *= factor
            self.work_sq_sum *= factor
            self.latency_sum *= factor
            self.cross_sum *= factor
            self.residual_sq_sum *= factor
            self.residual_weight *= factor
        predicted = self.expected_latency(work)
        if predicted is not None:
            self.residual_sq_sum += math.log(latency / predicted) ** 2
            self.residual_weight += 1.0
        self.last = max(self.last, now)
        self.weight += 1.0
        self.work_sum += work
        self.work_sq_sum += work * work
        self.latency_sum += latency
        self.cross_sum += work * latency
        self._line = self._fit()

    def _fit(self) -> tuple[float, float] | None:
        weight = self.weight
        if weight < self.MIN_SAMPLES:
            return None
        mean_work = self.work_sum / weight
        mean_latency = self.latency_sum / weight
        variance = self.work_sq_sum / weight - mean_work * mean_work
        if variance > (self.MIN_WORK_SPREAD * mean_work) ** 2:
            slope = (self.cross_sum / weight - mean_work * mean_latency) / variance
            base = mean_latency - slope * mean_work
            if slope > 0.0 and base >= 0.0:
                return base, slope
        # Too little spread in size to tell a fixed part, or a line that would make some sizes free or
        # negative: latency proportional to work.
        return 0.0, mean_latency / mean_work

    def base_latency(self) -> float | None:
        """The fixed part of the latency, seconds (None: too few samples)."""
        line = self._line
        return None if line is None else line[0]

    def expected_latency(self, work: float) -> float | None:
        """Seconds a request of ``work`` tokens is expected to take (None: too few samples)."""
        line = self._line
        if line is None:
            return None
        return line[0] + line[1] * work

    def spread(self) -> float | None:
        """Root mean square of ``log(latency / predicted)`` (None: too few residuals yet)."""
        if self.residual_weight < self.MIN_SAMPLES:
            return None
        return math.sqrt(self.residual_sq_sum / self.residual_weight)
