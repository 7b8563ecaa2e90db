"""Settings of the routing part (``litellm_settings.ratebalance.routing``).

``preset: plain`` (:data:`PRESETS`) turns every addition to the plain rate-balancing algorithm off in one
line, leaving a sliding window, a pooled SLA percentile, a normal fit and an independent weighted draw. The
keys the preset sets cannot be given beside it; the algorithm's own knobs (``window_seconds``, ``greediness``,
``input_to_output_ratio``) and the sync's (``refresh_interval``, ``bucket_seconds``) can. ``preset:
proposal``, its former name, still works and warns (:data:`DEPRECATED_PRESETS`).

Three settings also come from environment variables when the config does not set them
(the config wins): ``RB_LLM_CLIENT_SLIDING_WINDOW_SIZE`` (``window_seconds``),
``RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO`` (``input_to_output_ratio``) and
``RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR`` (``greediness``).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from litellm_ratebalance._config_base import SettingsModel

__all__ = ["DEPRECATED_PRESETS", "ENVIRONMENT_VARIABLES", "PRESETS", "RoutingSettings"]

Ratio = Annotated[float, Field(gt=0.0, le=1e9)]

ENVIRONMENT_VARIABLES: dict[str, str] = {
    "window_seconds": "RB_LLM_CLIENT_SLIDING_WINDOW_SIZE",
    "input_to_output_ratio": "RB_LLM_CLIENT_INPUT_TO_OUTPUT_TOKEN_RATIO",
    "greediness": "RB_LLM_CLIENT_RATE_GREEDINESS_FACTOR",
}
"""Setting name -> the environment variable read when the config leaves the setting out (the names the
algorithm's first published description used)."""

PRESETS: dict[str, dict[str, Any]] = {
    "plain": {
        "estimator": "normal",
        "prior_samples": 0.0,
        "exploration_share": 0.0,
        "failure_penalty": 0.0,
        "rate_limit_headroom": 0.0,
        "stall_latency_factor": 0.0,
        "sample_half_life_seconds": 0.0,
        "in_flight_evidence": False,
        "end_pick_on_answer": False,
        "load_aware": False,
        "change_detection_sigma": 0.0,
        "adaptive_window": False,
        "selection": "random",
        "remeasure": False,
    },
}
"""Preset name -> the settings it fixes. ``plain``: the rate-balancing algorithm with none of the additions
(no exploration, failure penalty, rate-limit scaling, stall or overdue evidence, load fit, change detection,
recency weighting or re-measuring; an independent weighted draw per decision)."""

DEPRECATED_PRESETS: dict[str, str] = {"proposal": "plain"}
"""Former preset name -> its current name: still accepted, with a ``FutureWarning``."""

_MAX_BUCKETS = 1200
_WINDOW_LIMIT = 86_400


class RoutingSettings(SettingsModel):
    """How the rate balancer measures deployments and turns the measurements into choice weights."""

    preset: Literal["plain"] | None = None
    """A named set of the settings below (:data:`PRESETS`): ``plain``, the rate-balancing algorithm without
    the additions. The settings it fixes may not be given beside it. (``proposal``, its former name, is read
    as ``plain`` with a warning.)"""
    window_seconds: Annotated[int, Field(ge=0, le=_WINDOW_LIMIT)] = 120
    """Sliding window of samples. 0: no statistics at all, every choice is uniform (unordered round robin)."""
    bucket_seconds: Annotated[int, Field(ge=1, le=3600)] | None = None
    """Width of the time buckets the window is kept in (a sample leaves the window between
    ``window_seconds`` and ``window_seconds + bucket_seconds`` after it was stored). Default: 1 s per 60 s
    of window (2 s for the default window)."""
    input_to_output_ratio: Ratio = 250.0
    """How many input tokens count as one output token in the effective rate."""
    input_to_output_ratio_by_model_group: dict[str, Ratio] = Field(default_factory=dict)
    """Per model group overrides; a deployment's ``model_info.input_to_output_ratio`` wins over both."""
    greediness: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    """Percentile of the pooled samples that a deployment must beat (the SLA). 0: uniform choice."""
    estimator: Literal["normal", "empirical"] = "normal"
    """``normal``: probability from a normal fit of the deployment's rates (the plain algorithm); ``empirical``:
    the share of its own samples above the SLA."""
    prior_samples: Annotated[float, Field(ge=0.0, le=1000.0)] = 0.0
    """Weight, in samples, of a neutral prior in each deployment's probability (``1 - greediness``): a
    deployment with few samples in the window keeps a fair chance, so a quiet one that got faster is
    found. 0: the plain estimate."""
    refresh_interval: Annotated[float, Field(ge=0.01, le=300.0)] = 1.0
    """Seconds between synchronisations of the local view with the shared store (writes and reads)."""
    exploration_share: Annotated[float, Field(ge=0.0, le=0.5)] = 0.05
    """Part of the traffic spread evenly over all candidates whatever their estimates, so a deployment
    that looked bad is tried again and its recovery seen. It is all a deployment gets once its samples have
    aged out of the window (stale: measured before, nothing recent); at 0 such a deployment starts the
    bootstrap instead (equal chances until it has answered), as nothing else would measure it again."""
    failure_window_seconds: Annotated[int, Field(ge=1, le=3600)] = 10
    """Recent window in which the failure share of a deployment is measured."""
    failure_half_life_seconds: Annotated[float, Field(ge=0.0, le=3600.0)] = 2.0
    """Inside the failure window, a bucket's attempts and failures count ``0.5 ** (age / half-life)``, so
    fresh failures dominate; 0 weighs the whole failure window equally."""
    failure_penalty: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    """Weight multiplier ``(1 - recent failure share) ** failure_penalty``; 0 disables it. Failures are also
    zero-rate samples in the window either way. At 1 the weight is the chance of beating the SLA times the
    recent success share: a deployment that fails every request drops to nothing within seconds, one that
    fails a quarter of them fast keeps three quarters of its weight (higher values cost it more than its
    failures cost the traffic sent there, in the routing benchmark). Four failures in a row at a replica, with no
    successful answer between, take the deployment out there until it answers again (not at 0)."""
    rate_limit_headroom: Annotated[float, Field(ge=0.0, le=1.0)] = 0.2
    """Below this fraction of a rate limit left (provider headers, or configured tpm/rpm against the last
    minute's usage) a deployment's share is scaled down linearly, to 0 at exhaustion. 0 disables it."""
    rate_limit_header_max_age_seconds: Annotated[float, Field(ge=1.0, le=3600.0)] = 60.0
    """A deployment's latest ``x-ratelimit-*`` headers are trusted this long (or until their reset time)."""
    stall_latency_factor: Annotated[float, Field(ge=0.0, le=1000.0)] = 2.0
    """A request in flight longer than this many times the deployment's mean latency (and at least
    ``stall_min_seconds``) counts as a recent failure until it finishes. When no answer has come back from
    the deployment here for that long with such a request out (or for its mean latency with 3 requests
    overdue), it has stalled as a whole: all its recent attempts count as failed until it answers again.
    0 disables stall detection."""
    stall_min_seconds: Annotated[float, Field(ge=0.1, le=3600.0)] = 5.0
    sample_half_life_seconds: Annotated[float, Field(ge=0.0, le=_WINDOW_LIMIT)] | None = None
    """Recency weighting inside the window: a bucket's samples count ``0.5 ** (age / half-life)`` in the
    estimates and in the pooled SLA, so a deployment whose rate changed is judged mostly on its new
    samples instead of waiting for the old ones to leave the window. Default: ``window_seconds / 4``
    (30 s for the default window); 0: every sample in the window counts fully (the plain algorithm)."""
    in_flight_evidence: bool = True
    """A request in flight longer than it was expected to take (what a request of its size takes there,
    when it sets ``max_tokens``; else its deployment's mean latency) counts, until it finishes, as a sample
    of rate ``mean rate / lateness`` (an upper bound of its rate): a slowed-down or stalled deployment loses
    share before its slow answers arrive, and a deployment whose first requests are still running counts
    as having samples (bootstrap ends sooner). Also turns on the fit of latency against request size that
    change detection judges answers by."""
    end_pick_on_answer: bool = False
    """End a request's count in flight when its answer is back (LiteLLM's
    ``async_post_call_success_deployment_hook``), not when LiteLLM logs the success, which it does in the
    background and often after the caller's next request was routed. Exact for callers sending one request
    at a time (least_loaded otherwise sees the previous request still in flight at every pick). Off by
    default: in the routing benchmark's contended scenario it cost 1.5 tok/s (seeds 1-6), for reasons not
    pinned down."""
    load_aware: bool = True
    """Fit how each deployment's rate depends on its load (this replica's requests in flight,
    :class:`~litellm_ratebalance.routing.fits.LoadFit`): once its answers show it saturated (judged per token,
    so answers of mixed sizes neither hide nor fake it), learn its slots, correct its estimate at the current
    load and shrink its share as this replica's requests in flight fill them."""
    presume_slots: bool = False
    """With ``load_aware``: while a deployment's slots are neither configured (``model_info.slots``) nor learnt,
    presume it has a few (2), or twice the most requests it has been seen to serve at once at full speed,
    and shrink its share as this replica's requests in flight fill them (slow start). Off by default: it
    holds back a deployment that just became the fastest, and the load fit finds few slots within a few
    answers beyond them. False: unknown slots count as unlimited."""
    change_detection_sigma: Annotated[float, Field(ge=0.0, le=100.0)] = 3.0
    """A deployment whose new sample (or oldest request in flight, as a rate bound) is this many standard
    deviations (at least 10 % of the mean) away from its recency-weighted window has changed: its older
    samples are dropped and every other deployment gets one request to be re-measured. At most once per
    half-life per deployment. 0 disables it."""
    adaptive_window: bool = False
    """Use, per deployment, only its newest buckets that hold ``adaptive_min_samples`` samples (at most
    ``window_seconds``): busy deployments are judged on recent samples, quiet ones keep their history."""
    adaptive_min_samples: Annotated[int, Field(ge=2, le=1_000_000)] = 30
    remeasure: bool = True
    """Send single re-measuring requests: one to every deployment after another one's change was detected,
    one per window to a deployment known from a single answer, one per ``failure_half_life_seconds`` to a
    deployment whose recent attempts mostly failed (only requests of at most the typical size go). False:
    only exploration measures such deployments again (the plain algorithm)."""
    selection: Literal["random", "smooth", "least_loaded"] = "least_loaded"
    """How a pick follows the shares. ``random``: an independent weighted draw per decision (the plain algorithm).
    ``smooth``: smooth weighted round robin per model group and replica (each candidate gains its share at
    every decision, the one with the most credit is picked and pays one decision's worth), so every
    deployment gets its share over any run of decisions without random bursts; in bootstrap it sends each
    unmeasured candidate one request and the rest to the others. Not the default: it did not beat ``random``
    in the routing benchmark. ``least_loaded`` (the default): weighted least connections, the candidate
    with the fewest requests in flight here for its share (without the exploration part),
    ``(in flight + 1) / share``, ties drawn at random; a failure counts as in flight for the rest of a typical
    latency, so a deployment that fails at once does not look idle; the ``exploration_share`` of decisions
    is a uniform draw (when requests carry ``max_tokens``, drawn among those of at most the typical size,
    twice as often: the same share of decisions, and no long answer sent just to measure a slow
    deployment). A deployment whose requests pile up (slow, stalled, at its capacity) is passed over at
    once. With nothing in flight here at any candidate, the one with a share whose samples promise the
    highest mean rate is picked (greedy when idle)."""

    @model_validator(mode="before")
    @classmethod
    def _environment_fallbacks(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        merged = _with_preset(data)
        for name, variable in ENVIRONMENT_VARIABLES.items():
            raw = os.environ.get(variable)
            if name in merged or raw is None or not raw.strip():
                continue
            merged[name] = _from_environment(name, variable, raw)
        return merged

    @model_validator(mode="after")
    def _consistent(self) -> RoutingSettings:
        # Buckets are kept for the longest of the windows read from them (usage for tpm/rpm: one minute).
        kept = max(self.window_seconds, self.failure_window_seconds, 60)
        if self.window_seconds and kept / self.effective_bucket_seconds > _MAX_BUCKETS:
            raise ValueError(
                f"max(window_seconds, failure_window_seconds, 60) / bucket_seconds must be at most {_MAX_BUCKETS} "
                f"(got {kept} / {self.effective_bucket_seconds}); raise bucket_seconds"
            )
        if self.greediness < 0.2:
            warnings.warn(
                f"ratebalance.routing.greediness is very low ({self.greediness} < 0.2): every deployment is "
                "likely to beat the SLA, so the rate balancer behaves as unordered round robin",
                UserWarning,
                stacklevel=2,
            )
        elif self.greediness > 0.95:
            warnings.warn(
                f"ratebalance.routing.greediness is very high ({self.greediness} > 0.95): only the deployment "
                "that reached the highest rates is likely to beat the SLA, so routing can stick to a local "
                "maximum for a whole window",
                UserWarning,
                stacklevel=2,
            )
        return self

    @property
    def effective_bucket_seconds(self) -> int:
        """``bucket_seconds``, or its default: 1 s per 60 s of window (at least 1)."""
        if self.bucket_seconds is not None:
            return self.bucket_seconds
        return max(1, self.window_seconds // 60)

    @property
    def effective_sample_half_life(self) -> float:
        """``sample_half_life_seconds``, or its default ``window_seconds / 4``; 0 means no recency weighting."""
        if self.sample_half_life_seconds is not None:
            return self.sample_half_life_seconds
        return self.window_seconds / 4.0

    @property
    def round_robin(self) -> bool:
        """True when the settings ask for uniform choice (window 0 or greediness 0)."""
        return self.window_seconds == 0 or self.greediness == 0.0

    def ratio_for(self, model_group: str, deployment_ratio: float | None = None) -> float:
        """Input-to-output ratio: the deployment's own, else the model group's override, else the default."""
        if deployment_ratio is not None and deployment_ratio > 0:
            return deployment_ratio
        return self.input_to_output_ratio_by_model_group.get(model_group, self.input_to_output_ratio)


def _with_preset(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the settings of its ``preset`` filled in; a setting the preset fixes, given beside it, is
    an error (an unknown preset name is left to the field's own check)."""
    name = data.get("preset")
    if isinstance(name, str) and name in DEPRECATED_PRESETS:
        current = DEPRECATED_PRESETS[name]
        warnings.warn(
            f"ratebalance.routing.preset: {name!r} is deprecated, use {current!r} (the same settings)",
            FutureWarning,
            stacklevel=2,
        )
        data, name = {**data, "preset": current}, current
    fixed = PRESETS.get(name) if isinstance(name, str) else None
    if fixed is None:
        return dict(data)
    clashes = sorted(key for key in data if key in fixed)
    if clashes:
        raise ValueError(
            f"preset {name!r} sets {', '.join(clashes)}: leave {'it' if len(clashes) == 1 else 'them'} "
            "out, or drop the preset and set every setting yourself"
        )
    return {**fixed, **data}


def _from_environment(name: str, variable: str, raw: str) -> float | int:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {variable}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"environment variable {variable}={raw!r} is not a finite number")
    if name == "window_seconds":
        if value != int(value) or not 0 <= value <= _WINDOW_LIMIT:
            raise ValueError(
                f"environment variable {variable}={raw!r}: must be a whole number of seconds between 0 and "
                f"{_WINDOW_LIMIT}"
            )
        return int(value)
    if name == "greediness" and not 0.0 <= value <= 1.0:
        raise ValueError(f"environment variable {variable}={raw!r}: must be between 0 and 1")
    if name == "input_to_output_ratio" and not value > 0:
        raise ValueError(f"environment variable {variable}={raw!r}: must be greater than 0")
    return value
