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
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from litellm_ratebalance.store.keys import KeySpace
from tests.e2e.harness import LiteLLMProxy, chat_body

__all__ = [
    "ERROR",
    "REFUSED",
    "Outcome",
    "Phase",
    "Recorder",
    "by_status",
    "keys_without_ttl",
    "read_window",
    "send_one",
    "sigkill",
    "steady",
    "wait_until",
]

ERROR = "error"
"""The connection broke before a response (e.g. the replica was killed with the request in flight)."""
REFUSED = "refused"
"""The connection was refused (nothing listens: the replica is gone)."""


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


async def steady(
    targets: Sequence[tuple[LiteLLMProxy, httpx.AsyncClient]],
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


@dataclass(frozen=True, slots=True)
class Phase:
    """One window's worth of load: the window as Redis holds it once the phase is over."""

    window_start_ms: int
    requests: int
    """The window's request counter (``r``): every admission decided in it, whoever served it."""
    sent_from: float
    sent_to: float


def read_window(client: redis.Redis, keys: KeySpace, model_group: str) -> dict[str, int]:
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


@contextlib.asynccontextmanager
async def clients_for(proxies: Sequence[LiteLLMProxy]) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(proxy.async_client()) for proxy in proxies]


def body(model: str) -> dict[str, Any]:
    return chat_body(model)
