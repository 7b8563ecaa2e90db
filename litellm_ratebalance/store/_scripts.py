"""Loading of the packaged Lua scripts and running them with NOSCRIPT recovery.

Each ``lua/<name>.lua`` file is one atomic operation and opens with a comment stating its KEYS, ARGV
(with units), return value and clock (always Redis ``TIME``). Scripts are registered with redis-py's
``register_script``, whose ``AsyncScript`` sends EVALSHA and reloads the script on NOSCRIPT (after a
``SCRIPT FLUSH`` or a Redis restart); we never hand-roll EVALSHA.

Around each call the runner adds what a shared Redis under bursts and restarts needs:

* a gate (an ``asyncio.Semaphore`` per event loop) sized to the connection pool, so a burst waits for a
  free connection instead of failing with ``MaxConnectionsError`` (the async ``RedisCluster`` and a plain
  ``ConnectionPool`` do not wait by themselves); the wait is bounded by the same timeout as the call;
* a cluster client is initialised (slot map read) once, under a lock, before the first script and again
  when redis-py marks it for re-discovery after a connection error: a burst of commands on a client that
  initialises itself concurrently can run some of them twice;
* on a connection error the pool's idle connections are dropped and the busy ones marked for reconnect,
  so after a Redis restart the stale connections fail once together, not one by one (each one re-opening
  the circuit breaker);
* a script on a cluster slot that is being migrated, whose keys already sit on the importing node (the
  ASK state), is sent as ASKING and EVAL on one connection (:func:`_eval_following_redirects`): redis-py's
  asyncio cluster client sends ASKING and the command on two pooled connections, so the importing node
  answers MOVED and the client gives up with ``TTL exhausted``;
* every failure, including an unexpected exception from the client, becomes :class:`StoreError` (whose
  message never carries credentials), so callers apply their fail mode instead of crashing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import AskError, ClusterError, MovedError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from litellm_ratebalance.errors import StoreError, StoreFault, redact
from litellm_ratebalance.store.loop_clock import LagWatermark, LoopStallClock, ResponsiveDeadline, StallTimeout

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "LATE_REPLY_SECONDS",
    "CallObserver",
    "CallTally",
    "ScriptRunner",
    "load_lua",
    "map_late",
    "wall_cap",
]

ASK_STATE_SECONDS = 2.0
"""After a script on a slot needed the ASK path, later scripts on that slot take it first for this long (a
migration's ASK state lasts while its keys move), instead of running redis-py's redirect loop out again."""

_MAX_REDIRECTS = 5

DEFAULT_MAX_IN_FLIGHT = 500
"""Concurrent store calls per process and event loop when nothing smaller is known (the default of
``ratebalance.redis_max_connections``)."""

try:
    from redis.exceptions import MaxConnectionsError as _POOL_EXHAUSTED
except ImportError:  # redis-py before 6
    _POOL_EXHAUSTED = ()  # type: ignore[assignment,misc]


LATE_REPLY_SECONDS = 30.0
"""How long a store call that timed out may still run: its reply, if Redis sends one, is handed to the caller's
reconciliation (a reservation to give back, a lease to release). A dead Redis's connection is then given up."""

WALL_CAP_FACTOR = 60.0
WALL_CAP_MIN_SECONDS = 30.0

CallObserver = Callable[[StoreFault | None, float], None]
"""Told of each store call: its fault (``None``: it succeeded) and its duration in seconds."""


def wall_cap(timeout_seconds: float) -> float:
    """The most a store call waits in wall-clock time, however much of it the event loop spent stalled:
    ``max(60 x timeout, 30 s)``. Past it the call fails as :attr:`StoreFault.BUSY` (this process, not Redis).

    Generous on purpose: a process whose loop is stalled serves every request late anyway, and failing open
    then only adds the requests the limit was there to refuse (a 1000-request burst on two busy cores
    stalled a replica's loop for 5.4 s of a 5.5 s wait)."""
    return max(WALL_CAP_FACTOR * timeout_seconds, WALL_CAP_MIN_SECONDS)


_INCLUDE = "--#include "


@cache
def load_lua(name: str) -> str:
    """Return the source of the packaged script ``lua/<name>.lua``, each ``--#include <other>`` line replaced
    by the source of ``lua/<other>.lua`` (a function shared by several scripts: one EVAL carries it all)."""
    source = resources.files("litellm_ratebalance.store").joinpath("lua", f"{name}.lua").read_text("utf-8")
    return "".join(
        load_lua(line.removeprefix(_INCLUDE).strip()) if line.startswith(_INCLUDE) else line
        for line in source.splitlines(keepends=True)
    )


class _GateTimeout(Exception):
    """No free connection slot within the call's timeout (the process is busy; Redis is not down)."""


class _CallTimeout(Exception):
    """Redis did not answer within the deadline; ``late`` is the call, still running."""

    def __init__(self, timeout: StallTimeout, late: asyncio.Task[Any]) -> None:
        super().__init__(str(timeout))
        self.timeout = timeout
        self.late = late


def map_late(late: asyncio.Future[Any] | None, decode: Callable[[Any], Any]) -> asyncio.Future[Any] | None:
    """A future of ``decode(reply)`` for the late reply ``late`` (``None`` stays ``None``): how a store part
    hands its callers a timed-out call's decoded outcome. Its exception, if any, never logs as unretrieved
    (most callers of read-only operations ignore late replies)."""
    if late is None:
        return None
    decoded: asyncio.Future[Any] = late.get_loop().create_future()

    def relay(done: asyncio.Future[Any]) -> None:
        if decoded.done():
            return
        if done.cancelled():
            decoded.cancel()
            return
        error = done.exception()
        if error is None:
            try:
                decoded.set_result(decode(done.result()))
                return
            except Exception as exc:  # a reply we cannot decode is an error like any other
                error = exc
        decoded.set_exception(error)
        decoded.exception()  # marks it retrieved

    late.add_done_callback(relay)
    return decoded


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a late call's exception as seen (nobody may await it; asyncio would log it as never retrieved)."""
    if not task.cancelled():
        task.exception()


def _fault_of(exc: BaseException) -> StoreFault:
    if isinstance(exc, _POOL_EXHAUSTED):
        return StoreFault.POOL
    # Before OSError: TimeoutError is one (a socket timeout of the client's own).
    if isinstance(exc, (TimeoutError, RedisTimeoutError)):
        return StoreFault.TIMEOUT
    if isinstance(exc, (RedisConnectionError, OSError)):
        return StoreFault.CONNECTION
    return StoreFault.ERROR


@dataclass(slots=True)
class _LoopState:
    """Per event loop: asyncio primitives bind to the loop that first waits on them."""

    loop: asyncio.AbstractEventLoop
    gate: asyncio.Semaphore
    limit: int
    clock: LoopStallClock
    init_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    lag_readers: dict[str, LagWatermark] = field(default_factory=dict)


@dataclass(slots=True)
class CallTally:
    """Store calls over an interval: how many, the slowest, and the faults by cause."""

    calls: int = 0
    slowest_seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)

    def add(self, fault: StoreFault | None, seconds: float) -> None:
        self.calls += 1
        if seconds > self.slowest_seconds:
            self.slowest_seconds = seconds
        if fault is not None:
            self.faults[fault.value] = self.faults.get(fault.value, 0) + 1


class ScriptRunner:
    """Runs packaged scripts on one ``redis.asyncio`` client (plain or cluster).

    Redis failures become :class:`StoreError` with the original error as ``__cause__``; the message never
    contains credentials (see :func:`litellm_ratebalance.errors.redact`).
    """

    __slots__ = (
        "_asking_slots",
        "_broken_until",
        "_client",
        "_cooldown",
        "_initialized",
        "_late_reply_seconds",
        "_max_in_flight",
        "_observer",
        "_scripts",
        "_state",
        "_tally",
        "_timeout",
        "_wall_cap",
    )

    def __init__(
        self,
        client: Any | Callable[[], Any],
        *,
        timeout_seconds: float = 0.5,
        cooldown_seconds: float = 1.0,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        late_reply_seconds: float = LATE_REPLY_SECONDS,
        observer: CallObserver | None = None,
    ) -> None:
        """``timeout_seconds``: how long Redis may take to answer, counted while this process's event loop
        was free to read the answer (:mod:`.loop_clock`), and never more than :func:`wall_cap` in all; it
        bounds the wait for a connection slot (only when all are busy) and the call together.
        ``cooldown_seconds``: after a fault of Redis (not of this process), calls fail at once for that
        long instead of each waiting for Redis again (a circuit breaker: a down Redis must not add its
        timeout to every request). ``max_in_flight``: at most this many calls at once per event loop, and
        never more than the client's pool allows (per node for a cluster). ``late_reply_seconds``: how
        long a call that timed out may still run for its late reply before it is cancelled. ``observer``
        is told of every call's outcome (``None`` or its fault) and duration."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        # A callable is asked for the client at each call: LiteLLM may replace its cached client.
        self._client = client
        self._scripts: dict[str, Any] = {}
        self._timeout = timeout_seconds
        self._wall_cap = wall_cap(timeout_seconds)
        self._cooldown = cooldown_seconds
        self._late_reply_seconds = late_reply_seconds
        self._observer = observer
        self._tally = CallTally()
        self._broken_until = 0.0
        self._max_in_flight = max_in_flight
        self._state: _LoopState | None = None
        self._initialized: Any = None
        """The cluster client last initialised here (a replaced client is initialised again)."""
        self._asking_slots: dict[int, float] = {}
        """Cluster slots seen in the ASK state, with the monotonic time until which scripts on them go
        straight to :func:`_eval_following_redirects`."""

    @property
    def client(self) -> Any:
        client = self._client
        if callable(client) and not hasattr(client, "execute_command"):
            return client()
        return client

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` atomically with ``keys`` and ``args``; return its raw reply."""
        return await self.call(f"redis script {name!r}", lambda client: self._run_script(client, name, keys, args))

    async def _run_script(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        if not keys or not _is_cluster(client):
            return await self._script(client, name)(keys=keys, args=args, client=client)
        slot = int(client.keyslot(keys[0]))
        until = self._asking_slots.get(slot)
        if until is not None:
            if time.monotonic() < until:
                return await _eval_following_redirects(client, slot, load_lua(name), keys, args)
            del self._asking_slots[slot]
        try:
            return await self._script(client, name)(keys=keys, args=args, client=client)
        except ClusterError:
            # redis-py ran out of redirects. In the ASK state that is its own ASKING on another connection
            # (see the module docstring): follow the redirects here. Anything else fails again just the same.
            reply = await _eval_following_redirects(client, slot, load_lua(name), keys, args)
            self._asking_slots[slot] = time.monotonic() + ASK_STATE_SECONDS
            return reply

    async def call(self, what: str, operation: Callable[[Any], Awaitable[Any]], *, probe: bool = False) -> Any:
        """Run ``operation(client)`` with the gate, cluster initialisation, timeout, breaker and error
        mapping of :meth:`run` (for a plain command such as ``HGETALL``); ``what`` names it in errors.
        A ``probe`` (a health check) is sent even while the breaker is open; its success closes it.

        The timeout counts responsive time only (see :mod:`.loop_clock`): a reply this process was too busy
        to read is waited for, up to the wall-clock cap. A call that times out is not cancelled: the
        :class:`StoreError` carries it as ``late``, whose result is the reply if one comes within
        ``late_reply_seconds`` (what the script did in Redis, for the caller to reconcile)."""
        if not probe and self._broken_until and time.monotonic() < self._broken_until:
            raise StoreError(
                f"{what} skipped: Redis failed less than {self._cooldown:g}s ago", cause=StoreFault.BREAKER
            )
        client: Any = None
        started = time.perf_counter()
        try:
            client = self.client
            state = self._loop_state(client)
            deadline = ResponsiveDeadline(state.clock, self._timeout, self._wall_cap)
            reply = await self._gated(client, state, deadline, operation)
        except _GateTimeout as exc:
            # Every connection slot stayed busy for the whole timeout: this process is overloaded, Redis is
            # not down, so fail this call only (no breaker).
            self._observe(StoreFault.POOL, started)
            raise StoreError(
                f"{what} failed: no free Redis connection within {self._timeout:g}s", cause=StoreFault.POOL
            ) from exc.__cause__
        except _CallTimeout as exc:
            busy = exc.timeout.busy
            cause = StoreFault.BUSY if busy else StoreFault.TIMEOUT
            if not busy:
                # Redis did not answer within the timeout while this process was free to read the answer.
                self._broken_until = time.monotonic() + self._cooldown
            self._observe(cause, started)
            raise StoreError(f"{what} failed: {exc.timeout}", cause=cause, late=exc.late) from exc.timeout
        except Exception as exc:
            cause = _fault_of(exc)
            if cause is not StoreFault.POOL:
                # A busy client (its pool exhausted) is not a down Redis: only other faults open the breaker.
                self._broken_until = time.monotonic() + self._cooldown
            if client is not None and isinstance(exc, (RedisConnectionError, OSError)):
                await _drop_stale_connections(client)
            self._observe(cause, started)
            raise StoreError(f"{what} failed: {type(exc).__name__}: {_safe(exc)}", cause=cause) from exc
        self._broken_until = 0.0
        self._observe(None, started)
        return reply

    def _observe(self, fault: StoreFault | None, started: float) -> None:
        seconds = time.perf_counter() - started
        self._tally.add(fault, seconds)
        observer = self._observer
        if observer is not None:
            observer(fault, seconds)

    def _script(self, client: Any, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = client.register_script(load_lua(name))
            self._scripts[name] = script
        return script

    async def _gated(
        self,
        client: Any,
        state: _LoopState,
        deadline: ResponsiveDeadline,
        operation: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        gate = state.gate
        if gate.locked():
            # Every slot is busy: wait for one, within the call's deadline.
            acquiring = asyncio.ensure_future(gate.acquire())
            try:
                await deadline.wait(acquiring)
            except StallTimeout as exc:
                acquiring.cancel()
                if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                    gate.release()  # acquired in the same iteration the deadline ran out
                raise _GateTimeout from exc
        else:
            await gate.acquire()  # a free slot: returns at once
        # The call runs in a task of its own that keeps its gate slot until Redis answers: if the deadline
        # runs out first, the caller goes on (per its fail mode) and the task is kept as the late reply.
        reply: asyncio.Future[Any] = state.loop.create_future()
        call = state.loop.create_task(self._call_then_release(client, operation, gate, reply))
        alarm = deadline.arm(reply)
        try:
            return await reply
        except StallTimeout as exc:
            call.add_done_callback(_retrieve)
            state.loop.call_later(self._late_reply_seconds, call.cancel)
            raise _CallTimeout(exc, call) from None
        finally:
            alarm.cancel()

    async def _call_then_release(
        self,
        client: Any,
        operation: Callable[[Any], Awaitable[Any]],
        gate: asyncio.Semaphore,
        reply: asyncio.Future[Any],
    ) -> Any:
        """Run the call and hand its outcome to ``reply``; once the caller stopped waiting (``reply`` failed with
        the timeout), the outcome is this task's own: the late reply."""
        try:
            result = await self._ready_then(client, operation)
        except BaseException as exc:
            if reply.done():
                raise  # late: the error is the late outcome
            if isinstance(exc, asyncio.CancelledError):
                reply.cancel()
                raise
            reply.set_exception(exc)  # the caller has it; the task itself ends quietly
            return None
        finally:
            gate.release()
        if not reply.done():
            reply.set_result(result)
        return result

    async def _ready_then(self, client: Any, operation: Callable[[Any], Awaitable[Any]]) -> Any:
        if _is_cluster(client) and (client is not self._initialized or getattr(client, "_initialize", False)):
            await self._initialize(self._loop_state(client), client)
        return await operation(client)

    async def _initialize(self, state: _LoopState, client: Any) -> None:
        # One initialisation at a time; the calls that queued behind it find the client ready. redis-py sets
        # ``_initialize`` again after a connection error, so re-discovery also happens here, once.
        async with state.init_lock:
            if client is not self._initialized or getattr(client, "_initialize", False):
                await client.initialize()
                self._initialized = client

    def _loop_state(self, client: Any) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._state
        if state is None or state.loop is not loop:
            limit = min(self._max_in_flight, _pool_limit(client) or self._max_in_flight)
            if state is not None:
                state.clock.close()
            state = _LoopState(loop=loop, gate=asyncio.Semaphore(limit), limit=limit, clock=LoopStallClock(loop))
            self._state = state
        return state

    def take_loop_lag(self, reader: str) -> float:
        """The longest event-loop stall since ``reader`` last asked (each reader sees each stall once; 0
        before the first store call)."""
        state = self._state
        if state is None:
            return 0.0
        mark = state.lag_readers.get(reader)
        if mark is None:
            mark = state.lag_readers[reader] = state.clock.watermark()
        return mark.take()

    def take_tally(self) -> CallTally:
        """What the calls since the last take came to (for the replica report), and start over."""
        tally, self._tally = self._tally, CallTally()
        return tally

    @property
    def max_in_flight(self) -> int | None:
        """The gate's size on the current loop (``None`` before the first call)."""
        return None if self._state is None else self._state.limit


def _is_cluster(client: Any) -> bool:
    try:
        from redis.asyncio.cluster import RedisCluster
    except ImportError:  # pragma: no cover - every redis-py we support has it
        return False
    return isinstance(client, RedisCluster)


async def _eval_following_redirects(client: Any, slot: int, script: str, keys: list[str], args: list[Any]) -> Any:
    """Run ``script`` with EVAL on the node that serves ``slot`` on a cluster ``client``, following MOVED to the
    node named and ASK with ASKING and EVAL written together on one connection of the importing node.

    EVAL rather than EVALSHA: the importing node may not have the script cached, and this path is rare (a slot
    migration). Raises what the node answers otherwise, and :class:`ClusterError` when the redirects do not
    settle within a few hops."""
    command = ("EVAL", script, len(keys), *keys, *args)
    node = client.nodes_manager.get_node_from_slot(slot)
    for _ in range(_MAX_REDIRECTS):
        try:
            return await node.execute_command(*command)
        except MovedError as exc:
            node = _known_node(client, exc.host, exc.port, exc)
        except AskError as exc:
            return await _asking_then(_known_node(client, exc.host, exc.port, exc), command)
    raise ClusterError(f"slot {slot}: redirects did not settle within {_MAX_REDIRECTS} hops")


def _known_node(client: Any, host: str, port: int, redirect: Exception) -> Any:
    node = client.get_node(host=host, port=port)
    if node is None:  # a node the slot map does not know yet: let the caller's re-discovery find it
        raise redirect
    return node


async def _asking_then(node: Any, command: tuple[Any, ...]) -> Any:
    """Send ASKING and ``command`` in one write on a connection of our own to ``node`` (ASKING allows only the
    next command on its own connection); return the command's reply.

    The connection is opened for this call and closed after it, not taken from the node's pool: while a slot
    migrates, the cluster client re-reads the slot map on other calls' redirects and disconnects the
    connections of the node objects it replaces, which failed a pooled connection in the middle of this
    exchange. The ASK state is short (a migration's keys moving), so a connection per call is cheap."""
    connection = node.connection_class(**node.connection_kwargs)
    try:
        await connection.connect()
        await connection.send_packed_command(connection.pack_commands([("ASKING",), command]))
        asking_error: ResponseError | None = None
        try:
            await connection.read_response()  # OK
        except ResponseError as exc:
            asking_error = exc
        reply = await connection.read_response()
        if asking_error is not None:
            raise asking_error
        return reply
    finally:
        await connection.disconnect()


def _pool_limit(client: Any) -> int | None:
    """Connections the client can open at once: its pool's size, or per node for a cluster client."""
    if _is_cluster(client):
        # Per node; before initialisation only the startup nodes are known, which carry the same setting.
        nodes_manager = getattr(client, "nodes_manager", None)
        kwargs = getattr(nodes_manager, "connection_kwargs", None)
        limit = kwargs.get("max_connections") if isinstance(kwargs, dict) else None
        return limit if isinstance(limit, int) and limit > 0 else None
    pool = getattr(client, "connection_pool", None)
    limit = getattr(pool, "max_connections", None)
    return limit if isinstance(limit, int) and limit > 0 else None


async def _drop_stale_connections(client: Any) -> None:
    """After a connection error: close the pool's idle connections (after a Redis restart they are all
    stale) and mark the busy ones to reconnect when released. The cluster client does this itself."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or _is_cluster(client):
        return
    try:
        mark = getattr(pool, "update_active_connections_for_reconnect", None)
        if mark is not None:
            await mark()
        await pool.disconnect(inuse_connections=False)
    except Exception:  # best effort: the next call reconnects anyway
        return


def _safe(exc: BaseException) -> str:
    return redact(str(exc))
