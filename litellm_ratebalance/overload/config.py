"""Settings of the backpressure part (``litellm_settings.ratebalance.backpressure``).

Three layers, most specific last:

* these settings (process-wide defaults);
* ``ratebalance.backpressure.deployments.<deployment id>`` (a :class:`DeploymentOverrides`);
* ``model_list[].model_info.backpressure`` on the deployment itself (same keys as the previous one).

:meth:`BackpressureSettings.for_deployment` merges them into one frozen :class:`DeploymentConfig`, the only
form the rest of the part reads. A bad ``model_info.backpressure`` raises :class:`ConfigurationError`
naming ``model_info.backpressure.<key>`` and the deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from litellm_ratebalance._config_base import SettingsModel, configuration_error, register
from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.overload.servers import ServerSetting

__all__ = [
    "DEFAULT_TIER",
    "BackpressureSettings",
    "DeploymentConfig",
    "DeploymentOverrides",
    "LimitSettings",
    "QueueSettings",
    "SignalSettings",
]

DEFAULT_TIER = "default"
"""Tier name of requests whose caller has no configured priority (LiteLLM's shared default pool)."""

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Slots = Annotated[int, Field(ge=1, le=100_000)]


class LimitSettings(SettingsModel):
    """``backpressure.limit``: the adaptive concurrency limit of each deployment (see ``limits.py``)."""

    initial_limit: Slots = 8
    min_limit: Slots = 1
    max_limit: Slots = 256
    tolerance: Annotated[float, Field(ge=1.0, le=10.0)] = 1.1
    """How far the per-token latency may rise above its no-load baseline before the limit stops probing and
    shrinks: the limit settles near ``tolerance x`` the server's knee (the batch size past which its
    per-token latency climbs). The default favours latency; 1.3-1.5 trades latency for throughput on
    batch-only deployments."""
    smoothing: Annotated[float, Field(ge=0.01, le=1.0)] = 0.2
    """Weight of each new estimate in the limit (and of each sample in the short-term latency)."""
    growth: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    """Slots probed per turnover of the slots while latency stays within tolerance (per sample,
    ``smoothing x growth``, until the first back-off)."""
    backoff_ratio: Annotated[float, Field(ge=0.1, le=1.0)] = 0.9
    """Factor applied to the limit on a dropped request (server error, timeout, simulated OOM) and on a rise of
    the server's preemption counter (``signals.preemptions_as_drops``)."""
    drop_cooldown_seconds: Annotated[float, Field(ge=0.0, le=3600.0)] = 1.0
    """At most one backoff per this interval: a crash failing every in-flight request backs off once."""
    baseline_drift_per_minute: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    """How fast the no-load baseline may rise while the deployment is always loaded (fraction per minute)."""

    @model_validator(mode="after")
    def _ordered(self) -> LimitSettings:
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                "need min_limit <= initial_limit <= max_limit "
                f"(got {self.min_limit}, {self.initial_limit}, {self.max_limit})"
            )
        return self


class QueueSettings(SettingsModel):
    """``backpressure.queue``: wait instead of a 429 when a deployment is at its concurrency limit."""

    enabled: bool = False
    max_depth: Annotated[int, Field(ge=1, le=100_000)] = 100
    """Waiting requests per deployment and proxy process; the next one gets 503 queue_overflow."""
    max_wait_seconds: Annotated[float, Field(ge=0.01, le=600.0)] = 10.0
    """A request that waited this long gets 503 queue_overflow."""
    poll_interval_seconds: Annotated[float, Field(ge=0.001, le=5.0)] = 0.05
    """How often the head of the queue retries while slots are held by other replicas (local releases wake
    it at once)."""


class SignalSettings(SettingsModel):
    """``backpressure.signals``: the inference server's metrics endpoint and the local GPUs (NVML)."""

    scrape_interval_seconds: Annotated[float, Field(ge=0.05, le=300.0)] = 1.0
    scrape_timeout_seconds: Annotated[float, Field(ge=0.01, le=60.0)] = 0.5
    stale_after_seconds: Annotated[float, Field(ge=0.1, le=3600.0)] = 10.0
    """A scrape older than this is ignored (the deployment then runs on its other signals)."""
    nvml: bool = False
    """Read GPU memory (and, with ``gpu_utilization``, compute) through NVML: the proxy runs on the GPU host."""
    gpu_utilization: bool = False
    """Count NVML's GPU utilisation as a compute signal (off by default: it reads 100% whenever any kernel
    runs, so it says little about headroom on a busy inference server)."""
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] = Field(default_factory=lambda: [0])
    server_queue_limit: Annotated[int, Field(ge=1, le=1_000_000)] = 32
    """Requests waiting inside the inference server at which its queue signal reads 1.0."""
    preemptions_as_drops: bool = True
    """A rise of the server's preemption counter (vLLM ``vllm:num_preemptions_total``, SGLang
    ``sglang:num_retracted_requests_total``) between two scrapes counts as a dropped request: the adaptive
    limit backs off (``limit.backoff_ratio``, at most once per ``limit.drop_cooldown_seconds``). The server ran
    out of KV cache for the requests it runs and pushed some back to recompute them later."""

    @model_validator(mode="after")
    def _timeout_below_interval(self) -> SignalSettings:
        if self.scrape_timeout_seconds > self.scrape_interval_seconds:
            raise ValueError(
                "scrape_timeout_seconds must not exceed scrape_interval_seconds "
                f"(got {self.scrape_timeout_seconds} > {self.scrape_interval_seconds})"
            )
        return self


@register
class DeploymentOverrides(SettingsModel):
    """Per-deployment keys (``deployments.<id>`` or ``model_info.backpressure``); unset = the default."""

    enabled: bool | None = None
    metrics_url: str | None = None
    """The inference server's Prometheus endpoint, e.g. ``http://gpu1:8000/metrics``."""
    server: ServerSetting | None = None
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=10**10)
    """KV-cache capacity in tokens, overriding what the server exports (vLLM ``vllm:cache_config_info``, TGI 3
    ``tgi_batch_max_total_tokens``, SGLang ``sglang:max_total_num_tokens``). A capacity, set or exported,
    enables the token-aware check: the reservations of the requests in flight must fit under the threshold."""
    server_queue_limit: int | None = Field(default=None, ge=1, le=1_000_000)
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] | None = None
    initial_limit: int | None = Field(default=None, ge=1, le=100_000)
    min_limit: int | None = Field(default=None, ge=1, le=100_000)
    max_limit: int | None = Field(default=None, ge=1, le=100_000)
    queue_enabled: bool | None = None
    queue_max_depth: int | None = Field(default=None, ge=1, le=100_000)
    queue_max_wait_seconds: float | None = Field(default=None, ge=0.01, le=600.0)

    @field_validator("metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"metrics_url must be an http:// or https:// URL (got {value!r})")
        return value


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    """Everything one deployment's backpressure needs, defaults and overrides merged."""

    deployment_id: str
    enabled: bool
    """Managed by backpressure (see ``BackpressureSettings.all_deployments``)."""
    metrics_url: str | None
    server: ServerSetting
    kv_cache_tokens: int | None
    """The configured capacity (an override); the server's exported one is read at each scrape."""
    server_queue_limit: int
    gpu_indices: tuple[int, ...]
    initial_limit: int
    min_limit: int
    max_limit: int
    queue_enabled: bool
    queue_max_depth: int
    queue_max_wait_seconds: float


@register
class BackpressureSettings(SettingsModel):
    """``litellm_settings.ratebalance.backpressure``."""

    enabled: bool = True
    all_deployments: bool = False
    """Manage every deployment of the Router. Off: only those with a ``model_info.backpressure`` block or a
    ``deployments.<id>`` entry (a cloud provider's deployment beside your GPUs is left alone)."""
    tiers: list[str] = Field(default_factory=lambda: [DEFAULT_TIER])
    """Priority tiers, lowest first. Names are priorities as the limiter resolves them (team metadata, then
    key metadata); ``default`` stands for callers without a configured priority (if it is not listed, they
    join the lowest tier)."""
    shed_threshold: Fraction = 0.85
    """Utilisation at which the lowest tier is shed; the tiers above it follow in order."""
    hard_threshold: Fraction = 0.95
    """Utilisation at which the highest tier is shed too."""
    output_estimate: Literal["learned", "max_tokens"] = "learned"
    """Output a request reserves in the KV cache. ``learned``: the mean completion tokens of the deployment's
    answers (``default_output_tokens`` until 10 are learned), at most the request's max_tokens.
    ``max_tokens``: the request's max_tokens, else ``default_output_tokens``."""
    output_estimate_quantile: Fraction | None = None
    """Unset: reserve the mean learned answer. A fraction: that quantile of the learned answers instead (0.9
    reserves more per request, leaving part of the cache unused, for workloads with a few very long answers)."""
    top_reserve_quantile: Annotated[float, Field(ge=0.0, le=0.99)] = 0.5
    """Slots of each deployment that tiers below the highest leave free for the highest tier's own arrivals:
    the ``top_reserve_quantile`` quantile of the number of top-tier requests in flight, estimated by Little's
    law (the top tier's arrival rate x its mean time in service, per proxy replica; see
    ``overload/reserve.py``). The top tier's requests in flight count towards it. 0: off, only the one slot
    every lower tier leaves; higher values make top-tier waits behind lower tiers rarer and leave more slots
    idle while the top tier is quiet (bench/results/backpressure.md, 2026-12-06 second section)."""
    kv_headroom_requests: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    """KV-cache memory each tier below the highest leaves free for the tiers above it, in typical requests (the
    deployment's mean reservation): a lower-tier request is admitted only while the tokens held plus its own
    stay under ``hard_threshold`` x capacity less this much. Higher values keep the top tier's waits behind
    lower-tier requests rarer and serve fewer of them (bench/results/backpressure_top_tier_2026-12-07.md,
    *Longer runs*). 0: only the tier thresholds."""
    default_output_tokens: Annotated[int, Field(ge=0, le=10_000_000)] = 256
    """Output tokens reserved before anything is learned (``learned``), or by a request that sets neither
    max_tokens nor max_completion_tokens (``max_tokens``)."""
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=10**10)
    """Default KV-cache capacity in tokens for deployments that do not set their own; unset: what each server
    exports."""
    server: ServerSetting = "auto"
    """Default ``server`` of the deployments: ``auto`` reads whichever of vLLM, TGI and SGLang answers; a named
    one is checked against the server answering at each scrape (a mismatch is reported)."""
    lease_ttl_seconds: Annotated[float, Field(ge=1.0, le=3600.0)] = 30.0
    """In-flight slots are leases renewed by their replica; a crashed replica's slots free after this."""
    lease_max_age_seconds: Annotated[float, Field(ge=1.0, le=86_400.0)] = 1800.0
    """A lease whose request never reported back (lost event) stops being renewed after this long."""
    max_retry_after_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    """Largest retry-after we send; a wait estimated longer is advised as ``reroute``."""
    limit: LimitSettings = Field(default_factory=LimitSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    signals: SignalSettings = Field(default_factory=SignalSettings)
    deployments: dict[str, DeploymentOverrides] = Field(default_factory=dict)

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("list at least one tier (lowest priority first)")
        for name in value:
            if not name or len(name) > 256:
                raise ValueError(f"names must be 1 to 256 characters (got {name!r})")
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"each tier may appear once (repeated: {duplicates})")
        return value

    @model_validator(mode="after")
    def _thresholds(self) -> BackpressureSettings:
        if self.shed_threshold > self.hard_threshold:
            raise ValueError(
                f"shed_threshold must not exceed hard_threshold (got {self.shed_threshold} > {self.hard_threshold})"
            )
        return self

    def deployment_problems(
        self, deployment_id: str, model_group: str, model_info: Mapping[str, Any] | None = None
    ) -> list[str]:
        """What :meth:`for_deployment` refuses in one deployment's ``model_info.backpressure`` block (and its
        ``deployments.<id>`` override), one line per problem: ``deployment <id> (model_name <group>): <key>:
        <what is valid>``; empty when the deployment's settings are valid (the start-up check and
        ``check-config`` report them)."""
        try:
            self.for_deployment(deployment_id, model_info)
        except ConfigurationError as exc:
            where = f"deployment {deployment_id} (model_name {model_group})"
            # The error reads "invalid configuration:" then one "deployment '<id>': <key>: <text>" line per problem.
            prefix = f"deployment {deployment_id!r}: "
            return [f"{where}: {line.strip().removeprefix(prefix)}" for line in str(exc).splitlines()[1:]]
        return []

    def for_deployment(self, deployment_id: str, model_info: Mapping[str, Any] | None = None) -> DeploymentConfig:
        """Merge defaults, ``deployments.<id>`` and ``model_info.backpressure`` for one deployment."""
        overrides = [self.deployments.get(deployment_id)]
        raw = (model_info or {}).get("backpressure")
        if raw is not None:
            if isinstance(raw, DeploymentOverrides):
                overrides.append(raw)
            elif not isinstance(raw, Mapping):
                raise _deployment_error(deployment_id, f"must be a mapping (got {type(raw).__name__})")
            else:
                try:
                    overrides.append(DeploymentOverrides.model_validate(dict(raw)))
                except ValidationError as exc:
                    raise configuration_error(exc, f"deployment {deployment_id!r}: model_info.backpressure") from None
        configured = any(layer is not None for layer in overrides)
        merged: dict[str, Any] = {}
        for layer in overrides:
            if layer is not None:
                merged.update(layer.model_dump(exclude_none=True))
        limit = self.limit
        config = DeploymentConfig(
            deployment_id=deployment_id,
            enabled=merged.get("enabled", self.enabled and (configured or self.all_deployments)),
            metrics_url=merged.get("metrics_url"),
            server=merged.get("server", self.server),
            kv_cache_tokens=merged.get("kv_cache_tokens", self.kv_cache_tokens),
            server_queue_limit=merged.get("server_queue_limit", self.signals.server_queue_limit),
            gpu_indices=tuple(merged.get("gpu_indices", self.signals.gpu_indices)),
            initial_limit=merged.get("initial_limit", limit.initial_limit),
            min_limit=merged.get("min_limit", limit.min_limit),
            max_limit=merged.get("max_limit", limit.max_limit),
            queue_enabled=merged.get("queue_enabled", self.queue.enabled),
            queue_max_depth=merged.get("queue_max_depth", self.queue.max_depth),
            queue_max_wait_seconds=merged.get("queue_max_wait_seconds", self.queue.max_wait_seconds),
        )
        if not config.min_limit <= config.initial_limit <= config.max_limit:
            raise _deployment_error(
                deployment_id,
                "need min_limit <= initial_limit <= max_limit after overrides "
                f"(got {config.min_limit}, {config.initial_limit}, {config.max_limit})",
            )
        return config


def _deployment_error(deployment_id: str, message: str) -> ConfigurationError:
    return ConfigurationError(
        f"invalid configuration:\n  deployment {deployment_id!r}: model_info.backpressure: {message}"
    )
