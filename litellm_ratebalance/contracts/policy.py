"""Pure traffic-contract policy: feature resolution, modes, enforcement actions, the window ledger.

Nothing here does I/O or reads a clock: callers pass times (milliseconds since the epoch), counts and
limits. ``store/lua/contract_admit.lua`` and ``contract_settle.lua`` implement
:meth:`ContractLedger.admit` / :meth:`ContractLedger.settle_many` step for step; the embedded store runs the
ledger itself, and the shared behavioural suite checks both agree.

Definitions:

* A **feature** is a configured name (``features:`` key). Aliases map other names onto it. A request
  that names no configured feature or alias is ``unassigned``; it has no feature contract (unless a
  feature called ``unassigned`` is configured) but counts toward the basket. Unknown names never
  create counters.
* **Windows** are fixed and epoch-aligned: ``start = floor(now_s / window) * window``. Each window has
  its own counters; nothing carries over.
* **Mode**, decided separately for RPM (the request costs 1) and TPM (it costs its token estimate),
  counting the request itself:

  - ``degraded``: the basket would be over its contract;
  - ``borrowed``: the basket has room but the feature would be over its own contract;
  - ``normal``: both within contract (a missing contract is never exceeded).

  TPM usage is the tokens recorded by finished requests plus the estimates of requests in flight.
  *Oversize rule* (as the admission policy): a request never has to fit more room than the limit
  itself, so one request bigger than a whole contract is ``normal`` in an empty window.
* A request's **worst mode** (the worse of its RPM and TPM modes) selects the enforcement action.
  A request whose action is ``reject`` is not counted at all: refused traffic must not use up the
  basket for others.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from litellm_ratebalance.contracts.config import (
    BASKET_FIELD,
    UNASSIGNED,
    ActionSettings,
    TrafficContractSettings,
)

__all__ = [
    "BASKET_FIELD",
    "UNASSIGNED",
    "Action",
    "ContractAdmission",
    "ContractBook",
    "ContractLedger",
    "ContractLimits",
    "ContractSettlement",
    "ContractSettlements",
    "ContractWindow",
    "FeatureResolution",
    "Mode",
    "action_for",
    "capped_max_tokens",
    "classify",
    "delay_seconds",
    "in_flight_field",
    "rejection_message",
    "resolve_feature",
    "seconds_to_window_end",
    "window_start",
    "worst_mode",
]

FeatureSource = Literal["request", "key", "team", "tag", "none"]


class Mode(IntEnum):
    """A request's standing against its contracts; the integer is what the Lua script returns."""

    NORMAL = 0
    BORROWED = 1
    DEGRADED = 2

    @property
    def label(self) -> str:
        """``normal`` / ``borrowed`` / ``degraded``: the value in headers, metrics and log metadata."""
        return self.name.lower()


# -- the contract book -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContractLimits:
    """The limits one request is classified against; ``None`` = no contract of that kind."""

    feature_rpm: int | None = None
    feature_tpm: int | None = None
    basket_rpm: int | None = None
    basket_tpm: int | None = None

    @property
    def has_tpm(self) -> bool:
        return self.feature_tpm is not None or self.basket_tpm is not None


@dataclass(frozen=True, slots=True)
class ContractBook:
    """Configured features, aliases and limits, in the form the policy uses."""

    features: Mapping[str, tuple[int | None, int | None]]
    """feature -> (rpm, tpm)."""
    aliases: Mapping[str, str]
    """alias -> feature."""
    basket_rpm: int | None = None
    basket_tpm: int | None = None

    @classmethod
    def from_settings(cls, settings: TrafficContractSettings) -> ContractBook:
        features = {name: (contract.rpm, contract.tpm) for name, contract in settings.features.items()}
        aliases = {alias: name for name, contract in settings.features.items() for alias in contract.aliases}
        return cls(features, aliases, settings.basket.rpm, settings.basket.tpm)

    def canonical(self, name: object) -> str | None:
        """The configured feature ``name`` denotes (itself or through an alias), else ``None``."""
        if not isinstance(name, str):
            return None
        if name in self.features:
            return name
        return self.aliases.get(name)

    def limits(self, feature: str) -> ContractLimits:
        rpm, tpm = self.features.get(feature, (None, None))
        return ContractLimits(rpm, tpm, self.basket_rpm, self.basket_tpm)

    @property
    def counted_features(self) -> tuple[str, ...]:
        """Every feature a counter can exist for: the configured ones and ``unassigned``."""
        names = list(self.features)
        if UNASSIGNED not in self.features:
            names.append(UNASSIGNED)
        return tuple(names)


@dataclass(frozen=True, slots=True)
class FeatureResolution:
    feature: str
    source: FeatureSource


def resolve_feature(
    book: ContractBook,
    *,
    request_feature: object = None,
    key_feature: object = None,
    team_feature: object = None,
    request_tags: Iterable[object] = (),
    admin_tags: Iterable[object] = (),
    trust_request_feature: bool = False,
) -> FeatureResolution:
    """The feature of a request: the first of these that names a configured feature or alias.

    1. the request body's ``metadata.feature`` (only when ``trust_request_feature``);
    2. the key's metadata ``feature``; 3. the team's metadata ``feature``;
    4. a request tag (``admin_tags``, set on the key or team, always; ``request_tags``, which a
       client controls, only when ``trust_request_feature``);

    otherwise ``unassigned``. A value that names nothing configured is skipped, so it can neither
    create a counter nor hide a later source.
    """
    sources: list[tuple[object, FeatureSource]] = []
    if trust_request_feature:
        sources.append((request_feature, "request"))
    sources.extend(((key_feature, "key"), (team_feature, "team")))
    for value, source in sources:
        feature = book.canonical(value)
        if feature is not None:
            return FeatureResolution(feature, source)
    tags: list[object] = list(admin_tags)
    if trust_request_feature:
        tags.extend(request_tags)
    for tag in tags:
        feature = book.canonical(tag)
        if feature is not None:
            return FeatureResolution(feature, "tag")
    return FeatureResolution(UNASSIGNED, "none")


# -- modes -------------------------------------------------------------------------------------------


def _over(used: int, need: int, limit: int | None) -> bool:
    """True if ``need`` more would exceed ``limit`` given ``used`` (oversize rule, module docstring)."""
    if limit is None:
        return False
    if limit <= 0:
        return True
    return used + min(need, limit) > limit


def classify(
    feature_used: int, basket_used: int, need: int, feature_limit: int | None, basket_limit: int | None
) -> Mode:
    """The mode of one more request costing ``need`` (1 for RPM, its token estimate for TPM)."""
    if _over(basket_used, need, basket_limit):
        return Mode.DEGRADED
    if _over(feature_used, need, feature_limit):
        return Mode.BORROWED
    return Mode.NORMAL


def worst_mode(*modes: Mode) -> Mode:
    return max(modes)


def window_start(now_ms: int, window_seconds: int) -> int:
    """Start (seconds since the epoch) of the fixed window holding ``now_ms``."""
    return (int(now_ms) // 1000 // window_seconds) * window_seconds


def seconds_to_window_end(now_ms: int, start: int, window_seconds: int) -> int:
    """Whole seconds until the window starting at ``start`` ends, at least 1 (``retry-after``)."""
    return max(1, math.ceil(((start + window_seconds) * 1000 - now_ms) / 1000))


def in_flight_field(field_name: str) -> str:
    """TPM hash field holding the estimates in flight for ``field_name``.

    ``:`` never occurs in an escaped name (see ``store/keys.py``), so this cannot collide with a feature.
    """
    return field_name + ":inflight"


# -- the ledger (what the store keeps per window) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContractAdmission:
    """Outcome of classifying (and, unless rejected, counting) one request."""

    now_ms: int
    window_start: int
    window_seconds: int
    rpm_mode: Mode
    tpm_mode: Mode
    counted: bool
    """False when the worst mode's action is reject: nothing was recorded."""
    feature_requests: int
    basket_requests: int
    feature_tokens: int
    """Recorded plus in flight; the counts include this request when counted, else as decided on."""
    basket_tokens: int

    @property
    def mode(self) -> Mode:
        return worst_mode(self.rpm_mode, self.tpm_mode)

    @property
    def retry_after_seconds(self) -> int:
        return seconds_to_window_end(self.now_ms, self.window_start, self.window_seconds)


@dataclass(frozen=True, slots=True)
class ContractSettlement:
    """Outcome of reconciling one request after the call."""

    applied: bool
    """False when the window's counters are gone (expired): nothing was recorded."""
    feature_tokens: int
    """Recorded plus in flight after the reconcile (0 when not applied)."""
    basket_tokens: int


@dataclass(frozen=True, slots=True)
class ContractSettlements:
    """Outcome of reconciling several features' requests of one window at once."""

    applied: bool
    """False when the window's counters are gone (expired): nothing was recorded."""
    feature_tokens: Mapping[str, int]
    """Per feature (as given): recorded plus in flight after the reconcile (empty when not applied)."""
    basket_tokens: int


@dataclass(frozen=True, slots=True)
class ContractWindow:
    """Read-only view of one window, keyed by counter field (escaped feature name or ``__basket__``)."""

    window_start: int
    requests: Mapping[str, int]
    tokens: Mapping[str, int]
    """Tokens recorded by reconciled requests."""
    in_flight: Mapping[str, int]
    """Token estimates of requests not reconciled yet."""


@dataclass(slots=True)
class _Window:
    start: int
    expires_at_ms: int
    requests: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)

    def token_usage(self, name: str) -> int:
        return self.tokens.get(name, 0) + self.in_flight.get(name, 0)

    def reconcile(self, name: str, release: int, actual: int) -> None:
        # Fields are written only when something changes, exactly as the Lua script does.
        if release > 0:
            self.in_flight[name] = max(0, self.in_flight.get(name, 0) - release)
        if actual > 0:
            self.tokens[name] = self.tokens.get(name, 0) + actual


class ContractLedger:
    """Per-window counters with explicit times: the embedded store's state, the Lua scripts' model.

    A window's counters exist from its first counted request until ``start + ttl`` (the Redis keys'
    ``EXPIREAT``); at most ``ttl / window + 1`` windows are held.
    """

    __slots__ = ("_windows",)

    def __init__(self) -> None:
        self._windows: dict[int, _Window] = {}

    def _expire(self, now_ms: int) -> None:
        for start in [s for s, w in self._windows.items() if now_ms >= w.expires_at_ms]:
            del self._windows[start]

    def admit(
        self,
        *,
        now_ms: int,
        window_seconds: int,
        ttl_seconds: int,
        field_name: str,
        limits: ContractLimits,
        estimate_tokens: int,
        reject_modes: Collection[Mode] = (),
    ) -> ContractAdmission:
        """Classify one request at ``now_ms`` and count it unless its worst mode is in ``reject_modes``."""
        self._expire(now_ms)
        start = window_start(now_ms, window_seconds)
        window = self._windows.get(start) or _Window(start, (start + ttl_seconds) * 1000)
        estimate = max(0, int(estimate_tokens))
        f_req, b_req = window.requests.get(field_name, 0), window.requests.get(BASKET_FIELD, 0)
        f_tok, b_tok = window.token_usage(field_name), window.token_usage(BASKET_FIELD)
        rpm_mode = classify(f_req, b_req, 1, limits.feature_rpm, limits.basket_rpm)
        tpm_mode = classify(f_tok, b_tok, estimate, limits.feature_tpm, limits.basket_tpm)
        counted = worst_mode(rpm_mode, tpm_mode) not in reject_modes
        if counted:
            self._windows[start] = window
            for name in (field_name, BASKET_FIELD):
                window.requests[name] = window.requests.get(name, 0) + 1
                window.in_flight[name] = window.in_flight.get(name, 0) + estimate
            f_req, b_req, f_tok, b_tok = f_req + 1, b_req + 1, f_tok + estimate, b_tok + estimate
        return ContractAdmission(now_ms, start, window_seconds, rpm_mode, tpm_mode, counted, f_req, b_req, f_tok, b_tok)

    def settle(
        self, *, now_ms: int, window_start: int, field_name: str, release_tokens: int, actual_tokens: int
    ) -> ContractSettlement:
        """Move a request's estimate out of flight and record its actual usage, in its own window."""
        settled = self.settle_many(
            now_ms=now_ms, window_start=window_start, deltas={field_name: (release_tokens, actual_tokens)}
        )
        return ContractSettlement(settled.applied, settled.feature_tokens.get(field_name, 0), settled.basket_tokens)

    def settle_many(
        self, *, now_ms: int, window_start: int, deltas: Mapping[str, tuple[int, int]]
    ) -> ContractSettlements:
        """Reconcile requests of several features counted in one window: ``deltas`` maps a field to the
        estimates to release and the actual tokens to record (each summed over its requests); the basket
        takes the sums. Releasing in one sum or one by one ends the same, since in-flight fields stop at 0."""
        self._expire(now_ms)
        window = self._windows.get(window_start)
        if window is None:
            return ContractSettlements(False, {}, 0)
        released = recorded = 0
        for name, (release_tokens, actual_tokens) in deltas.items():
            release, actual = max(0, int(release_tokens)), max(0, int(actual_tokens))
            window.reconcile(name, release, actual)
            released, recorded = released + release, recorded + actual
        window.reconcile(BASKET_FIELD, released, recorded)
        tokens = {name: window.token_usage(name) for name in deltas}
        return ContractSettlements(True, tokens, window.token_usage(BASKET_FIELD))

    def window(self, *, now_ms: int, window_start: int) -> ContractWindow | None:
        self._expire(now_ms)
        window = self._windows.get(window_start)
        if window is None:
            return None
        return ContractWindow(window.start, dict(window.requests), dict(window.tokens), dict(window.in_flight))


# -- enforcement ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    """What to do with a request: ``allow``, ``reject``, ``cap_max_tokens`` (``cap``) or ``delay``."""

    kind: Literal["allow", "reject", "cap_max_tokens", "delay"] = "allow"
    cap: int | None = None
    min_seconds: float = 0.0
    max_seconds: float = 0.0

    @classmethod
    def from_settings(cls, settings: ActionSettings) -> Action:
        return cls(settings.kind, settings.cap_max_tokens, settings.min_seconds, settings.max_seconds)


ALLOW = Action()


def action_for(mode: Mode, actions: Mapping[Mode, Action]) -> Action:
    """The action for a request whose worst mode is ``mode``; ``normal`` is always allowed."""
    if mode is Mode.NORMAL:
        return ALLOW
    return actions.get(mode, ALLOW)


def delay_seconds(action: Action, uniform: float) -> float:
    """The wait of a ``delay`` action for a random draw ``uniform`` in [0, 1): jittered, bounded."""
    if action.kind != "delay":
        return 0.0
    uniform = min(max(uniform, 0.0), 1.0)
    return action.min_seconds + (action.max_seconds - action.min_seconds) * uniform


def capped_max_tokens(requested: object, cap: int) -> int:
    """The output-token limit a ``cap_max_tokens`` action leaves: the request's own if smaller."""
    if isinstance(requested, int) and not isinstance(requested, bool) and 0 <= requested < cap:
        return requested
    return cap


def _fmt(limit: int | None) -> str:
    return "none" if limit is None else str(limit)


def rejection_message(feature: str, admission: ContractAdmission, limits: ContractLimits) -> str:
    """The 429 text: the feature, its contract, the basket's, the modes and this window's usage."""
    return (
        f"Traffic contract exceeded for feature '{feature}': mode {admission.mode.label} "
        f"(rpm mode: {admission.rpm_mode.label}, tpm mode: {admission.tpm_mode.label}). "
        f"Contract: feature rpm {_fmt(limits.feature_rpm)}, tpm {_fmt(limits.feature_tpm)}; "
        f"basket rpm {_fmt(limits.basket_rpm)}, tpm {_fmt(limits.basket_tpm)}. "
        f"This window: feature {admission.feature_requests} requests, {admission.feature_tokens} tokens; "
        f"basket {admission.basket_requests} requests, {admission.basket_tokens} tokens. "
        f"Retry after {admission.retry_after_seconds}s."
    )
