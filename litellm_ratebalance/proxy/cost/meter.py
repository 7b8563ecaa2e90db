"""Cost's meter: GPU-seconds of local deployments, LiteLLM's response cost of the rest.

Two paths:

* **Local deployments.** Backpressure asks the runtime's lease meter (a :class:`CostMeter`, the default of
  :meth:`~litellm_ratebalance.proxy.runtime.Registry.lease_meter`) what to mark when it takes and
  gives back a request's slot (its lease), and the store marks it in the same atomic step
  (:mod:`litellm_ratebalance.store.metering`; no round trip of its own): :meth:`CostMeter.start_mark` before
  the acquire, :meth:`CostMeter.lease_started` with the start mark it returned, :meth:`CostMeter.lease_usage`
  with the response's tokens, :meth:`CostMeter.end_mark` before the release and :meth:`CostMeter.lease_ended`
  with the end mark, which carries the request's GPU-seconds (:mod:`litellm_ratebalance.attribution.sharing`).
* **API deployments.** The cost callback's success event (:mod:`.callback`) adds LiteLLM's ``response_cost``
  (USD) of every call that was not served by a local deployment (:meth:`CostMeter.api_cost`).

Series (labels ``priority``, ``team``, ``feature`` resolved as in :mod:`litellm_ratebalance.attribution.labels`):
``gpu_seconds_total{deployment,...}``, ``cost_usd_total{...,source}`` (``api``; ``gpu`` when a GPU-hour price is
configured) and ``cost_tokens_total{...,kind}`` (local requests' backpressure reservation, ``reserved``: prompt +
output estimate, against what they ``used``: prompt + output tokens).

Accounting never refuses or delays a request: a store fault on the lease operations is backpressure's (its
fail mode), and that request goes unmetered.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from litellm_ratebalance import metrics
from litellm_ratebalance.attribution.config import CostSettings
from litellm_ratebalance.attribution.labels import CostLabels, TeamLabels, cost_labels
from litellm_ratebalance.attribution.sharing import Mark
from litellm_ratebalance.contracts.policy import ContractBook, resolve_feature
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime
from litellm_ratebalance.settings import Settings
from litellm_ratebalance.store.metering import CostMark, MeterEnd, MeterStart

__all__ = ["CostMeter", "cost_meter"]

logger = logging.getLogger("litellm_ratebalance.cost")

GPU_SECONDS = "gpu_seconds"
COST_USD = "cost_usd"
COST_TOKENS = "cost_tokens"
GPU_LABELS = ("deployment", "priority", "team", "feature")
COST_LABELS = ("priority", "team", "feature", "source")
TOKEN_LABELS = ("priority", "team", "feature", "kind")


def _gpu_seconds() -> Any:
    return metrics.counter(
        GPU_SECONDS, "GPU-seconds attributed to requests on local deployments (busy time shared)", GPU_LABELS
    )


def _cost_usd() -> Any:
    return metrics.counter(
        COST_USD, "Cost in USD: LiteLLM's response cost (source=api), priced GPU-seconds (source=gpu)", COST_LABELS
    )


def _cost_tokens() -> Any:
    return metrics.counter(
        COST_TOKENS, "Tokens of local requests: reserved by backpressure (prompt + max_tokens) and used", TOKEN_LABELS
    )


@dataclass(slots=True)
class _Open:
    """A local request between its start and end marks."""

    deployment_id: str
    start: Mark
    opened: float
    """Monotonic seconds (for pruning entries whose end never came)."""
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class _Derived:
    settings: Settings
    priorities: frozenset[str]
    book: ContractBook
    teams: TeamLabels


class CostMeter:
    """Cost bookkeeping of one process (the runtime's lease meter: :func:`cost_meter`); see the module docstring.

    ``clock``: monotonic seconds, only to forget requests whose end never arrived (a lost event): after
    ``backpressure.lease_max_age_seconds``, as backpressure stops renewing their leases then. ``settings``:
    where the settings come from (the process runtime's by default).
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, settings: Callable[[], Settings] | None = None
    ) -> None:
        self._clock = clock
        self._settings = settings if settings is not None else lambda: get_runtime().settings()
        self._open: dict[str, _Open] = {}
        self._derived: _Derived | None = None
        self._local: set[str] = set()
        self._team_overflow_logged = False

    # -- settings ---------------------------------------------------------------------------------------
    def _current(self) -> _Derived | None:
        """Derived settings, rebuilt when the settings object changes; ``None`` when cost is off or the
        settings are invalid (the start-up check reports those)."""
        try:
            settings = self._settings()
        except Exception:
            return None
        if not settings.ratebalance.cost.enabled:
            return None
        derived = self._derived
        if derived is None or derived.settings is not settings:
            cost = settings.ratebalance.cost
            derived = _Derived(
                settings=settings,
                priorities=frozenset(settings.priority_reservation)
                | frozenset(settings.ratebalance.backpressure.tiers),
                book=ContractBook.from_settings(settings.ratebalance.traffic_contracts),
                teams=TeamLabels(cost.teams, cost.max_teams),
            )
            self._derived = derived
        return derived

    @staticmethod
    def _durations(cost: CostSettings) -> tuple[int, int]:
        return int(cost.efficiency_half_life_seconds * 1000), cost.state_ttl_seconds * 1000

    def is_local(self, deployment_id: str | None) -> bool:
        """Whether ``deployment_id`` is metered by GPU time (a request of it took a backpressure lease)."""
        return deployment_id is not None and deployment_id in self._local

    @property
    def open_requests(self) -> int:
        """Local requests started and not yet ended (tests, bounded by the leases alive)."""
        return len(self._open)

    # -- labels -----------------------------------------------------------------------------------------
    def labels(self, request: Mapping[str, Any] | None, derived: _Derived) -> CostLabels:
        """Priority, team and feature of a request (its kwargs or logging kwargs)."""
        request = request if isinstance(request, Mapping) else {}
        auth = _litellm.request_auth(request)
        labels = cost_labels(auth, derived.priorities, derived.teams, self._feature(request, auth, derived))
        if derived.teams.overflowed and not self._team_overflow_logged:
            self._team_overflow_logged = True
            logger.warning(
                "litellm_ratebalance cost: %d teams have their own label; further teams are labelled 'other' "
                "(raise ratebalance.cost.max_teams, or list the teams in ratebalance.cost.teams)",
                derived.settings.ratebalance.cost.max_teams,
            )
        return labels

    @staticmethod
    def _feature(request: Mapping[str, Any], auth: Any, derived: _Derived) -> str:
        """The traffic contracts' resolution, with their trust rules: key and team metadata and admin tags
        always; the request's own ``metadata.feature`` and tags only with ``trust_request_feature``. (Not the
        feature the contracts callback notes in the metadata: without that callback a client could write it.)"""
        key_metadata = getattr(auth, "metadata", None)
        team_metadata = getattr(auth, "team_metadata", None)
        key_metadata = key_metadata if isinstance(key_metadata, Mapping) else {}
        team_metadata = team_metadata if isinstance(team_metadata, Mapping) else {}
        metadata = _litellm.request_metadata(request)
        return resolve_feature(
            derived.book,
            request_feature=metadata.get("feature"),
            key_feature=key_metadata.get("feature"),
            team_feature=team_metadata.get("feature"),
            request_tags=[*_tags(request.get("tags")), *_tags(metadata.get("tags"))],
            admin_tags=[*_tags(key_metadata.get("tags")), *_tags(team_metadata.get("tags"))],
            trust_request_feature=derived.settings.ratebalance.traffic_contracts.trust_request_feature,
        ).feature

    # -- local deployments ------------------------------------------------------------------------------
    def start_mark(self, deployment_id: str) -> MeterStart | None:
        """What the lease acquire for a request on ``deployment_id`` should mark; ``None`` when cost is off."""
        derived = self._current()
        if derived is None:
            return None
        self._local.add(deployment_id)
        half_life_ms, ttl_ms = self._durations(derived.settings.ratebalance.cost)
        return MeterStart(half_life_ms=half_life_ms, ttl_ms=ttl_ms)

    def lease_started(self, deployment_id: str, lease_id: str, mark: CostMark | None) -> None:
        """``lease_id`` was taken on ``deployment_id`` with the start ``mark`` (``None``: not metered)."""
        derived = self._current()
        if derived is None or mark is None:
            return
        self._prune(derived.settings)
        self._open[lease_id] = _Open(deployment_id, mark.mark, self._clock())

    def lease_usage(self, lease_id: str, response: Any) -> None:
        """The response of ``lease_id``'s request arrived: note its prompt and output tokens."""
        entry = self._open.get(lease_id)
        if entry is not None and response is not None:
            entry.prompt_tokens, entry.output_tokens = _litellm.response_usage(response)

    def end_mark(self, lease_id: str) -> MeterEnd | None:
        """What the release of ``lease_id`` should mark; ``None`` when its start was not marked or cost is off."""
        entry = self._open.get(lease_id)
        derived = self._current()
        if entry is None or derived is None:
            return None
        cost = derived.settings.ratebalance.cost
        half_life_ms, ttl_ms = self._durations(cost)
        return MeterEnd(
            entry.start,
            cost.deployment_gpus(entry.deployment_id),
            entry.output_tokens or 0,
            half_life_ms=half_life_ms,
            ttl_ms=ttl_ms,
        )

    def lease_ended(self, lease_id: str, request: object, reserved_tokens: int, mark: CostMark | None) -> None:
        """``lease_id`` was released with the end ``mark`` (``None``: the release failed; the request goes
        unmetered): charge the request's labels.

        ``request``: the kwargs of the attempt that held the lease (for its caller's identity; anything else
        reads as no identity); ``reserved_tokens``: what backpressure reserved for it (prompt + output
        estimate). Never raises: a bug here leaves the request unmetered, not the caller's release undone."""
        entry = self._open.pop(lease_id, None)
        derived = self._current()
        if entry is None or derived is None or mark is None:
            return
        try:
            self._charge(entry, mark, request, reserved_tokens, derived)
        except Exception:
            logger.exception("litellm_ratebalance cost: accounting of a request failed; it goes unmetered")

    def _charge(self, entry: _Open, mark: CostMark, request: object, reserved_tokens: int, derived: _Derived) -> None:
        cost = derived.settings.ratebalance.cost
        labels = self.labels(request if isinstance(request, Mapping) else None, derived)
        if mark.share is not None:
            deployment_id = entry.deployment_id
            _gpu_seconds().labels(deployment_id, labels.priority, labels.team, labels.feature).inc(mark.share)
            price = cost.deployment_gpu_hour_usd(deployment_id)
            if price is not None:
                _cost_usd().labels(labels.priority, labels.team, labels.feature, "gpu").inc(mark.share * price / 3600)
        tokens = _cost_tokens()
        tokens.labels(labels.priority, labels.team, labels.feature, "reserved").inc(max(0, reserved_tokens))
        if entry.prompt_tokens is not None or entry.output_tokens is not None:
            used = (entry.prompt_tokens or 0) + (entry.output_tokens or 0)
            tokens.labels(labels.priority, labels.team, labels.feature, "used").inc(used)

    def _prune(self, settings: Settings) -> None:
        # An end that never comes (a lost event): its lease lapses in the store, and its entry goes here.
        horizon = self._clock() - settings.ratebalance.backpressure.lease_max_age_seconds
        for lease_id in [k for k, entry in self._open.items() if entry.opened < horizon]:
            del self._open[lease_id]

    # -- API deployments --------------------------------------------------------------------------------
    def api_cost(self, kwargs: Mapping[str, Any], response: Any) -> float | None:
        """Charge LiteLLM's response cost of a call that no local deployment served; the amount charged."""
        derived = self._current()
        if derived is None or self.is_local(_litellm.logged_deployment_id(kwargs, response)):
            return None
        amount = _litellm.logged_response_cost(kwargs)
        if amount is None or amount <= 0 or not math.isfinite(amount):
            return None
        labels = self.labels(kwargs, derived)
        _cost_usd().labels(labels.priority, labels.team, labels.feature, "api").inc(amount)
        return amount


def _tags(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def cost_meter(runtime: Runtime | None = None) -> CostMeter | None:
    """The cost meter of ``runtime`` (the process's by default): the lease meter its registry hands
    backpressure's lease path, which the cost callback charges API cost through too; ``None`` when another
    lease meter was provided (the API cost is then not charged)."""
    meter = (runtime or get_runtime()).registry.lease_meter()
    return meter if isinstance(meter, CostMeter) else None
