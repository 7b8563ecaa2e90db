"""Settings of the contracts part (``litellm_settings.ratebalance.traffic_contracts``).

Example (``config.yaml``)::

    litellm_settings:
      callbacks: ["litellm_ratebalance.traffic_contracts"]
      ratebalance:
        traffic_contracts:
          window_seconds: 60
          counter_ttl_seconds: 120
          basket: {rpm: 4, tpm: 10000}
          features:
            smart-window: {rpm: 2, tpm: 5000, aliases: [ai, memories]}
            s2s: {rpm: 10, tpm: 20000}
          enforcement:
            borrowed: allow
            degraded: {cap_max_tokens: 256}

Everything is validated when the settings are loaded; each problem names its key path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from litellm_ratebalance._config_base import SettingsModel

__all__ = [
    "BASKET_FIELD",
    "RESERVED_NAMES",
    "UNASSIGNED",
    "ActionSettings",
    "BasketContract",
    "EnforcementSettings",
    "FeatureContract",
    "TrafficContractSettings",
]

BASKET_FIELD = "__basket__"
"""Counter field of the whole basket; no feature or alias may be called this."""

UNASSIGNED = "unassigned"
"""Feature of a request that names no configured feature (it still counts toward the basket)."""

RESERVED_NAMES = frozenset({BASKET_FIELD})
MAX_FEATURE_NAME_LENGTH = 128

MAX_RPM = 1_000_000_000
MAX_TPM = 1_000_000_000_000
DelaySeconds = Annotated[float, Field(ge=0.0, le=30.0)]


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_FEATURE_NAME_LENGTH:
        raise ValueError(f"{what} {name[:20]!r}... is longer than {MAX_FEATURE_NAME_LENGTH} characters")
    if name in RESERVED_NAMES:
        raise ValueError(f"{what} may not be {name!r} (reserved for the basket counter)")
    return name


class FeatureContract(SettingsModel):
    """One feature's contract per window; ``None`` = no per-feature contract of that kind."""

    rpm: int | None = Field(default=None, ge=0, le=MAX_RPM)
    tpm: int | None = Field(default=None, ge=0, le=MAX_TPM)
    aliases: tuple[str, ...] = ()
    """Other names (request tags, metadata values) counted as this feature."""

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        seen: set[str] = set()
        for alias in value:
            _check_name(alias, "an alias")
            if alias == UNASSIGNED:
                raise ValueError(f"an alias may not be {UNASSIGNED!r} (the name of requests with no feature)")
            if alias in seen:
                raise ValueError(f"alias {alias!r} is listed twice")
            seen.add(alias)
        return value


class BasketContract(SettingsModel):
    """The contract of all traffic together (every feature, ``unassigned`` included)."""

    rpm: int | None = Field(default=None, ge=0, le=MAX_RPM)
    tpm: int | None = Field(default=None, ge=0, le=MAX_TPM)


class ActionSettings(SettingsModel):
    """What to do with a request in a mode. Written in config as one of::

    allow                               serve it unchanged (observe only)
    reject                              429 naming the feature, the contract and the mode
    {cap_max_tokens: N}                 serve it with max_tokens lowered to at most N
    delay                               wait 0.1..1.0 s (uniformly jittered), then serve it
    {delay: {min_seconds: a, max_seconds: b}}   the same with explicit bounds (at most 30 s)
    """

    kind: Literal["allow", "reject", "cap_max_tokens", "delay"] = "allow"
    cap_max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    min_seconds: DelaySeconds = 0.1
    max_seconds: DelaySeconds = 1.0

    @model_validator(mode="before")
    @classmethod
    def _from_config_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in ("allow", "reject", "delay"):
                raise ValueError(
                    f"must be allow, reject, delay, {{cap_max_tokens: N}} or {{delay: {{...}}}}, got {value!r}"
                )
            return {"kind": value}
        if isinstance(value, dict) and value and "kind" not in value:
            if set(value) == {"cap_max_tokens"}:
                return {"kind": "cap_max_tokens", "cap_max_tokens": value["cap_max_tokens"]}
            if set(value) == {"delay"}:
                spec = value["delay"]
                if spec is None:
                    return {"kind": "delay"}
                if not isinstance(spec, dict):
                    raise ValueError(f"delay takes {{min_seconds, max_seconds}}, got {spec!r}")
                unknown = sorted(set(spec) - {"min_seconds", "max_seconds"})
                if unknown:
                    raise ValueError(f"delay takes min_seconds and max_seconds, got unknown {unknown}")
                return {"kind": "delay", **spec}
            if set(value) <= {"min_seconds", "max_seconds"}:
                raise ValueError(
                    "min_seconds and max_seconds go under delay: write {delay: {min_seconds: A, max_seconds: B}}"
                    f" (A <= B, 0..30), got {value!r}"
                )
            raise ValueError(
                f"must be allow, reject, delay, {{cap_max_tokens: N}} or {{delay: {{...}}}}, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ActionSettings:
        if self.kind == "cap_max_tokens" and self.cap_max_tokens is None:
            raise ValueError("cap_max_tokens needs a number of tokens")
        if self.min_seconds > self.max_seconds:
            raise ValueError(f"delay min_seconds ({self.min_seconds}) must not exceed max_seconds ({self.max_seconds})")
        return self


class EnforcementSettings(SettingsModel):
    """The action per mode. ``normal`` requests are always served; both defaults observe only."""

    borrowed: ActionSettings = Field(default_factory=ActionSettings)
    degraded: ActionSettings = Field(default_factory=ActionSettings)


class TrafficContractSettings(SettingsModel):
    """``ratebalance.traffic_contracts``: per-feature and basket RPM/TPM per fixed window."""

    window_seconds: Annotated[int, Field(ge=1, le=3600)] = 60
    """Length of the fixed windows (aligned to the epoch: a 60 s window starts on the minute)."""
    counter_ttl_seconds: Annotated[int, Field(ge=2, le=86_400)] = 120
    """Lifetime of a window's counters, counted from the window start; must exceed ``window_seconds``."""
    basket: BasketContract = Field(default_factory=BasketContract)
    features: dict[str, FeatureContract] = Field(default_factory=dict)
    enforcement: EnforcementSettings = Field(default_factory=EnforcementSettings)
    trust_request_feature: bool = False
    """May the request body (``metadata.feature``, request tags) name the feature? Off by default: a
    client could otherwise move its traffic onto another feature's contract. Only configured features
    and aliases ever count, whatever this says."""
    fail_open: bool = True
    """On a store (Redis) fault: serve the request (modes ``unknown``, logged, counted); ``false``: 503."""
    default_output_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 256
    """Output tokens estimated for a request that sets no max_tokens (TPM check before the call)."""
    max_estimated_output_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = 4096
    """Upper bound on the output tokens estimated for one request (a huge max_tokens is clamped)."""

    @field_validator("counter_ttl_seconds")
    @classmethod
    def _ttl_exceeds_window(cls, value: int, info: ValidationInfo) -> int:
        window = info.data.get("window_seconds")
        if isinstance(window, int) and value <= window:
            raise ValueError(
                f"must be greater than window_seconds ({window}), or counters would vanish before their window ends"
            )
        return value

    @field_validator("features")
    @classmethod
    def _feature_names_and_aliases(cls, value: dict[str, FeatureContract]) -> dict[str, FeatureContract]:
        owner: dict[str, str] = {}
        for name in value:
            _check_name(name, "a feature name")
        for name, contract in value.items():
            for alias in contract.aliases:
                if alias in value:
                    raise ValueError(f"{name}.aliases: {alias!r} is itself a configured feature")
                if alias in owner:
                    raise ValueError(f"{name}.aliases: {alias!r} is already an alias of feature {owner[alias]!r}")
                owner[alias] = name
        return value
