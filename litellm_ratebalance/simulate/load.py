"""Open-loop load driver and its measures: send a scenario's planned requests on time, record what each got.

A request without ``max_tokens`` in its plan is sent without one (the server decides the answer's length).
A *sender* turns one :class:`~litellm_ratebalance.simulate.scenarios.PlannedRequest` into a :class:`Reply`
(it raises on failure); :func:`router_sender` sends through a ``litellm.Router``, :func:`proxy_sender` over
HTTP to a LiteLLM proxy. :func:`run_load` fires every request at its planned offset from an epoch (bounded by
``max_in_flight`` and a hard per-request deadline), and :func:`summarise` reduces the results.

Effective token rate of a request = ``(output_tokens + input_tokens / ratio) / latency`` for a success, 0 for a
failure (a failed request delivered nothing, the same reading the rate balancer gives it).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from litellm_ratebalance.simulate.scenarios import PlannedRequest

__all__ = [
    "Reply",
    "RequestResult",
    "Summary",
    "effective_rate",
    "percentile",
    "proxy_sender",
    "router_sender",
    "run_load",
    "summarise",
]

REQUEST_ID_HEADER = "x-bench-request-id"


@dataclass(frozen=True)
class Reply:
    """What a sender got back from one successful request."""

    prompt_tokens: int
    completion_tokens: int
    deployment: str | None
    """Model id of the deployment that served it, when the response says."""
    ttft: float | None = None
    """Seconds to the first streamed content, for streams."""


@dataclass(frozen=True)
class RequestResult:
    """One request's outcome, times in seconds (``started`` counts from the run's epoch)."""

    index: int
    started: float
    latency: float
    ok: bool
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    deployment: str | None
    ttft: float | None
    error: str | None


Sender = Callable[[PlannedRequest], Awaitable[Reply]]


def effective_rate(result: RequestResult, ratio: float) -> float:
    if not result.ok or result.latency <= 0:
        return 0.0
    return (result.completion_tokens + result.prompt_tokens / ratio) / result.latency


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q`` percentile (0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    """Figures of one run."""

    requests: int
    mean_rate: float
    """Mean effective token rate over all requests (failures count 0)."""
    p5_rate: float
    p50_latency: float
    """Over successful requests."""
    p95_latency: float
    """Over successful requests."""
    goodput: float
    """Output tokens of successful requests per second, from the epoch to the last completion."""
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)
    p95_latency_all: float = math.nan
    """Over every request, a failed one at the time it took to fail (a timeout at the timeout): what a
    client waited, whatever came back. A strategy can lower the p95 of successful requests by sending more
    requests where they fail fast; this one does not reward that."""


def summarise(results: Sequence[RequestResult], ratio: float = 250.0) -> Summary:
    rates = [effective_rate(r, ratio) for r in results]
    ok = [r for r in results if r.ok]
    latencies = [r.latency for r in ok]
    span = max((r.started + r.latency for r in results), default=0.0)
    kinds: dict[str, int] = {}
    for r in results:
        if not r.ok:
            kinds[r.error or "error"] = kinds.get(r.error or "error", 0) + 1
    return Summary(
        requests=len(results),
        mean_rate=sum(rates) / len(rates) if rates else math.nan,
        p5_rate=percentile(rates, 5),
        p50_latency=percentile(latencies, 50),
        p95_latency=percentile(latencies, 95),
        goodput=sum(r.completion_tokens for r in ok) / span if span > 0 else 0.0,
        errors=len(results) - len(ok),
        error_kinds=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        p95_latency_all=percentile([r.latency for r in results], 95),
    )


def _error_name(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    return f"{name}({status})" if isinstance(status, int) else name


async def run_load(
    plan: Iterable[PlannedRequest],
    send: Sender,
    *,
    epoch: float,
    deadline: float,
    max_in_flight: int = 128,
    on_done: Callable[[PlannedRequest], None] | None = None,
) -> list[RequestResult]:
    """Send every planned request at ``epoch + request.at`` (wall clock), each cut off after ``deadline``
    seconds, at most ``max_in_flight`` at once (a late slot delays the send; latency counts from the send).
    ``on_done`` is called once per request when it is over, success or not. Returns results in plan order."""
    slots = asyncio.Semaphore(max_in_flight)

    async def one(request: PlannedRequest) -> RequestResult:
        delay = epoch + request.at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with slots:
            started = time.perf_counter()
            started_wall = time.time() - epoch
            try:
                reply = await asyncio.wait_for(send(request), deadline)
            except Exception as exc:  # every failure is a result, never a crash of the run
                error = "DriverTimeout" if isinstance(exc, asyncio.TimeoutError) else _error_name(exc)
                return RequestResult(
                    request.index,
                    started_wall,
                    time.perf_counter() - started,
                    False,
                    request.stream,
                    request.prompt_tokens,
                    0,
                    None,
                    None,
                    error,
                )
            finally:
                if on_done is not None:
                    on_done(request)
            return RequestResult(
                request.index,
                started_wall,
                time.perf_counter() - started,
                True,
                request.stream,
                reply.prompt_tokens,
                reply.completion_tokens,
                reply.deployment,
                reply.ttft,
                None,
            )

    return list(await asyncio.gather(*(one(r) for r in plan)))


def router_sender(router: Any, model: str, *, timeout: float) -> Sender:
    """Send through ``router.acompletion`` (streams consumed to the end, usage from the final chunk). The
    request id travels as ``metadata["bench_request_id"]`` (for strategies) and as the
    ``x-bench-request-id`` header (for the mock's log)."""

    async def send(request: PlannedRequest) -> Reply:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": request.messages(),
            "timeout": timeout,
            "metadata": {"bench_request_id": str(request.index)},
            "extra_headers": {REQUEST_ID_HEADER: str(request.index)},
        }
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        if not request.stream:
            response = await router.acompletion(**kwargs)
            usage = response.usage
            model_id = (getattr(response, "_hidden_params", None) or {}).get("model_id")
            return Reply(usage.prompt_tokens, usage.completion_tokens, model_id)
        started = time.perf_counter()
        stream = await router.acompletion(stream=True, stream_options={"include_usage": True}, **kwargs)
        ttft: float | None = None
        prompt_tokens = completion_tokens = 0
        async for chunk in stream:
            if ttft is None and chunk.choices and getattr(chunk.choices[0].delta, "content", None):
                ttft = time.perf_counter() - started
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                prompt_tokens, completion_tokens = usage.prompt_tokens, usage.completion_tokens
        model_id = (getattr(stream, "_hidden_params", None) or {}).get("model_id")
        return Reply(prompt_tokens, completion_tokens, model_id, ttft)

    return send


class ProxyHTTPError(Exception):
    """A non-200 answer from the proxy."""

    def __init__(self, status_code: int, body: str) -> None:
        super().__init__(f"HTTP {status_code}: {body[:200]}")
        self.status_code = status_code


def proxy_sender(session: ClientSession, base_url: str, api_key: str, model: str, *, timeout: float) -> Sender:
    """Send to a LiteLLM proxy's ``/v1/chat/completions`` over HTTP (SSE parsed for streams); the deployment
    comes from the proxy's ``x-litellm-model-id`` response header."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}", REQUEST_ID_HEADER: "?"}
    client_timeout = ClientTimeout(total=timeout)

    async def send(request: PlannedRequest) -> Reply:
        body: dict[str, Any] = {"model": model, "messages": request.messages()}
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        request_headers = {**headers, REQUEST_ID_HEADER: str(request.index)}
        started = time.perf_counter()
        async with session.post(url, json=body, headers=request_headers, timeout=client_timeout) as response:
            if response.status != 200:
                raise ProxyHTTPError(response.status, await response.text())
            model_id = response.headers.get("x-litellm-model-id")
            if not request.stream:
                data = await response.json()
                usage = data.get("usage") or {}
                return Reply(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), model_id)
            ttft: float | None = None
            prompt_tokens = completion_tokens = 0
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                choices = chunk.get("choices") or []
                if ttft is None and choices and (choices[0].get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - started
                usage = chunk.get("usage")
                if usage:
                    prompt_tokens, completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
            return Reply(prompt_tokens, completion_tokens, model_id, ttft)

    return send
