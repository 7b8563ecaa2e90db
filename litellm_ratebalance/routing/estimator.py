"""Pure rate-balancing estimator: window aggregates -> pooled SLA percentile -> weights.

Nothing here does I/O or reads a clock. The aggregates it reads are
:class:`~litellm_ratebalance.routing.records.RateAggregate`; :mod:`~litellm_ratebalance.routing.shares` turns
a model group's view into :class:`DeploymentState` values and calls :func:`compute_shares` when it needs the
shares of a set of candidate deployments.

Definitions (the proposal's meaning, with our additions marked *):

* **effective rate** of one finished request = ``(output_tokens + input_tokens / ratio) / latency`` in
  tokens per second, ``ratio`` the input-to-output token ratio (250 by default). *A failed request (error,
  timeout, 429, stall) is a sample with rate 0.
* *A deployment's window is summarised by a :class:`RateAggregate`: count, failures, sum and sum of
  squares of the rates, latency, tokens, time-to-first-token, and a fixed log-spaced histogram of rates
  (:mod:`~litellm_ratebalance.routing.records`). Aggregates add, so time buckets
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
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal, NamedTuple

from litellm_ratebalance.routing.records import RateAggregate, bin_bounds, bin_index

__all__ = [
    "MIN_LATENCY_SECONDS",
    "DeploymentState",
    "EstimatorName",
    "Shares",
    "compute_shares",
    "effective_rate",
    "failure_multiplier",
    "headroom_multiplier",
    "pooled_percentile",
    "probability_above",
    "recency_weight",
    "reweigh",
    "weigh",
]

EstimatorName = Literal["normal", "empirical"]

MIN_LATENCY_SECONDS = 1e-3
"""Latencies below this are clamped (a zero latency would make the rate infinite)."""


def effective_rate(output_tokens: float, input_tokens: float, latency_seconds: float, ratio: float) -> float:
    """Tokens per second of one finished request: ``(output + input / ratio) / latency``."""
    return (output_tokens + input_tokens / ratio) / max(latency_seconds, MIN_LATENCY_SECONDS)


_SQRT2: Final = math.sqrt(2.0)


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
) -> float:
    """Estimated probability that a request to this deployment beats rate ``sla`` >= 0 (0 with no samples).

    A failure is a sample of rate 0, which never beats the SLA. ``normal``: the share of successful samples
    times the probability from a normal fit of their rates (the proposal's fit, of the answers only);
    ``empirical``: the share of all samples above the SLA.

    ``shift`` moves the deployment's rate distribution (tokens/s; the load correction, see
    :class:`~litellm_ratebalance.routing.fits.LoadFit`): the normal fit's mean moves by it, the empirical
    estimator compares its samples with ``sla - shift``.
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
    std = ok_std
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
    were taken at (:meth:`~litellm_ratebalance.routing.fits.LoadFit.shift`); 0 without load awareness."""
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
    p = probability_above(state.window, sla, estimator, state.load_shift)
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


def recency_weight(age_seconds: float, half_life_seconds: float) -> float:
    """``0.5 ** (age / half-life)``: how much a sample of that age counts; 1 when the half-life is 0 (off)."""
    if half_life_seconds <= 0.0:
        return 1.0
    return float(0.5 ** (max(age_seconds, 0.0) / half_life_seconds))
