"""The demo's scripted load: open-loop request streams per caller and model group, and what each request got.

Every stream sends Poisson arrivals at a fixed rate for the run's duration (seeded, so two runs send the
same sequence), spread round robin over the proxy replicas, with at most ``max_in_flight`` of its own
requests open (a request that would exceed it waits: the load is bounded whatever the proxy does). Each
answer becomes a :class:`Record`, classified by :func:`classify` from its status, headers and body.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from litellm_ratebalance.demo.config import CHAT_GROUP, LOCAL_GROUP, QUOTA_GROUP

__all__ = [
    "CALLER_KEYS",
    "SCRIPT",
    "Outcome",
    "Record",
    "Stream",
    "classify",
    "client_limits",
    "limit_check",
    "run_script",
]

CALLER_KEYS = {"prod": "sk-demo-prod", "batch": "sk-demo-batch", "default": "sk-demo-anon"}
"""Caller (its priority as the limiter labels it) -> demo key (see ``demo_auth.py``)."""

REQUEST_TIMEOUT_S = 30.0
LIMITER_MESSAGES = ("Model capacity reached", "Priority-based rate limit exceeded")
BACKPRESSURE_REASON_HEADER = "x-litellm-backpressure-reason"

Outcome = Literal["ok", "limited", "shed", "failed"]
"""ok: 200. limited: 429 from the priority limiter. shed: 429/503 from backpressure. failed: anything else
(the deployment's error or 429 passed through after LiteLLM's retries, a timeout)."""


@dataclass(frozen=True)
class Stream:
    caller: str
    group: str
    rate: float
    """Requests per second (Poisson arrivals)."""
    max_tokens: int
    max_in_flight: int


SCRIPT: tuple[Stream, ...] = (
    # chat (limiter + routing + contracts): 8 requests/s offered against 6/s of capacity; batch floods.
    Stream("prod", CHAT_GROUP, 2.0, 40, 40),
    Stream("batch", CHAT_GROUP, 5.0, 40, 80),
    Stream("default", CHAT_GROUP, 1.0, 40, 20),
    # local (backpressure): ~6.5 requests/s of 32 tokens against a server that decodes ~5/s well.
    Stream("prod", LOCAL_GROUP, 1.5, 32, 40),
    Stream("batch", LOCAL_GROUP, 4.0, 32, 80),
    Stream("default", LOCAL_GROUP, 1.0, 32, 20),
)


@dataclass(frozen=True)
class Record:
    """One request as the client saw it (``sent`` in seconds since the run started)."""

    caller: str
    group: str
    replica: int
    sent: float
    latency: float
    status: int
    """HTTP status; 0 when no answer came (timeout, connection error)."""
    outcome: Outcome
    reason: str
    """Limiter: ``requests``/``tokens``; backpressure: its reason header; failed: the status or error type."""
    deployment: str | None
    """``x-litellm-model-id`` of a successful answer."""
    feature: str | None
    rpm_mode: str | None
    tpm_mode: str | None
    completion_tokens: int


def classify(status: int, headers: httpx.Headers, body: str) -> tuple[Outcome, str]:
    if status == 200:
        return "ok", ""
    shed_reason = headers.get(BACKPRESSURE_REASON_HEADER)
    if shed_reason:
        return "shed", shed_reason
    if status == 429 and any(text in body for text in LIMITER_MESSAGES):
        return "limited", "tokens" if "Rate limit type: tokens" in body else "requests"
    return "failed", str(status)


async def _send(
    clients: Sequence[httpx.AsyncClient], replica: int, caller: str, group: str, max_tokens: int, index: int
) -> tuple[int, httpx.Headers | None, str, float]:
    body = {
        "model": group,
        "messages": [{"role": "user", "content": f"Summarise demo request {index} in a sentence."}],
        "max_tokens": max_tokens,
    }
    started = time.monotonic()
    try:
        response = await clients[replica].post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {CALLER_KEYS[caller]}"},
            json=body,
            timeout=REQUEST_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        return 0, None, type(exc).__name__, time.monotonic() - started
    return response.status_code, response.headers, response.text, time.monotonic() - started


def _record(
    caller: str, group: str, replica: int, sent: float, answer: tuple[int, httpx.Headers | None, str, float]
) -> Record:
    status, headers, text, latency = answer
    if headers is None:
        return Record(caller, group, replica, sent, latency, 0, "failed", text, None, None, None, None, 0)
    outcome, reason = classify(status, headers, text)
    tokens = 0
    if outcome == "ok":
        try:
            tokens = int((httpx.Response(200, text=text).json().get("usage") or {}).get("completion_tokens", 0))
        except ValueError:
            tokens = 0
    return Record(
        caller=caller,
        group=group,
        replica=replica,
        sent=sent,
        latency=latency,
        status=status,
        outcome=outcome,
        reason=reason,
        deployment=headers.get("x-litellm-model-id") if outcome == "ok" else None,
        feature=headers.get("x-traffic-contract-feature"),
        rpm_mode=headers.get("x-traffic-contract-rpm-mode"),
        tpm_mode=headers.get("x-traffic-contract-tpm-mode"),
        completion_tokens=tokens,
    )


async def _stream(
    stream: Stream,
    clients: Sequence[httpx.AsyncClient],
    epoch: float,
    duration: float,
    seed: int,
    records: list[Record],
) -> None:
    rng = random.Random(f"{seed}/{stream.caller}/{stream.group}")
    gate = asyncio.Semaphore(stream.max_in_flight)
    tasks: list[asyncio.Task[None]] = []

    async def one(index: int, replica: int) -> None:
        try:
            sent = time.monotonic() - epoch
            answer = await _send(clients, replica, stream.caller, stream.group, stream.max_tokens, index)
            records.append(_record(stream.caller, stream.group, replica, sent, answer))
        finally:
            gate.release()

    at = rng.expovariate(stream.rate)
    index = 0
    while at < duration:
        await asyncio.sleep(max(0.0, epoch + at - time.monotonic()))
        await gate.acquire()
        tasks.append(asyncio.create_task(one(index, index % len(clients))))
        index += 1
        at += rng.expovariate(stream.rate)
    if tasks:
        await asyncio.gather(*tasks)


async def run_script(
    clients: Sequence[httpx.AsyncClient], duration: float, *, seed: int = 7, script: Sequence[Stream] = SCRIPT
) -> tuple[list[Record], float]:
    """Send every stream of ``script`` for ``duration`` seconds; returns the records and the run's epoch
    (``time.monotonic()`` at the start; records' ``sent`` count from it). Waits for every answer."""
    records: list[Record] = []
    epoch = time.monotonic()
    await asyncio.gather(*(_stream(stream, clients, epoch, duration, seed, records) for stream in script))
    return records, epoch


async def limit_check(clients: Sequence[httpx.AsyncClient], limit: int) -> list[Record]:
    """``3 x limit`` concurrent requests to the ``quota`` group (rpm = ``limit`` per limiter window), the
    three callers and the replicas taken in turn. The group is fresh, so its window starts with this burst
    and the burst fits in it: exactly ``limit`` must be admitted whatever the number of replicas, since the
    priorities' shares (0.6 + 0.3 + default 0.1) add up to the whole and each caller asks for more than its
    share."""
    callers = list(CALLER_KEYS)
    epoch = time.monotonic()

    async def one(index: int) -> Record:
        caller, replica = callers[index % len(callers)], index % len(clients)
        answer = await _send(clients, replica, caller, QUOTA_GROUP, 8, index)
        return _record(caller, QUOTA_GROUP, replica, time.monotonic() - epoch, answer)

    return list(await asyncio.gather(*(one(index) for index in range(3 * limit))))


def client_limits() -> dict[str, Any]:
    """httpx client options: no connection cap (bursts go out at once); idle connections dropped after 2 s,
    before uvicorn closes them at 5 s (reusing one it is closing fails with a ReadError)."""
    return {
        "timeout": httpx.Timeout(REQUEST_TIMEOUT_S),
        "limits": httpx.Limits(max_connections=None, max_keepalive_connections=200, keepalive_expiry=2.0),
    }
