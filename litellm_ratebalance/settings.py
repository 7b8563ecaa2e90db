"""One settings tree for everything the package reads from ``litellm_settings``.

Where the values come from (read lazily, on the first request, and validated once):

* ``litellm_settings.ratebalance: {...}``: our own settings (LiteLLM copies unknown ``litellm_settings``
  keys onto the ``litellm`` module, so this arrives as ``litellm.ratebalance``);
* ``litellm_settings.priority_reservation`` and ``priority_reservation_settings``: LiteLLM's own keys for
  its v3 limiter, read with LiteLLM's meaning so a config written for ``dynamic_rate_limiter_v3`` works
  unchanged;
* ``general_settings.token_rate_limit_type`` (``input`` | ``output`` | ``total``): which tokens count
  toward TPM, as in LiteLLM.

Every problem is reported at once, each as ``litellm_settings.<key path>: <what is wrong>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from litellm_ratebalance._config_base import SettingsModel, configuration_error, register
from litellm_ratebalance.attribution.config import CostSettings
from litellm_ratebalance.contracts.config import TrafficContractSettings
from litellm_ratebalance.errors import ConfigurationError, redact_url
from litellm_ratebalance.overload.config import BackpressureSettings
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.store.keys import validate_prefix

__all__ = [
    "LimiterSettings",
    "PriorityReservationSettings",
    "RateBalanceSettings",
    "ReservationSpec",
    "Settings",
    "check_redis_url",
    "load_settings",
    "parse_settings",
]

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class ReservationSpec(SettingsModel):
    """``{type: percent|rpm|tpm, value: n}``: LiteLLM's dict form of a reservation."""

    type: Literal["percent", "rpm", "tpm"] = "percent"
    value: Annotated[float, Field(ge=0.0, le=1e12)] = 1.0


class PriorityReservationSettings(SettingsModel):
    """LiteLLM's ``priority_reservation_settings``, same names, defaults and meaning."""

    default_priority: Fraction = 0.25
    saturation_threshold: Fraction = 0.50
    saturation_check_cache_ttl: Annotated[int, Field(ge=0, le=86400)] = 60
    """Accepted for compatibility and ignored: our saturation is computed live in the admission script."""


class LimiterSettings(SettingsModel):
    """``ratebalance.limiter``: the priority admission limiter."""

    window_seconds: Annotated[int, Field(ge=1, le=3600)] = 60
    output_estimate: Literal["learned", "max_tokens"] = "learned"
    """What a request reserves for its output before the call. ``learned``: the model group's learned
    output size (``default_output_tokens`` until the first answer is learned), at most the request's
    max_tokens; what answers use past their reservations is paid for from the next window.
    ``max_tokens``: the request's max_tokens (else ``default_output_tokens``), a strict cap that refuses
    what long max_tokens values leave unused."""
    output_estimate_quantile: Fraction | None = None
    """Unset: a request reserves the mean of the learned output sizes, so a window's corrections cancel out
    on average and its tokens add up to the limit. A fraction: that quantile of them instead. Above the
    mean (0.9, say) a window ends with room left idle, reserved for answers that came out shorter; below
    it (0.5 for the usual skewed lengths) every window outruns its reservations and the next one pays."""
    default_output_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 256
    """Output tokens reserved before anything is learned (``learned``), or for a request that sets neither
    max_tokens nor max_completion_tokens (``max_tokens``)."""
    max_reserved_output_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = 32_768
    """Upper bound on the output tokens one request reserves (a huge max_tokens is clamped to it)."""
    lendable: dict[str, Fraction] = Field(default_factory=dict)
    """Per priority: the fraction of its reservation other priorities may borrow (default 1.0)."""
    token_rate_limit_type: Literal["input", "output", "total"] | None = None
    """Overrides ``general_settings.token_rate_limit_type`` for this limiter."""
    capacity_refresh_seconds: Annotated[float, Field(ge=0.1, le=3600)] = 5.0
    """How long a model group's summed tpm/rpm is cached before it is re-read from the router."""


class RateBalanceSettings(SettingsModel):
    """``litellm_settings.ratebalance``."""

    key_prefix: str = "ratebalance"
    redis_url: str | None = None
    """Overrides the Redis discovered from the proxy: ``redis://[[user]:password@]host[:port][/db]``,
    ``rediss://...`` for TLS (options as query parameters, e.g. ``?ssl_cert_reqs=required&ssl_ca_certs=
    /path/ca.pem``), or ``unix:///path/redis.sock?db=N``. One server; use LiteLLM's Redis settings for a
    Cluster or Sentinel. An empty string means unset. Never logged with its credentials."""
    fail_mode: Literal["open", "closed", "local"] = "open"
    """On a store fault: ``open`` admits (one warning per interval, counted); ``closed`` answers 503;
    ``local``: the priority limiter decides against a store in this process's memory (a share of each limit,
    ``local_fallback_share``) until Redis answers again; the other components serve as with ``open``."""
    local_fallback_share: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """With ``fail_mode: local``: the fraction of each model group's rpm/tpm one replica admits on its own
    while the shared store fails. 1.0: each replica the whole limit (n replicas up to n x the limit, as
    LiteLLM's own limiter does); 1/n keeps the total of n replicas at the limit."""
    fault_log_interval_seconds: Annotated[float, Field(ge=0.0, le=3600)] = 30.0
    store_timeout_seconds: Annotated[float, Field(ge=0.01, le=30)] = 0.5
    """How long Redis may take to answer one store operation, counted while this process's event loop was free
    to read the answer (a loop stalled by a burst does not count), and at most max(60 x this, 30 s) of wall
    time; past it the operation counts as a store fault (docs/redis.md)."""
    redis_max_connections: Annotated[int, Field(ge=1, le=100_000)] = 500
    """Connection pool size of the client made for ``redis_url`` (a burst waits for a free connection)."""
    store_retry_after_seconds: Annotated[float, Field(ge=0.0, le=300)] = 1.0
    """After a fault of Redis (a timeout, a connection or script error; not a busy process), operations fail
    at once (per the fail mode) for this long before Redis is tried again, so a down Redis does not add its
    timeout to every request."""
    limiter: LimiterSettings = Field(default_factory=LimiterSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    traffic_contracts: TrafficContractSettings = Field(default_factory=TrafficContractSettings)
    backpressure: BackpressureSettings = Field(default_factory=BackpressureSettings)
    cost: CostSettings = Field(default_factory=CostSettings)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return check_redis_url(value)

    @field_validator("key_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            return validate_prefix(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None


@register
class Settings(SettingsModel):
    """Everything: ``litellm_settings`` keys as they appear in config.yaml."""

    ratebalance: RateBalanceSettings = Field(default_factory=RateBalanceSettings)
    priority_reservation: dict[str, float | ReservationSpec] = Field(default_factory=dict)
    priority_reservation_settings: PriorityReservationSettings = Field(default_factory=PriorityReservationSettings)
    token_rate_limit_type: Literal["input", "output", "total"] = "total"
    """From ``general_settings.token_rate_limit_type``."""

    @field_validator("priority_reservation")
    @classmethod
    def _reservations(cls, value: dict[str, float | ReservationSpec]) -> dict[str, float | ReservationSpec]:
        for name, spec in value.items():
            if not isinstance(name, str) or not name or len(name) > 256:
                raise ValueError(f"priority names must be non-empty strings of at most 256 characters, got {name!r}")
            if isinstance(spec, float) and not 0.0 <= spec <= 1.0:
                raise ValueError(f"{name}: a fraction must be between 0.0 and 1.0 (got {spec!r})")
            if isinstance(spec, ReservationSpec) and spec.type == "percent" and spec.value > 1.0:
                # LiteLLM takes {type: percent, value: 90} as a weight of 90, and normalising the weights
                # then leaves every other priority almost nothing: refuse it instead of guessing.
                raise ValueError(
                    f"{name}.value: a percent reservation is a fraction 0..1; did you mean "
                    f"{spec.value / 100:g}? (got {spec.value:g})"
                )
        return value

    @model_validator(mode="after")
    def _lendable_names_are_priorities(self) -> Settings:
        unknown = sorted(set(self.ratebalance.limiter.lendable) - set(self.priority_reservation))
        if unknown:
            raise ValueError(
                f"ratebalance.limiter.lendable: names priorities not in priority_reservation: {unknown}; "
                f"configured priorities: {sorted(self.priority_reservation)}"
            )
        return self

    @property
    def effective_token_type(self) -> Literal["input", "output", "total"]:
        return self.ratebalance.limiter.token_rate_limit_type or self.token_rate_limit_type

    def reservation_values(self) -> dict[str, float | Mapping[str, object]]:
        """Reservations in the form :func:`admission.policy.build_limits` takes."""
        return {
            name: spec if isinstance(spec, float) else {"type": spec.type, "value": spec.value}
            for name, spec in self.priority_reservation.items()
        }


REDIS_URL_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str) -> str:
    """Return ``url`` if redis-py can use it as one server's URL, else raise ValueError. The message shows
    the URL with its credentials masked."""
    from urllib.parse import parse_qs, urlsplit

    shown = redact_url(url)
    expected = "expected redis://[[user]:password@]host[:port][/db], rediss://... (TLS) or unix:///path"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a non-numeric port
    except ValueError:
        raise ValueError(f"not a valid URL ({expected}), got {shown!r}") from None
    if parts.scheme not in REDIS_URL_SCHEMES:
        raise ValueError(f"unsupported scheme {parts.scheme!r} ({expected}), got {shown!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"no host ({expected}), got {shown!r}")
    db_values = parse_qs(parts.query).get("db", [])
    path_db = parts.path.strip("/") if parts.scheme != "unix" else ""
    for db in [path_db, *db_values]:
        if db and not (db.isdigit() and int(db) <= 10_000):
            raise ValueError(
                f"the database number must be a non-negative integer ({expected}), got {db!r} in {shown!r}"
            )
    return url


def _plain(value: Any) -> Any:
    """LiteLLM may hand us pydantic objects (PriorityReservationSettings) or dicts; we want dicts."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump()
    return value


def parse_settings(raw: Mapping[str, Any]) -> Settings:
    """Validate a ``litellm_settings``-shaped mapping; raise ConfigurationError naming each key path."""
    data = {key: _plain(raw[key]) for key in Settings.model_fields if raw.get(key) is not None}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise configuration_error(exc, "litellm_settings") from None


def load_settings(general_setting: Callable[[str], Any] | None = None) -> Settings:
    """Read and validate our settings from the running LiteLLM: its module attributes, and through
    ``general_setting`` the proxy's ``general_settings`` (the runtime hands in LiteLLM's reader; an SDK process
    has no general settings)."""
    import litellm

    raw: dict[str, Any] = {
        "ratebalance": getattr(litellm, "ratebalance", None),
        "priority_reservation": getattr(litellm, "priority_reservation", None),
        "priority_reservation_settings": getattr(litellm, "priority_reservation_settings", None),
    }
    token_type = general_setting("token_rate_limit_type") if general_setting is not None else None
    if token_type is not None:
        raw["token_rate_limit_type"] = token_type
    return parse_settings(raw)
