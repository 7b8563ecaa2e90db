"""What every fault test needs: load that exceeds the limit, a record of what clients saw, window reads.

The load runs in **phases, one per limiter window**. A window of a model group starts with the first
request decided while none is live and lasts ``window_seconds`` (Redis ``TIME``). A phase sends steady
open-loop load (one request every ``interval_s`` per replica, each in its own task, so requests pile up in
flight as they would behind a load balancer) from the first request of a window until ``guard_s`` before
its end, then pauses until the window has ended. Every request of a phase is therefore decided in that
phase's window, and the window's counters read between two phases are final: the admitted requests of a
window are compared with its limit exactly, not by guessing from timestamps.

What a request ended with (:class:`Outcome`): an HTTP status, or ``error`` (the connection broke: a killed
replica) or ``refused`` (nothing listens). ``counted`` says an admission went through the store: the limiter
adds ``x-litellm-saturation`` only to an admission it decided in Redis (a fail-open admission has none).

The proxies themselves (configs for our limiter and for LiteLLM's own one, the module fixtures' body) are in
tests/faults/replicas.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.harness import LiteLLMProxy, chat_body

__all__ = [
    "ERROR",
    "GUARD_S",
    "INTERVAL_S",
    "REFUSED",
    "Load",
    "Outcome",
    "Recorder",
    "Target",
    "admitted",
    "by_status",
    "connected",
    "keys_without_ttl",
    "litellm_window_phase",
    "litellm_window_start",
    "load_for",
    "of_replica",
    "per_replica",
    "read_window",
    "recovery_times",
    "rounded",
    "send_one",
    "sigkill",
    "steady",
    "until_litellm_window_ends",
    "wait_until",
]

ERROR = "error"
"""The connection broke before a response (e.g. the replica was killed with the request in flight)."""
REFUSED = "refused"
"""The connection was refused (nothing listens: the replica is gone)."""
INTERVAL_S = 0.1
"""The pacing of steady load: one request per replica every ``INTERVAL_S``."""
GUARD_S = 0.8
"""A phase's load stops this long before its window ends, so every request of it is decided in that window."""

Target = tuple[LiteLLMProxy, httpx.AsyncClient]
"""A replica and the client that sends to it."""


@dataclass(frozen=True, slots=True)
class Outcome:
    replica: str
    sent: float
    """time.time() when sent (Redis TIME is the same clock on this machine)."""
    done: float
    status: int | str
    counted: bool
    retry_after: str | None
    error: str = ""

    @property
    def latency(self) -> float:
        return self.done - self.sent


def by_status(outcomes: Iterable[Outcome]) -> dict[int | str, int]:
    """``{status: count}`` sorted by status (ints first), for messages and the docs table."""
    counts = Counter(outcome.status for outcome in outcomes)
    return dict(sorted(counts.items(), key=lambda item: (isinstance(item[0], str), str(item[0]))))


def of_replica(outcomes: Iterable[Outcome], proxy: LiteLLMProxy) -> list[Outcome]:
    """The outcomes of ``proxy``'s requests."""
    return [o for o in outcomes if o.replica == proxy.name]


def per_replica(outcomes: Sequence[Outcome], proxies: Iterable[LiteLLMProxy]) -> dict[str, dict[int | str, int]]:
    """``{replica: by_status(its outcomes)}``, for reports."""
    return {p.name: by_status(of_replica(outcomes, p)) for p in proxies}


def admitted(outcomes: Iterable[Outcome]) -> int:
    """How many were admitted (status 200), whichever limiter decided."""
    return sum(o.status == 200 for o in outcomes)


def rounded(seconds: dict[str, float | None]) -> dict[str, float | None]:
    """``{replica: seconds}`` (as :func:`recovery_times` gives them) to the hundredth, for reports."""
    return {k: None if v is None else round(v, 2) for k, v in seconds.items()}


@dataclass(slots=True)
class Recorder:
    """Every outcome of a test, in the order they finished."""

    outcomes: list[Outcome] = field(default_factory=list)

    def between(self, start: float, end: float, replica: str | None = None) -> list[Outcome]:
        """Outcomes of requests sent in ``[start, end)`` (of one replica, if given)."""
        return [o for o in self.outcomes if start <= o.sent < end and (replica is None or o.replica == replica)]


async def send_one(
    client: httpx.AsyncClient, proxy: LiteLLMProxy, body: dict[str, Any], recorder: Recorder, token: str = "sk-none"
) -> Outcome:
    sent = time.time()
    try:
        response = await client.post("/v1/chat/completions", headers=proxy.auth(token), json=body)
    except httpx.ConnectError as exc:
        outcome = Outcome(proxy.name, sent, time.time(), REFUSED, False, None, type(exc).__name__)
    except httpx.TransportError as exc:
        outcome = Outcome(proxy.name, sent, time.time(), ERROR, False, None, type(exc).__name__)
    else:
        outcome = Outcome(
            proxy.name,
            sent,
            time.time(),
            response.status_code,
            response.status_code == 200 and "x-litellm-saturation" in response.headers,
            response.headers.get("retry-after"),
        )
    recorder.outcomes.append(outcome)
    return outcome


@asynccontextmanager
async def connected(proxies: Sequence[LiteLLMProxy]) -> AsyncIterator[list[Target]]:
    """A client per proxy (opened in order, closed in reverse), as ``[(proxy, client), ...]``."""
    async with AsyncExitStack() as stack:
        yield [(proxy, await stack.enter_async_context(proxy.async_client())) for proxy in proxies]


async def steady(
    targets: Sequence[Target],
    body: dict[str, Any],
    recorder: Recorder,
    *,
    until: float,
    interval_s: float,
    tasks: set[asyncio.Task[Outcome]],
    stop: asyncio.Event | None = None,
) -> None:
    """Open-loop load until ``until`` (time.time()) or ``stop``: one request per target every ``interval_s``,
    each in its own task (added to ``tasks``; the caller awaits them), so slow answers never slow the load."""
    while time.time() < until and not (stop is not None and stop.is_set()):
        for proxy, client in targets:
            task = asyncio.create_task(send_one(client, proxy, body, recorder))
            tasks.add(task)
        await asyncio.sleep(interval_s)


async def load_for(
    targets: Sequence[Target],
    recorder: Recorder,
    model: str,
    *,
    since: float,
    seconds: float,
    interval_s: float = INTERVAL_S,
) -> list[Outcome]:
    """Steady load (:func:`steady`) of ``model`` until ``since + seconds`` (time.time()); once every answer is in,
    what clients saw of the requests sent since ``since``."""
    tasks: set[asyncio.Task[Outcome]] = set()
    await steady(targets, chat_body(model), recorder, until=since + seconds, interval_s=interval_s, tasks=tasks)
    await asyncio.gather(*tasks)
    return recorder.between(since, time.time())


def read_window(client: redis.Redis | redis.RedisCluster, keys: KeySpace, model_group: str) -> dict[str, int]:
    """The window hash of ``model_group`` (a sync client without ``decode_responses``, plain or cluster)."""
    raw: dict[bytes, bytes] = client.hgetall(keys.admission_window(model_group))  # type: ignore[assignment]
    return {key.decode(): int(value) for key, value in raw.items()}


def keys_without_ttl(client: Any, prefix: str) -> list[str]:
    """Keys under ``prefix`` with no TTL (PTTL -1); ``client`` is a sync redis-py client (or cluster)."""
    missing = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        if client.pttl(key) == -1:
            missing.append(key.decode() if isinstance(key, bytes) else str(key))
    return missing


def sigkill(proxy: LiteLLMProxy) -> None:
    """SIGKILL the proxy's whole process group at once (no shutdown, nothing flushed), and reap it."""
    process = proxy._process
    assert process is not None, f"{proxy.name} is not running"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float, step_s: float = 0.05) -> float:
    """Poll ``check`` until it holds; return the seconds it took (AssertionError after ``timeout_s``)."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not reached within {timeout_s}s")
        await asyncio.sleep(step_s)


def recovery_times(outcomes: Iterable[Outcome], healed_at: float, hold_s: float = 1.0) -> dict[str, float | None]:
    """Per replica: seconds from ``healed_at`` to the first request from which on every answer was decided in
    Redis (a counted 200 or a 429) for at least ``hold_s``; None if not (yet)."""
    outcomes = list(outcomes)
    out: dict[str, float | None] = {}
    for replica in sorted({o.replica for o in outcomes}):
        mine = sorted((o for o in outcomes if o.replica == replica), key=lambda o: o.sent)
        good_from: float | None = None
        for o in mine:
            decided_in_redis = o.counted or o.status == 429
            if not decided_in_redis:
                good_from = None
            elif good_from is None:
                good_from = o.sent
        last = mine[-1].sent if mine else 0.0
        out[replica] = good_from - healed_at if good_from is not None and last - good_from >= hold_s else None
    return out


@dataclass(frozen=True, slots=True)
class Load:
    """The load of one test: its model group, window and pacing (see the module docstring)."""

    prefix: str
    model: str
    window_s: float
    interval_s: float = INTERVAL_S
    guard_s: float = GUARD_S

    @property
    def keys(self) -> KeySpace:
        return KeySpace(self.prefix)

    def window(self, sync: redis.Redis | redis.RedisCluster) -> dict[str, int]:
        return read_window(sync, self.keys, self.model)

    def keys_without_ttl(self, sync: redis.Redis | redis.RedisCluster) -> list[str]:
        """Keys under this load's prefix with no TTL (see :func:`keys_without_ttl`)."""
        return keys_without_ttl(sync, self.prefix)

    async def until_window_ends(self, sync: redis.Redis | redis.RedisCluster) -> None:
        """Sleep until the live window (if any) has ended."""
        counters = self.window(sync)
        if counters:
            await asyncio.sleep(max(0.0, counters["start"] / 1000 + self.window_s + 0.05 - time.time()))

    async def window_end(self, sync: redis.Redis | redis.RedisCluster, began: float) -> dict[str, int]:
        """Once a phase that began at ``began`` has sent its last request: check that it started a new window,
        wait until that window has ended and return its final counters."""
        counters = self.window(sync)
        assert counters["start"] >= began * 1000 - 50, "the phase did not start a new window"
        await self.until_window_ends(sync)
        final = self.window(sync)
        assert final["start"] == counters["start"], "a request was decided after the phase's window"
        return final

    async def window_phase(
        self,
        targets: Sequence[Target],
        recorder: Recorder,
        sync: redis.Redis | redis.RedisCluster,
    ) -> tuple[dict[str, int], list[Outcome]]:
        """One window of steady load, started by its first request (the previous window must have ended):
        the window's final counters and what clients saw."""
        began = time.time()
        tasks: set[asyncio.Task[Outcome]] = set()
        await steady(
            targets,
            chat_body(self.model),
            recorder,
            until=began + self.window_s - self.guard_s,
            interval_s=self.interval_s,
            tasks=tasks,
        )
        await asyncio.gather(*tasks)
        final = await self.window_end(sync, began)
        return final, recorder.between(began, time.time())

    async def until_recovered(
        self,
        targets: Sequence[Target],
        recorder: Recorder,
        healed_at: float,
        timeout_s: float = 10.0,
    ) -> dict[str, float | None]:
        """Steady load from now until every replica decides in Redis again (see :func:`recovery_times`), at most
        ``timeout_s``; returns the seconds each took from ``healed_at``."""
        tasks: set[asyncio.Task[Outcome]] = set()
        stop = asyncio.Event()
        load = asyncio.create_task(
            steady(
                targets,
                chat_body(self.model),
                recorder,
                until=time.time() + timeout_s,
                interval_s=self.interval_s,
                tasks=tasks,
                stop=stop,
            )
        )
        names = [proxy.name for proxy, _ in targets]
        while not load.done():
            await asyncio.sleep(0.2)
            recovered = recovery_times(recorder.between(healed_at, time.time()), healed_at)
            if all(recovered.get(name) is not None for name in names):
                break
        stop.set()
        await load
        await asyncio.gather(*tasks)
        return recovery_times(recorder.between(healed_at, time.time()), healed_at)


async def litellm_window_start() -> float:
    """Sleep until just after the next whole second (LiteLLM's windows start in whole seconds of Redis
    ``TIME``: see :func:`litellm_window_phase`); the time.time() a phase begun now begins at."""
    await asyncio.sleep(1.02 - time.time() % 1)
    return time.time()


async def until_litellm_window_ends(began: float, window_s: int) -> None:
    """Sleep until the LiteLLM window started by a phase that began at ``began`` has ended."""
    await asyncio.sleep(max(0.0, int(began) + window_s + 0.05 - time.time()))


async def litellm_window_phase(
    targets: Sequence[Target],
    recorder: Recorder,
    model: str,
    *,
    window_s: int,
    interval_s: float = INTERVAL_S,
    guard_s: float = GUARD_S,
) -> list[Outcome]:
    """One window of steady load for LiteLLM's own limiter (``parallel_request_limiter_v3``). Its windows start
    with the first request in whole seconds of Redis ``TIME`` (one that starts at 12.7 s ends at 15.0 s for
    ``window_s`` 3), so the phase begins just after a second boundary, stops ``guard_s`` before its window can
    end and returns once it has ended (the previous one must have ended too)."""
    began = await litellm_window_start()
    tasks: set[asyncio.Task[Outcome]] = set()
    await steady(
        targets, chat_body(model), recorder, until=began + window_s - guard_s, interval_s=interval_s, tasks=tasks
    )
    await asyncio.gather(*tasks)
    await until_litellm_window_ends(began, window_s)
    return recorder.between(began, time.time())
