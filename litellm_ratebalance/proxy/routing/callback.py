"""LiteLLM adapters of the rate balancer: one core (:class:`RateBalancer`) behind two entry points.

* Proxy (config only): ``litellm_settings.callbacks: ["litellm_ratebalance.rate_balancer"]``.
  ``router_settings.routing_strategy`` only takes LiteLLM's own names, so the pick happens in
  ``async_filter_deployments``, which the Router calls on every callback after its health-check and
  cooldown filtering: we narrow the healthy list to the one weighted pick. Whatever ``routing_strategy`` is
  set then has a single deployment left (``simple-shuffle``, the default, costs least). Look-ups that list
  the healthy deployments without picking one for the request (file / batch fan-outs, the priority queue's
  look-up: :func:`~litellm_ratebalance.proxy._litellm.is_listing_lookup`) are left as they are. Finished
  calls are recorded from ``async_log_success_event`` / ``async_log_failure_event``.
* SDK: :class:`RateBalancedRouting`, a ``CustomRoutingStrategyBase``, set the way LiteLLM documents
  (``router.register_plugin(RateBalancedRouting(router))`` from LiteLLM 1.110,
  ``router.set_custom_routing_strategy(...)`` before) or with ``RateBalancedRouting(router).install()``, which
  does the same after checking the model list. Either way every async pick makes sure its recorder is in
  ``litellm.callbacks``, so outcomes are recorded from the first call. A custom strategy bypasses the Router's
  health and cooldown filtering, so it asks the Router for the healthy deployments first.

What the hooks read from LiteLLM's dicts (candidates, a request's size and id, a finished call's sample) is in
:mod:`.calls`. What is a sample: a call that reached a deployment
(``model_id`` known) and was not a cache hit. A failure counts against the deployment (zero-rate sample)
unless its status says the request itself was at fault (400, 413, 422). Nothing these hooks raise reaches a
client: an internal error is logged and the Router's own choice stands.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import litellm
from litellm.integrations.custom_logger import CustomLogger
from litellm.types.router import CustomRoutingStrategyBase

from litellm_ratebalance import metrics
from litellm_ratebalance.identity import metadata_value
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.routing.calls import (
    deployment_candidates,
    finish_call,
    model_group_of,
    pool,
    record_call,
    request_id_of,
    request_work,
)
from litellm_ratebalance.proxy.runtime import Runtime, get_runtime, schedule_startup_check
from litellm_ratebalance.routing import core_build
from litellm_ratebalance.routing.balancer import RateBalancer
from litellm_ratebalance.routing.config import RoutingSettings
from litellm_ratebalance.routing.model_info import deployment_id as _deployment_id
from litellm_ratebalance.routing.model_info import model_info_problems
from litellm_ratebalance.routing.types import Candidate
from litellm_ratebalance.store.routing import RoutingStore

__all__ = [
    "ROUTING_CHOICES",
    "ROUTING_ESTIMATED_RATE",
    "ROUTING_WEIGHT",
    "RateBalancedRouting",
    "RateBalancerCallback",
    "rate_balancer",
]

logger = logging.getLogger("litellm_ratebalance.routing")

_LOG_INTERVAL_SECONDS = 30.0
_last_hook_error = [float("-inf")]


def _log_hook_error(where: str) -> None:
    now = time.monotonic()
    if now - _last_hook_error[0] >= _LOG_INTERVAL_SECONDS:
        _last_hook_error[0] = now
        logger.exception("litellm_ratebalance routing: %s failed; the Router's own choice stands", where)


def _startup_model_info_problems(model_list: Sequence[Mapping[str, Any]]) -> list[str]:
    return model_info_problems(model_list, consequence=False)


ROUTING_CHOICES = "routing_choices"
ROUTING_WEIGHT = "routing_weight"
ROUTING_ESTIMATED_RATE = "routing_estimated_rate"
ROUTING_CORE = "routing_core"
_METRIC_LABELS = ("model_group", "deployment")
# Label values are the model group and deployment ids of the Router's model list: bounded by the config.
_choices = metrics.counter(ROUTING_CHOICES, "Requests the rate balancer sent to each deployment", _METRIC_LABELS)
_weight = metrics.gauge(
    ROUTING_WEIGHT,
    "Current choice probability of each deployment among its model group's healthy ones",
    _METRIC_LABELS,
)
_estimated_rate = metrics.gauge(
    ROUTING_ESTIMATED_RATE,
    "Estimated effective token rate of each deployment (recency-weighted mean of the window, tokens/s)",
    _METRIC_LABELS,
)
# The family the limiter, contracts and backpressure observe too; one fixed child, looked up once.
_filter_latency = metrics.hook_latency().labels("routing", "filter_deployments")
_gauges_updated: dict[str, float] = {}
_choice_children: dict[tuple[str, str], Any] = {}
"""Labelled counter children by (model group, deployment): ``labels()`` costs more than the increment."""
_MAX_CHILDREN = 4096


def _export(balancer: RateBalancer, model_group: str, candidates: Sequence[Candidate], index: int) -> None:
    """Count the pick; refresh the weight / rate gauges of the group at most once per refresh interval."""
    key = (model_group, candidates[index].id)
    child = _choice_children.get(key)
    if child is None:
        if len(_choice_children) >= _MAX_CHILDREN:
            _choice_children.clear()  # a changed model list; the series themselves stay in the registry
        child = _choice_children[key] = _choices.labels(*key)
    child.inc()
    now = time.monotonic()
    if now - _gauges_updated.get(model_group, -math.inf) < balancer.settings.refresh_interval:
        return
    _gauges_updated[model_group] = now
    for deployment_id, estimate in balancer.estimates(model_group, candidates).items():
        _weight.labels(model_group, deployment_id).set(estimate.share or 0.0)
        _estimated_rate.labels(model_group, deployment_id).set(estimate.mean_rate)


_core_announced: list[str] = []


def _announce_core_build() -> None:
    """Say once per process which build of the routing core runs (:func:`core_build`): an INFO log line and
    the gauge ``routing_core{build}`` = 1, so that an install of the optional compiled core can be checked on
    the proxy's ``/metrics``."""
    build = core_build()
    metrics.gauge(
        ROUTING_CORE, "The routing core this process runs (build: compiled or python), always 1", ["build"]
    ).labels(build).set(1)
    if build not in _core_announced:
        _core_announced.append(build)
        logger.info(
            "litellm_ratebalance routing core: %s", "compiled (mypyc)" if build == "compiled" else "pure Python"
        )


def _pick(
    balancer: RateBalancer,
    model: str,
    deployments: Sequence[Mapping[str, Any]],
    request_kwargs: Mapping[str, Any] | None = None,
    messages: object = None,
    candidates: tuple[Candidate, ...] | None = None,
) -> int | None:
    """Index in ``deployments`` of the balancer's pick (None: one lacks an id). ``candidates``: theirs, when
    the caller has them."""
    if candidates is None:
        candidates = deployment_candidates(deployments)
        if candidates is None:
            return None
    model_group = model_group_of(deployments, model)
    work = request_work(messages, request_kwargs, balancer.settings.ratio_for(model_group, None))
    index = balancer.choose(model_group, candidates, request_id_of(request_kwargs), work=work)
    _export(balancer, model_group, candidates, index)
    return index


_D = TypeVar("_D", bound=Mapping[str, Any])


def _backpressure_available(deployments: Sequence[_D], request_kwargs: Mapping[str, Any] | None) -> Sequence[_D]:
    """``deployments`` without those the backpressure part would refuse now (at their concurrency limit, or
    shedding this request's priority tier); all of them when every one would refuse (backpressure then
    answers with its own 429/503) or when backpressure does not run in this process (no deployment gate in
    the runtime's registry)."""
    gate = get_runtime().registry.deployment_gate
    if gate is None or not gate.gates_deployments():
        return deployments  # not running, or gating no deployment (off, or none configured)
    priority = metadata_value(_litellm.request_auth(request_kwargs or {}), "priority")
    available = [
        d
        for d in deployments
        if (deployment_id := _deployment_id(d)) is None or gate.deployment_available(deployment_id, priority)
    ]
    return available if available else deployments


class _BalancerSource:
    """The RateBalancer of a runtime: rebuilt when tests or SDK users reset or reconfigure it."""

    __slots__ = ("_balancer", "_own_runtime", "_runtime", "_settings")

    def __init__(self, runtime: Runtime | None = None) -> None:
        self._own_runtime = runtime
        self._balancer: RateBalancer | None = None
        self._runtime: Runtime | None = None
        self._settings: object = None

    def get(self) -> RateBalancer:
        runtime = self._own_runtime if self._own_runtime is not None else get_runtime()
        settings = runtime.settings()
        if self._balancer is None or runtime is not self._runtime or settings is not self._settings:
            self._runtime, self._settings = runtime, settings

            def report(exc: BaseException) -> None:
                runtime.faults.record("routing", exc, runtime.settings())

            # The store is resolved at each sync (runtime.store is lazy), never on the request path.
            self._balancer = RateBalancer(runtime.store, settings.ratebalance.routing, on_store_error=report)
        return self._balancer


class _OutcomeRecorder(CustomLogger):  # type: ignore[misc]
    """The hooks that tell a balancer how its picks went: an answer's end, and each finished call's sample."""

    def balancer(self) -> RateBalancer:
        raise NotImplementedError

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: Any
    ) -> None:
        try:
            finish_call(self.balancer(), request_data)
        except Exception:
            _log_hook_error("async_post_call_success_deployment_hook")
        return None  # the response unchanged

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        try:
            record_call(self.balancer(), kwargs, ok=True)
        except Exception:
            _log_hook_error("async_log_success_event")

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        try:
            record_call(self.balancer(), kwargs, ok=False)
        except Exception:
            _log_hook_error("async_log_failure_event")


class RateBalancerCallback(_OutcomeRecorder):
    """Proxy callback: narrows the healthy deployments to the rate-balanced pick and records outcomes.

    Built with no arguments at config load; settings and store are resolved on first use from the
    process runtime (:func:`~litellm_ratebalance.proxy.runtime.get_runtime`), or from ``runtime`` when
    given. ``balancer`` pins a core instead (tests, sharing one core with an SDK strategy).
    """

    def __init__(self, runtime: Runtime | None = None, *, balancer: RateBalancer | None = None) -> None:
        super().__init__()
        self._pinned = balancer
        self._source = _BalancerSource(runtime)
        if runtime is None and balancer is None:
            # (the proxy's instance: its model list's model_info is checked at start-up as well)
            schedule_startup_check(model_list_check=_startup_model_info_problems)
            _announce_core_build()

    def balancer(self) -> RateBalancer:
        """The core this callback routes with (weights() / estimates() for status output)."""
        return self._pinned if self._pinned is not None else self._source.get()

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list[Any],
        messages: list[Any] | None,
        request_kwargs: dict[str, Any] | None = None,
        parent_otel_span: Any = None,
    ) -> list[Any]:
        started = time.perf_counter()
        try:
            return self._filter(model, healthy_deployments, messages, request_kwargs)
        finally:
            _filter_latency.observe(time.perf_counter() - started)

    def _filter(
        self, model: str, healthy_deployments: list[Any], messages: Any, request_kwargs: dict[str, Any] | None
    ) -> list[Any]:
        try:
            if len(healthy_deployments) < 2 or _litellm.is_listing_lookup(messages, request_kwargs):
                return healthy_deployments
            known = pool(healthy_deployments)
            if not known.mappings:
                return healthy_deployments
            narrowed = _litellm.narrow_like_router(healthy_deployments, request_kwargs, ordered=known.ordered)
            if not narrowed:
                return healthy_deployments  # the Router raises its own "no deployments" error
            available = _backpressure_available(narrowed, request_kwargs)
            candidates = None  # narrowed or gated: _pick reads the candidates of what is left
            if available is healthy_deployments:
                if known.candidates is None:
                    return healthy_deployments  # one lacks a model_info.id: nothing to route by
                candidates = known.candidates
            index = _pick(self.balancer(), model, available, request_kwargs, messages, candidates)
            return healthy_deployments if index is None else [available[index]]
        except Exception:
            _log_hook_error("async_filter_deployments")
            return healthy_deployments


class _StrategyRecorder(_OutcomeRecorder):
    """The SDK strategy's outcome recorder (registered in ``litellm.callbacks``); it never filters."""

    def __init__(self, strategy: RateBalancedRouting) -> None:
        super().__init__()
        self._strategy = strategy
        # LiteLLM refuses a logger whose class and public str/bool/int fields equal those of one already
        # registered: without a field of its own, the recorder of a second strategy in the process (two
        # Routers) would be taken for the first one's and never added.
        self.strategy_id = f"{id(strategy):x}"

    def balancer(self) -> RateBalancer:
        return self._strategy.balancer()


class RateBalancedRouting(CustomRoutingStrategyBase):  # type: ignore[misc]
    """Rate-balanced routing for SDK users of ``litellm.Router``::

        router = litellm.Router(model_list=...)
        router.register_plugin(RateBalancedRouting(router))  # or RateBalancedRouting(router).install()
        # (LiteLLM before 1.110: router.set_custom_routing_strategy(RateBalancedRouting(router)))
        # then: await router.acompletion(model="group", ...)

    The balancer learns from the outcome of every call it routed, whichever way it was set: each async pick
    first makes sure :attr:`recorder` is in ``litellm.callbacks`` (see :meth:`ensure_recorder`).
    ``settings`` / ``store`` default to those of ``runtime`` (the process runtime unless given:
    ``ratebalance.routing``, the configured Redis or the embedded store); ``balancer`` shares a core.
    Async calls are balanced; the Router's synchronous calls are not (LiteLLM runs no async logging for
    them, so nothing would be recorded): they fall back to the Router's own strategy, or from LiteLLM 1.110,
    which keeps no pick of its own beside a custom strategy, to a random healthy deployment
    (:func:`~litellm_ratebalance.proxy._litellm.own_sync_pick`).
    """

    def __init__(
        self,
        router: Any,
        settings: RoutingSettings | None = None,
        *,
        store: RoutingStore | None = None,
        balancer: RateBalancer | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.router = router
        if balancer is None and (settings is not None or store is not None):
            source = runtime if runtime is not None else get_runtime()
            balancer = RateBalancer(store if store is not None else source.store, settings)
        self._pinned = balancer
        self._source = _BalancerSource(runtime)
        self.recorder = _StrategyRecorder(self)
        # The callback list that refused the recorder (LiteLLM's MAX_CALLBACKS) and its length then: not
        # asked again, so a full list costs one warning, not a refusal and a warning on every request.
        self._refused: tuple[list[Any], int] | None = None

    def balancer(self) -> RateBalancer:
        return self._pinned if self._pinned is not None else self._source.get()

    def ensure_recorder(self) -> bool:
        """Put :attr:`recorder` in ``litellm.callbacks`` unless it is there; True when it is there now.

        Every async pick calls this before it returns its deployment: LiteLLM reads ``litellm.callbacks``
        when the call itself starts, after the pick, so the first call a strategy routes is recorded too.
        Without it a strategy set only with ``register_plugin`` (``set_custom_routing_strategy``) would count
        each pick in flight and never learn its outcome. Idempotent (one entry however often it runs), and
        re-checked on each pick, so a recorder dropped from the list, or a list replaced, is put back at the
        next pick. When it adds the recorder it also says which build of the routing core runs
        (:func:`core_build`; logged once per process), as the proxy callback does. Where LiteLLM refuses to add
        it (its ``MAX_CALLBACKS`` limit), a warning is logged and the same list is not asked again until its
        length changes."""
        callbacks = litellm.callbacks
        if self.recorder in callbacks:
            return True
        if self._refused is not None and self._refused[0] is callbacks and self._refused[1] == len(callbacks):
            return False
        manager = getattr(litellm, "logging_callback_manager", None)
        if manager is not None and hasattr(manager, "add_litellm_callback"):
            manager.add_litellm_callback(self.recorder)  # LiteLLM's own check of duplicates and limits
        else:
            callbacks.append(self.recorder)
        if self.recorder not in litellm.callbacks:
            self._refused = (callbacks, len(callbacks))
            logger.warning(
                "litellm_ratebalance routing: LiteLLM did not add the rate balancer's recorder to"
                " litellm.callbacks (%d callbacks there); calls are routed but their outcomes not learnt",
                len(callbacks),
            )
            return False
        self._refused = None
        _announce_core_build()
        return True

    def install(self) -> RateBalancedRouting:
        """Make this the router's strategy (``register_plugin`` from LiteLLM 1.110, ``set_custom_routing_strategy``
        before) and register the recorder now (:meth:`ensure_recorder`); the first pick would do the latter
        anyway.

        Raises ``ValueError`` when the router's model list has a bad ``model_info.input_to_output_ratio``
        or ``model_info.slots`` (see :func:`model_info_problems`); set the LiteLLM way, such a value is
        logged as a warning and ignored instead."""
        problems = model_info_problems(_litellm.router_deployments(self.router))
        if problems:
            raise ValueError("; ".join(problems))
        _litellm.set_routing_strategy(self.router, self)
        self.ensure_recorder()
        return self

    def uninstall(self) -> None:
        """Give the router its own strategy back and drop the recorder from ``litellm.callbacks`` (from LiteLLM
        1.110 the router's configured strategy is built anew: see
        :func:`~litellm_ratebalance.proxy._litellm.reset_routing_strategy`)."""
        _litellm.reset_routing_strategy(self.router)
        while self.recorder in litellm.callbacks:
            litellm.callbacks.remove(self.recorder)

    async def async_get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        healthy = await _litellm.healthy_deployments(
            self.router,
            model,
            request_kwargs if request_kwargs is not None else {},
            messages=messages,
            input=input,
            specific_deployment=specific_deployment,
        )
        if isinstance(healthy, dict):
            return healthy  # a specific deployment was asked for
        try:
            # Before the pick counts a request in flight: only the recorder ends it.
            self.ensure_recorder()
            pool = _backpressure_available(healthy, request_kwargs)
            index = _pick(self.balancer(), model, pool, request_kwargs, messages)
            if index is not None:
                return pool[index]  # type: ignore[no-any-return]
        except Exception:
            _log_hook_error("RateBalancedRouting.async_get_available_deployment")
            index = None
        if index is None:
            index = random.randrange(len(healthy))  # what simple-shuffle would do
        return healthy[index]  # type: ignore[no-any-return]

    def get_available_deployment(  # type: ignore[override]
        self,
        model: str,
        messages: list[dict[str, str]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        # Not balanced (see the class docstring): the Router's own pick where it has one.
        return _litellm.own_sync_pick(  # type: ignore[no-any-return]
            self.router,
            model,
            messages=messages,
            input=input,
            specific_deployment=specific_deployment,
            request_kwargs=request_kwargs,
        )


rate_balancer = RateBalancerCallback()
