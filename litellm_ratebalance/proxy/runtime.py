"""Process-wide state shared by every adapter: settings, the store, the router, store-fault handling, and the
registry through which the parts find each other.

LiteLLM builds our callback instances at config load, before its Router and Redis exist, and with no
arguments, so everything here is resolved lazily on first use and kept for the process. Tests and SDK
users call :func:`configure` to hand in settings, a store or a router explicitly.

No part imports another part's adapter: where one part needs another (routing asks backpressure which
deployments would take a request; backpressure's lease path carries cost's marks), it asks the
:class:`Registry` of the runtime for the role (:class:`DeploymentGate`, :class:`LeaseMeter`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from litellm_ratebalance.errors import ConfigurationError, StoreError, StoreFault, redact, redact_url
from litellm_ratebalance.proxy import _litellm
from litellm_ratebalance.proxy.replica_report import report_forever
from litellm_ratebalance.proxy.store_metrics import observe_loop_lag, store_call_observer, store_errors
from litellm_ratebalance.settings import Settings, load_settings
from litellm_ratebalance.store import KeySpace, MemoryStore, RedisStore, Store

if TYPE_CHECKING:
    from litellm_ratebalance.store.metering import CostMark, MeterEnd, MeterStart

__all__ = [
    "DeploymentGate",
    "FaultPolicy",
    "LeaseMeter",
    "LiteLLMRedisClient",
    "Registry",
    "Runtime",
    "configure",
    "get_runtime",
    "reset_runtime",
]

logger = logging.getLogger("litellm_ratebalance")


class FaultPolicy:
    """What happens when the store fails: count it, warn at most once per interval per component, and
    tell the caller whether to go on (fail open) or refuse (fail closed)."""

    __slots__ = ("_last_warning",)

    def __init__(self) -> None:
        self._last_warning: dict[str, float] = {}

    def record(self, component: str, exc: BaseException, settings: Settings) -> bool:
        """Count and maybe log one store fault; return True if the request should proceed (fail open, or
        local: the caller decides against :meth:`Runtime.local_store`)."""
        mode = settings.ratebalance.fail_mode
        fail_open = mode != "closed"
        cause = exc.cause.value if isinstance(exc, StoreError) else StoreFault.ERROR.value
        store_errors().labels(component, mode, cause).inc()
        now = time.monotonic()
        interval = settings.ratebalance.fault_log_interval_seconds
        last = self._last_warning.get(component)
        if last is None or now - last >= interval:
            self._last_warning[component] = now
            logger.warning(
                "litellm_ratebalance %s: store error, failing %s (repeats suppressed for %.0fs): %s",
                component,
                mode,
                interval,
                redact(str(exc)),
            )
        return fail_open

    def unavailable(self, component: str) -> Exception:
        """The 503 a fail-closed component raises."""
        return _litellm.service_unavailable(
            f"litellm_ratebalance {component}: the shared rate-limit store is unavailable and fail_mode is "
            "'closed'; retry shortly",
            {"retry-after": "1"},
        )


class DeploymentGate(Protocol):
    """Whether a deployment would take a request now. Backpressure provides it (its state in this process);
    routing consults it, so that no strategy picks a deployment at its limit or shedding the request's tier."""

    def gates_deployments(self) -> bool:
        """Whether :meth:`deployment_available` can say False for any deployment now."""
        ...

    def deployment_available(self, deployment_id: str, priority: str | None = None) -> bool:
        """Whether a request of ``priority`` would be admitted by ``deployment_id`` now (unknown: True)."""
        ...


class LeaseMeter(Protocol):
    """What backpressure's lease path marks for cost attribution: the start mark rides on the lease acquire,
    the end mark on its release, in the same atomic store step (see :mod:`litellm_ratebalance.store.metering`).
    Cost provides it; every method is cheap and never raises into the lease path."""

    def start_mark(self, deployment_id: str) -> MeterStart | None:
        """What the acquire of a lease on ``deployment_id`` should mark (``None``: nothing)."""
        ...

    def lease_started(self, deployment_id: str, lease_id: str, mark: CostMark | None) -> None:
        """``lease_id`` was taken with the start ``mark`` the store returned."""
        ...

    def lease_usage(self, lease_id: str, response: Any) -> None:
        """The response of the request holding ``lease_id`` arrived (its usage counts)."""
        ...

    def end_mark(self, lease_id: str) -> MeterEnd | None:
        """What the release of ``lease_id`` should mark (``None``: nothing)."""
        ...

    def lease_ended(self, lease_id: str, request: object, reserved_tokens: int, mark: CostMark | None) -> None:
        """``lease_id`` was released with the end ``mark`` (``None``: the release failed)."""
        ...


class Registry:
    """How the parts of one process find each other, by role (instead of importing each other's adapters).

    * :attr:`deployment_gate`: the backpressure state of this process, once a backpressure hook built it
      (``None`` until then, and when backpressure is not listed): the routing hooks consult it.
    * :meth:`lease_meter`: the meter backpressure's lease path marks. Cost's meter by default, built on first
      use: GPU-seconds of local deployments are metered whenever backpressure runs, whether or not the cost
      callback is listed (``ratebalance.cost.enabled`` decides). :meth:`provide_lease_meter` replaces it.
    * :meth:`on_reset`: what to stop when the runtime is reset (tests): background tasks of the parts.
    """

    __slots__ = ("_lease_meter", "_resets", "_settings", "deployment_gate")

    def __init__(self, settings: Callable[[], Settings]) -> None:
        self._settings = settings
        self.deployment_gate: DeploymentGate | None = None
        self._lease_meter: LeaseMeter | None = None
        self._resets: list[Callable[[], None]] = []

    def lease_meter(self) -> LeaseMeter:
        if self._lease_meter is None:
            # The default binding of the role (imported here, not at the top: the cost part imports this module).
            from litellm_ratebalance.proxy.cost.meter import CostMeter

            self._lease_meter = CostMeter(settings=self._settings)
        return self._lease_meter

    def provide_lease_meter(self, meter: LeaseMeter) -> None:
        self._lease_meter = meter

    def on_reset(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (synchronous, must not raise) when this registry's runtime is replaced."""
        self._resets.append(stop)

    def reset(self) -> None:
        for stop in self._resets:
            try:
                stop()
            except Exception:  # a part's clean-up must not keep the others from theirs
                logger.exception("litellm_ratebalance: stopping a part's background work failed")
        self._resets.clear()


class LiteLLMRedisClient:
    """The async client of the proxy's own Redis (a LiteLLM ``RedisCache``), for the store to ask for at each call.

    LiteLLM keeps that client in an expiring cache per event loop and may replace it, so it is never held for
    long; but asking LiteLLM hashes the cache's whole configuration every time, which costs about a fifth of a
    store call. So the client is asked for again at most every ``refresh_seconds`` (and on another event loop).
    """

    __slots__ = ("_cache", "_client", "_clock", "_loop", "_refresh_seconds", "_until")

    def __init__(self, cache: Any, refresh_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._cache = cache
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._until = 0.0

    def __call__(self) -> Any:
        now = self._clock()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if self._client is None or now >= self._until or loop is not self._loop:
            self._client = self._cache.init_async_client()
            self._loop, self._until = loop, now + self._refresh_seconds
        return self._client


class Runtime:
    """Lazily resolved, process-wide dependencies of the adapters, and the :class:`Registry` of the parts."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._store: Store | None = None
        self._local_store: MemoryStore | None = None
        self._router: Any | None = None
        self.faults = FaultPolicy()
        self.registry = Registry(self.settings)
        self._background: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background on the running loop, kept referenced until it ends (store
        reconciliation after a request: nothing waits for it). Its failure is logged, never raised."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.warning("litellm_ratebalance: background store work failed: %s", redact(str(error)))

    # -- settings -------------------------------------------------------------------------------------
    def settings(self) -> Settings:
        """Validated settings (raises ConfigurationError naming the key path on the first bad value)."""
        if self._settings is None:
            self._settings = load_settings(_litellm.general_setting)
        return self._settings

    # -- store ----------------------------------------------------------------------------------------
    def store(self) -> Store:
        """The shared store: ``ratebalance.redis_url``, else the proxy's Redis, else the embedded store."""
        if self._store is None:
            self._store = self._make_store(self.settings())
            if isinstance(self._store, RedisStore):
                _spawn(warn_if_evictable(self._store))
                _spawn(report_forever(self._store))
        return self._store

    def local_store(self) -> MemoryStore:
        """The store in this process's memory that ``fail_mode: local`` decides against while the shared
        store fails (kept for the process: a later fault goes on counting in the same windows)."""
        if self._local_store is None:
            self._local_store = MemoryStore(KeySpace(self.settings().ratebalance.key_prefix))
        return self._local_store

    def _make_store(self, settings: Settings) -> Store:
        keys = KeySpace(settings.ratebalance.key_prefix)
        url = settings.ratebalance.redis_url
        if url:
            import redis.asyncio as aioredis

            # A blocking pool makes a burst wait for a free connection (within the store timeout) instead of
            # failing past redis-py's default of 100 connections.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=settings.ratebalance.redis_max_connections,
                timeout=settings.ratebalance.store_timeout_seconds,
            )
            client = aioredis.Redis(connection_pool=pool)
            logger.info("litellm_ratebalance: using the Redis at ratebalance.redis_url %s", redact_url(url))
            return self._observed(
                RedisStore(
                    client,
                    keys,
                    owns_client=True,
                    timeout_seconds=settings.ratebalance.store_timeout_seconds,
                    cooldown_seconds=settings.ratebalance.store_retry_after_seconds,
                    max_connections=settings.ratebalance.redis_max_connections,
                    observer=store_call_observer(),
                )
            )
        cache = _litellm.discover_redis_cache()
        if cache is not None:
            logger.info("litellm_ratebalance: using the proxy's Redis")
            # LiteLLM's own client keeps the auth, TLS, database and cluster settings of its Redis config;
            # the store's gate never lets more calls in flight than that client's pool (per node) allows.
            return self._observed(
                RedisStore(
                    LiteLLMRedisClient(cache),
                    keys,
                    timeout_seconds=settings.ratebalance.store_timeout_seconds,
                    cooldown_seconds=settings.ratebalance.store_retry_after_seconds,
                    max_connections=settings.ratebalance.redis_max_connections,
                    observer=store_call_observer(),
                )
            )
        logger.info("litellm_ratebalance: no Redis configured; using the embedded store (limits per process)")
        return MemoryStore(keys)

    @staticmethod
    def _observed(store: RedisStore) -> RedisStore:
        observe_loop_lag(lambda: store.take_loop_lag("metrics"))
        return store

    # -- router ---------------------------------------------------------------------------------------
    def router(self) -> Any | None:
        """The explicitly configured router, else the proxy's current one (re-read every time)."""
        return self._router if self._router is not None else _litellm.proxy_router()

    def configure(self, *, settings: Settings | None = None, store: Store | None = None, router: Any = None) -> None:
        if settings is not None:
            self._settings = settings
        if store is not None:
            self._store = store
        if router is not None:
            self._router = router


EVICTING_POLICIES_NOTE = (
    "litellm_ratebalance: Redis maxmemory-policy is %r, which can evict our counters when Redis is full "
    "(limits then silently reset and contracts under-count). Set maxmemory-policy to noeviction, or give "
    "Redis enough memory (see README, 'Running Redis for this package')."
)


async def warn_if_evictable(store: RedisStore) -> str | None:
    """Warn once if Redis may evict our keys; return the policy read (``None`` if it cannot be read).

    Every key we write has a TTL, so ``volatile-*`` policies can evict them as well as ``allkeys-*``.
    Managed Redis services often disable CONFIG; then nothing is said.
    """
    try:
        reply = await asyncio.wait_for(store.client.config_get("maxmemory-policy"), 2.0)
    except Exception:
        return None
    policy = reply.get("maxmemory-policy") if isinstance(reply, dict) else None
    if isinstance(policy, bytes):
        policy = policy.decode()
    if isinstance(policy, str) and (policy.startswith("allkeys-") or policy.startswith("volatile-")):
        logger.warning(EVICTING_POLICIES_NOTE, policy)
    return policy if isinstance(policy, str) else None


def _spawn(coroutine: Any) -> None:
    """Run ``coroutine`` in the background if a loop is running, else drop it (SDK set-up code)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        coroutine.close()
        return
    task = loop.create_task(coroutine)
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


_background_tasks: set[asyncio.Task[Any]] = set()
_runtime = Runtime()
_startup_check_scheduled = False

EXIT_CONFIG = 78
"""Exit status on invalid configuration at proxy start-up (EX_CONFIG from sysexits.h)."""


ModelListCheck = Callable[[Sequence[Mapping[str, Any]]], list[str]]
"""Problems (one message each, naming the deployment, the key and the valid range) in the proxy's model list."""
_model_list_checks: list[ModelListCheck] = []


def schedule_startup_check(
    poll_seconds: float = 0.05, give_up_seconds: float = 300.0, *, model_list_check: ModelListCheck | None = None
) -> None:
    """Validate our settings as soon as the proxy has applied its whole config, and refuse to start on
    an invalid one. ``model_list_check`` (a callback's per-deployment settings) joins the check: the
    Router's model list is refused the same way when it finds a problem.

    Callback instances are built while LiteLLM is still reading ``litellm_settings`` (keys are applied in
    file order), so validating in ``__init__`` could miss keys that come later. Instead, when an event loop
    is running (the proxy's start-up), a task waits until the proxy's Router exists, the last step of
    config loading, and validates then. On an invalid setting it logs every problem with its key path and
    ends the process with status 78, before any request is served. Outside the proxy (SDK use: LiteLLM's
    proxy server module not loaded) or without a running loop nothing is scheduled; settings are then
    validated on first use.
    """
    global _startup_check_scheduled
    if not _litellm.proxy_server_loaded():
        return  # not the proxy (an SDK user's process, maybe inside an event loop): nothing to wait for
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if model_list_check is not None and model_list_check not in _model_list_checks:
        _model_list_checks.append(model_list_check)
    if _startup_check_scheduled:
        return
    _startup_check_scheduled = True

    async def check() -> None:
        waited = 0.0
        while _litellm.proxy_router() is None and waited < give_up_seconds:
            await asyncio.sleep(poll_seconds)
            waited += poll_seconds
        try:
            get_runtime().settings()
        except ConfigurationError as exc:
            print(f"litellm_ratebalance: refusing to start, {exc}", file=sys.stderr, flush=True)
            os._exit(EXIT_CONFIG)
        model_list = getattr(_litellm.proxy_router(), "model_list", None) or []
        problems = [problem for check in _model_list_checks for problem in check(model_list)]
        if problems:
            listed = "".join(f"\n  {problem}" for problem in problems)
            print(f"litellm_ratebalance: refusing to start, invalid model_info:{listed}", file=sys.stderr, flush=True)
            os._exit(EXIT_CONFIG)

    _spawn(check())


def get_runtime() -> Runtime:
    return _runtime


def configure(*, settings: Settings | None = None, store: Store | None = None, router: Any = None) -> None:
    """Hand settings, a store or a router to every adapter in this process (SDK and tests)."""
    _runtime.configure(settings=settings, store=store, router=router)


def reset_runtime() -> None:
    """Forget everything resolved so far, and stop the parts' background work (tests)."""
    global _runtime
    _runtime.registry.reset()
    _runtime = Runtime()


def is_store_error(exc: BaseException) -> bool:
    return isinstance(exc, StoreError)
