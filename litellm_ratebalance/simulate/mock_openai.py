"""Mock OpenAI-compatible deployments on loopback, with a known, controllable true behaviour.

Each :class:`MockDeployment` is a small aiohttp server on its own ``127.0.0.1`` port serving
``POST /v1/chat/completions`` (plain JSON, or SSE when ``stream`` is set, with a final usage chunk when
``stream_options.include_usage`` asks for one, as OpenAI does). What a request experiences follows the
deployment's :class:`Behaviour` at the moment it arrives:

- The answer's length: the ``[answer:N]`` tag in the prompt when there is one (the length the "model" would
  write for this prompt), else ``max_tokens``, else ``default_max_tokens``; ``max_tokens`` caps it (finish reason
  ``length``, else ``stop``). So a request without ``max_tokens``, or with one far above the answer, gets the
  length the server decides, as from a real model.
- ``base_latency`` seconds of fixed delay, then prefill at ``prefill_rate`` input tokens/s, then decoding at
  the *true token rate* (``token_rate``, optionally a sine wave around it) times a per-request lognormal
  ``jitter`` factor. Up to ``capacity`` requests run at full speed; beyond that they share the capacity
  (``overload="share"``: each runs at ``capacity / active`` of its speed) or wait for a slot
  (``overload="queue"``).
- Failure modes: ``rate_limited`` answers every request 429 with ``retry-after`` (a burst while it is set),
  ``tpm``/``rpm`` budgets over a sliding ``limit_window`` answer 429 once spent and feed the
  ``x-ratelimit-remaining-tokens/requests`` headers on every response, ``error_rate`` answers 5xx after
  ``error_latency``, ``stall_rate`` hangs a request for ``stall_seconds`` before its first byte.

Behaviour changes over time through a *timeline* of :class:`Change` entries (seconds since the deployment's
epoch), fixed up front so a run is reproducible and an oracle can read the same truth, and mid-run through
:meth:`MockDeployment.update`. Randomness (jitter, errors, stalls) comes from one ``random.Random`` per
deployment seeded from ``(seed, name)``, drawing the same numbers per request whatever happens, so the same
request sequence meets the same fates.

Use in-process with :class:`MockCluster` (an async context manager), or in a child process with
:class:`MockClusterProcess` so the load generator's CPU does not distort the served timings; the child is
driven through small control endpoints under ``/_mock/`` on every deployment's port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import ClientSession, ClientTimeout, web

__all__ = [
    "Behaviour",
    "Change",
    "DeploymentSpec",
    "MockCluster",
    "MockClusterProcess",
    "MockDeployment",
    "ServedRequest",
    "answer_length",
    "answer_tag",
    "behaviour_at",
    "tagged_answer_tokens",
]

_CHARS_PER_TOKEN = 4
"""The mock counts prompt tokens as characters / 4 (rounded up), the usual rule of thumb for English."""

_STREAM_STEP_SECONDS = 0.05
"""Interval between SSE chunks while decoding (several tokens per chunk, to keep CPU use low)."""

_PLAIN_STEP_SECONDS = 0.1
"""Interval at which a non-streaming request re-reads its speed (the share changes as requests come and go)."""


@dataclass(frozen=True)
class Behaviour:
    """True behaviour of one deployment (all times in seconds, rates in tokens per second)."""

    token_rate: float = 50.0
    """Output tokens per second one request decodes at while the deployment is within capacity."""
    base_latency: float = 0.1
    """Fixed delay before prefill starts (network, scheduling)."""
    prefill_rate: float = 20_000.0
    """Input tokens per second of prefill, within capacity."""
    capacity: int = 8
    """Requests served at full speed at once."""
    overload: Literal["share", "queue"] = "share"
    """Beyond capacity: ``share`` slows every active request to ``capacity / active``; ``queue`` waits for a slot."""
    jitter: float = 0.1
    """Sigma of the lognormal factor drawn per request on its speed (0 = none)."""
    wave_amplitude: float = 0.0
    """Relative amplitude of a sine wave on ``token_rate`` (0.3 = +-30 %)."""
    wave_period: float = 60.0
    """Period of that wave."""
    wave_phase: float = 0.0
    """Phase of that wave, in periods (0..1)."""
    error_rate: float = 0.0
    """Probability that a request is answered ``error_status`` after ``error_latency``."""
    error_status: int = 500
    error_latency: float = 0.02
    rate_limited: bool = False
    """While set, every request is answered 429 after ``error_latency`` (a 429 burst)."""
    retry_after: float = 1.0
    """``retry-after`` sent with a burst 429."""
    stall_rate: float = 0.0
    """Probability that a request hangs ``stall_seconds`` before prefill (1.0 = the deployment is stalled)."""
    stall_seconds: float = 30.0
    tpm: int | None = None
    """Token budget (prompt + the answer's tokens, charged at arrival) per ``limit_window``; None = unlimited."""
    rpm: int | None = None
    """Request budget per ``limit_window``; None = unlimited."""
    limit_window: float = 60.0
    default_max_tokens: int = 64
    """Output tokens when a request gives neither an ``[answer:N]`` tag nor ``max_tokens``."""

    def __post_init__(self) -> None:
        positive = {"token_rate": self.token_rate, "prefill_rate": self.prefill_rate, "wave_period": self.wave_period}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"Behaviour.{name} must be > 0 (got {value})")
        non_negative = {
            "base_latency": self.base_latency,
            "jitter": self.jitter,
            "error_latency": self.error_latency,
            "retry_after": self.retry_after,
            "stall_seconds": self.stall_seconds,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise ValueError(f"Behaviour.{name} must be >= 0 (got {value})")
        for name, value in {"error_rate": self.error_rate, "stall_rate": self.stall_rate}.items():
            if not 0 <= value <= 1:
                raise ValueError(f"Behaviour.{name} must be between 0 and 1 (got {value})")
        if not 0 <= self.wave_amplitude < 1:
            raise ValueError(f"Behaviour.wave_amplitude must be in [0, 1) (got {self.wave_amplitude})")
        if self.capacity < 1:
            raise ValueError(f"Behaviour.capacity must be >= 1 (got {self.capacity})")
        if self.overload not in ("share", "queue"):
            raise ValueError(f"Behaviour.overload must be 'share' or 'queue' (got {self.overload!r})")
        if not 400 <= self.error_status <= 599:
            raise ValueError(f"Behaviour.error_status must be an HTTP error status (got {self.error_status})")
        for name, limit in {"tpm": self.tpm, "rpm": self.rpm}.items():
            if limit is not None and limit < 1:
                raise ValueError(f"Behaviour.{name} must be >= 1 or None (got {limit})")
        if not self.limit_window > 0:
            raise ValueError(f"Behaviour.limit_window must be > 0 (got {self.limit_window})")
        if self.default_max_tokens < 1:
            raise ValueError(f"Behaviour.default_max_tokens must be >= 1 (got {self.default_max_tokens})")

    def rate_at(self, elapsed: float) -> float:
        """True token rate (one request, within capacity, before jitter) at ``elapsed`` seconds."""
        if self.wave_amplitude == 0:
            return self.token_rate
        angle = 2 * math.pi * (elapsed / self.wave_period + self.wave_phase)
        return self.token_rate * (1 + self.wave_amplitude * math.sin(angle))

    def with_changes(self, changes: Mapping[str, Any]) -> Behaviour:
        """A copy with ``changes`` applied (unknown field names raise ValueError)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown Behaviour fields: {sorted(unknown)}")
        return dataclasses.replace(self, **dict(changes))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Change:
    """From ``at`` seconds after the epoch on, the behaviour has ``changes`` applied (later entries win)."""

    at: float
    changes: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "changes": dict(self.changes)}


def behaviour_at(base: Behaviour, timeline: Iterable[Change], elapsed: float) -> Behaviour:
    """The behaviour in force at ``elapsed``: ``base`` with every change due by then applied in time order."""
    current = base
    for change in sorted(timeline, key=lambda c: c.at):
        if change.at > elapsed:
            break
        current = current.with_changes(change.changes)
    return current


@dataclass(frozen=True)
class DeploymentSpec:
    """Everything that defines a mock deployment's behaviour over a run."""

    name: str
    behaviour: Behaviour = field(default_factory=Behaviour)
    timeline: tuple[Change, ...] = ()
    seed: int = 0

    def behaviour_at(self, elapsed: float) -> Behaviour:
        return behaviour_at(self.behaviour, self.timeline, elapsed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "behaviour": self.behaviour.to_dict(),
            "timeline": [c.to_dict() for c in self.timeline],
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeploymentSpec:
        return cls(
            name=str(data["name"]),
            behaviour=Behaviour(**data.get("behaviour", {})),
            timeline=tuple(Change(float(c["at"]), dict(c["changes"])) for c in data.get("timeline", ())),
            seed=int(data.get("seed", 0)),
        )


@dataclass(frozen=True)
class ServedRequest:
    """What one deployment saw of one request (times in seconds since the deployment's epoch)."""

    deployment: str
    request_id: str | None
    """The ``x-bench-request-id`` header, when the client sent one."""
    arrival: float
    finished: float
    status: int
    outcome: Literal["ok", "rate_limited", "error", "stalled", "cancelled"]
    prompt_tokens: int
    completion_tokens: int
    stream: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class UsageWindow:
    """Requests and tokens charged over a sliding window (the provider side of tpm/rpm limits)."""

    __slots__ = ("_entries", "_tokens")

    def __init__(self) -> None:
        self._entries: deque[tuple[float, int]] = deque()
        self._tokens = 0

    def _expire(self, now: float, window: float) -> None:
        while self._entries and self._entries[0][0] <= now - window:
            self._tokens -= self._entries.popleft()[1]

    def usage(self, now: float, window: float) -> tuple[int, int]:
        """(requests, tokens) charged within the window ending at ``now``."""
        self._expire(now, window)
        return len(self._entries), self._tokens

    def charge(self, now: float, tokens: int) -> None:
        self._entries.append((now, tokens))
        self._tokens += tokens

    def seconds_until_free(self, now: float, window: float) -> float:
        """Seconds until the oldest charge leaves the window (0 when empty)."""
        self._expire(now, window)
        return max(0.0, self._entries[0][0] + window - now) if self._entries else 0.0

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0


_ANSWER_TAG = re.compile(r"\[answer:(\d{1,6})\]")


def answer_tag(answer_tokens: int) -> str:
    """The prompt tag that makes the mock answer ``answer_tokens`` tokens (unless ``max_tokens`` is lower)."""
    return f"[answer:{answer_tokens}]"


def tagged_answer_tokens(messages: Any) -> int | None:
    """The ``[answer:N]`` length asked for by the first message text that has the tag, else None."""
    if not isinstance(messages, list):
        return None
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        texts: list[Any] = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            texts = [part.get("text") for part in content if isinstance(part, Mapping)]
        for text in texts:
            match = _ANSWER_TAG.search(text) if isinstance(text, str) else None
            if match:
                return max(1, int(match.group(1)))
    return None


def answer_length(messages: Any, max_tokens: Any, default: int) -> tuple[int, bool]:
    """(output tokens, whether ``max_tokens`` cut the answer): the tagged answer, else ``max_tokens``, else
    ``default``; capped by ``max_tokens`` when the request gives one."""
    cap = int(max_tokens) if isinstance(max_tokens, (int, float)) and max_tokens > 0 else None
    natural = tagged_answer_tokens(messages)
    if natural is None:
        natural = cap if cap is not None else default
    if cap is not None and cap <= natural:
        return max(1, cap), True
    return max(1, natural), False


def _text_chars(messages: Any) -> int:
    """Characters of the text in chat ``messages`` (string contents and ``text`` parts). The mock counts on its
    own, importing nothing from the package: its child process must start whatever state the package is in."""
    chars = 0
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    text = part.get("text") if isinstance(part, Mapping) else None
                    if isinstance(text, str):
                        chars += len(text)
    return chars


def estimate_prompt_tokens(messages: Any) -> int:
    """Prompt tokens the mock reports: characters of every text content / 4, rounded up, at least 1."""
    return max(1, math.ceil(_text_chars(messages) / _CHARS_PER_TOKEN))


class MockDeployment:
    """One mock deployment: its behaviour over time, its live state and its HTTP server (once started)."""

    def __init__(self, spec: DeploymentSpec, *, epoch: float | None = None, log_limit: int = 100_000) -> None:
        self._spec = spec
        self._timeline: list[Change] = list(spec.timeline)
        self._epoch = time.time() if epoch is None else epoch
        self._rng = random.Random(f"{spec.seed}/{spec.name}")
        self._usage = UsageWindow()
        self._log: deque[ServedRequest] = deque(maxlen=log_limit)
        self._active = 0  # requests in prefill or decode (not waiting for a slot, not stalled)
        self._in_flight = 0  # every request being handled
        self._slots: asyncio.Semaphore | None = None
        self._slots_capacity = 0
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # -- state ----------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def spec(self) -> DeploymentSpec:
        """The spec with every change so far (timeline and :meth:`update` calls) in its timeline."""
        return dataclasses.replace(self._spec, timeline=tuple(self._timeline))

    @property
    def epoch(self) -> float:
        """Wall-clock time (``time.time()``) that timeline times count from."""
        return self._epoch

    def elapsed(self) -> float:
        return time.time() - self._epoch

    def behaviour(self) -> Behaviour:
        """The behaviour in force now."""
        return behaviour_at(self._spec.behaviour, self._timeline, self.elapsed())

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def active(self) -> int:
        return self._active

    def served(self) -> list[ServedRequest]:
        """Every request finished since the last reset, in finishing order."""
        return list(self._log)

    def update(self, **changes: Any) -> None:
        """Change the behaviour from now on (validated at once; unknown names raise ValueError)."""
        self.behaviour().with_changes(changes)
        self._timeline.append(Change(self.elapsed(), dict(changes)))

    def reset(self, spec: DeploymentSpec | None = None, *, epoch: float | None = None) -> None:
        """Start a new run: a fresh timeline (``spec``'s or the original), reseeded randomness, empty usage and
        log, timeline times counted from ``epoch`` (default now). Requests still in flight finish normally."""
        if spec is not None:
            self._spec = spec
        self._timeline = list(self._spec.timeline)
        self._epoch = time.time() if epoch is None else epoch
        self._rng = random.Random(f"{self._spec.seed}/{self._spec.name}")
        self._usage.clear()
        self._log.clear()

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "elapsed": self.elapsed(),
            "behaviour": self.behaviour().to_dict(),
            "in_flight": self._in_flight,
            "active": self._active,
            "served": len(self._log),
        }

    # -- server ---------------------------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the value for an ``openai/...`` model's ``api_base``)."""
        if self._port is None:
            raise RuntimeError(f"mock deployment {self.name!r} is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    async def start(self, port: int = 0) -> str:
        """Serve on ``127.0.0.1:port`` (0 = a free port); returns :attr:`api_base`."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_post("/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_get("/_mock/state", self._handle_state)
        app.router.add_get("/_mock/log", self._handle_log)
        app.router.add_post("/_mock/update", self._handle_update)
        app.router.add_post("/_mock/reset", self._handle_reset)
        # handler_cancellation: a client that gives up (timeout) frees the request at once, as a real server would
        # notice the closed connection, instead of a stalled handler living on for stall_seconds.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        site = web.SockSite(runner, sock, shutdown_timeout=0.5)
        await site.start()
        self._runner = runner
        self._port = sock.getsockname()[1]
        return self.api_base

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._port = None

    # -- request handling -----------------------------------------------------------------------------
    def _slots_for(self, capacity: int) -> asyncio.Semaphore:
        # Rebuilt when the capacity changes; requests holding the old one release it normally.
        if self._slots is None or self._slots_capacity != capacity:
            self._slots = asyncio.Semaphore(capacity)
            self._slots_capacity = capacity
        return self._slots

    def _ratelimit_headers(self, behaviour: Behaviour, now: float) -> dict[str, str]:
        requests, tokens = self._usage.usage(now, behaviour.limit_window)
        reset = f"{self._usage.seconds_until_free(now, behaviour.limit_window):.3f}s"
        headers: dict[str, str] = {}
        if behaviour.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(behaviour.rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, behaviour.rpm - requests))
            headers["x-ratelimit-reset-requests"] = reset
        if behaviour.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(behaviour.tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, behaviour.tpm - tokens))
            headers["x-ratelimit-reset-tokens"] = reset
        return headers

    def _over_budget(self, behaviour: Behaviour, now: float, tokens: int) -> bool:
        requests, used = self._usage.usage(now, behaviour.limit_window)
        if behaviour.rpm is not None and requests + 1 > behaviour.rpm:
            return True
        return behaviour.tpm is not None and used + tokens > behaviour.tpm

    def _record(self, **fields: Any) -> None:
        self._log.append(ServedRequest(deployment=self.name, finished=self.elapsed(), **fields))

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        arrival = self.elapsed()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(
                {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}}, status=400
            )
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return web.json_response(
                {"error": {"message": "messages is required", "type": "invalid_request_error"}}, status=400
            )
        behaviour = self.behaviour()
        # Always three draws per request, whatever its fate, so one request's outcome never shifts the next one's.
        error_draw, stall_draw, speed_draw = self._rng.random(), self._rng.random(), self._rng.gauss(0.0, 1.0)
        prompt_tokens = estimate_prompt_tokens(body["messages"])
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        completion_tokens, cut = answer_length(body["messages"], max_tokens, behaviour.default_max_tokens)
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        model = str(body.get("model", "mock"))
        request_id = request.headers.get("x-bench-request-id")
        common = {"request_id": request_id, "arrival": arrival, "prompt_tokens": prompt_tokens, "stream": stream}

        self._in_flight += 1
        try:
            if behaviour.rate_limited or self._over_budget(behaviour, arrival, prompt_tokens + completion_tokens):
                await asyncio.sleep(behaviour.error_latency)
                headers = self._ratelimit_headers(behaviour, arrival)
                if behaviour.rate_limited:
                    retry_after = behaviour.retry_after
                    headers["x-ratelimit-remaining-requests"] = "0"
                    headers["x-ratelimit-remaining-tokens"] = "0"
                else:
                    retry_after = self._usage.seconds_until_free(arrival, behaviour.limit_window)
                headers["retry-after"] = str(max(1, math.ceil(retry_after)))
                self._record(status=429, outcome="rate_limited", completion_tokens=0, **common)
                message = f"Rate limit reached for mock deployment {self.name}"
                error = {"message": message, "type": "requests", "code": "rate_limit_exceeded"}
                return web.json_response({"error": error}, status=429, headers=headers)
            self._usage.charge(arrival, prompt_tokens + completion_tokens)
            if error_draw < behaviour.error_rate:
                await asyncio.sleep(behaviour.error_latency)
                self._record(status=behaviour.error_status, outcome="error", completion_tokens=0, **common)
                error = {"message": f"mock upstream error on {self.name}", "type": "server_error"}
                return web.json_response({"error": error}, status=behaviour.error_status)
            if stall_draw < behaviour.stall_rate:
                await asyncio.sleep(behaviour.stall_seconds)
            speed = math.exp(behaviour.jitter * speed_draw) if behaviour.jitter > 0 else 1.0
            headers = self._ratelimit_headers(behaviour, arrival)
            headers["x-mock-deployment"] = self.name
            return await self._serve(
                request,
                behaviour,
                speed,
                prompt_tokens,
                completion_tokens,
                "length" if cut else "stop",
                stream,
                include_usage,
                model,
                headers,
                common,
            )
        except asyncio.CancelledError:
            self._record(status=499, outcome="cancelled", completion_tokens=0, **common)
            raise
        finally:
            self._in_flight -= 1

    async def _serve(
        self,
        request: web.Request,
        behaviour: Behaviour,
        speed: float,
        prompt_tokens: int,
        completion_tokens: int,
        finish: str,
        stream: bool,
        include_usage: bool,
        model: str,
        headers: dict[str, str],
        common: dict[str, Any],
    ) -> web.StreamResponse:
        slot = self._slots_for(behaviour.capacity) if behaviour.overload == "queue" else None
        if slot is not None:
            await slot.acquire()
        response_id = f"chatcmpl-mock-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        self._active += 1
        try:
            await asyncio.sleep(behaviour.base_latency)
            prefill = prompt_tokens / behaviour.prefill_rate
            while prefill > 1e-9:
                prefill -= await self._run(prefill, _PLAIN_STEP_SECONDS)
            stream_response: web.StreamResponse | None = None
            if stream:
                stream_response = web.StreamResponse(
                    headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await stream_response.prepare(request)
                await self._send(stream_response, self._chunk(response_id, created, model, {"role": "assistant"}))
            produced = 0.0
            sent = 0
            step = _STREAM_STEP_SECONDS if stream else _PLAIN_STEP_SECONDS
            while sent < completion_tokens:
                rate = max(1e-6, self.behaviour().rate_at(self.elapsed()) * speed)
                produced += await self._run((completion_tokens - produced) / rate, step) * rate
                # float rounding must not leave a last token that never arrives
                now_tokens = completion_tokens if produced >= completion_tokens - 1e-6 else int(produced)
                if stream_response is not None and now_tokens > sent:
                    delta = {"content": " tok" * (now_tokens - sent)}
                    await self._send(stream_response, self._chunk(response_id, created, model, delta))
                sent = now_tokens
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            if stream_response is not None:
                await self._send(stream_response, self._chunk(response_id, created, model, {}, finish))
                if include_usage:
                    usage_chunk = self._chunk(response_id, created, model, None)
                    usage_chunk["usage"] = usage
                    await self._send(stream_response, usage_chunk)
                await stream_response.write(b"data: [DONE]\n\n")
                await stream_response.write_eof()
                self._record(status=200, outcome="ok", completion_tokens=completion_tokens, **common)
                return stream_response
            body = {
                "id": response_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": " tok" * completion_tokens},
                        "finish_reason": finish,
                    }
                ],
                "usage": usage,
            }
            self._record(status=200, outcome="ok", completion_tokens=completion_tokens, **common)
            return web.json_response(body, headers=headers)
        finally:
            self._active -= 1
            if slot is not None:
                slot.release()

    def _share(self) -> float:
        """Fraction of full speed each active request gets now (1 within capacity, or when overload queues)."""
        behaviour = self.behaviour()
        if behaviour.overload == "queue":
            return 1.0
        return min(1.0, behaviour.capacity / max(1, self._active))

    async def _run(self, full_speed_seconds: float, step: float) -> float:
        """Work for at most ``step`` wall seconds on ``full_speed_seconds`` of remaining work at the current
        share; returns the full-speed seconds done. Callers loop, so the share is re-read every step: a request
        slows down while the deployment is over capacity and speeds up again as it drains."""
        share = self._share()
        started = time.monotonic()
        await asyncio.sleep(min(step, full_speed_seconds / share))
        # Count the time that really passed: an event loop running late must not make the server faster.
        return min(full_speed_seconds, (time.monotonic() - started) * share)

    @staticmethod
    def _chunk(
        response_id: str, created: int, model: str, delta: dict[str, Any] | None, finish: str | None = None
    ) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }

    @staticmethod
    async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
        await response.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")

    async def _handle_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model"}]})

    async def _handle_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    async def _handle_log(self, request: web.Request) -> web.Response:
        return web.json_response([r.to_dict() for r in self._log])

    async def _handle_update(self, request: web.Request) -> web.Response:
        try:
            self.update(**(await request.json()))
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.state())

    async def _handle_reset(self, request: web.Request) -> web.Response:
        data = await request.json()
        try:
            spec = DeploymentSpec.from_dict(data["spec"]) if data.get("spec") else None
            self.reset(spec, epoch=data.get("epoch"))
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(self.state())


class MockCluster:
    """N mock deployments served in this process and event loop::

    async with MockCluster([DeploymentSpec("a", Behaviour(token_rate=80))]) as cluster:
        cluster.api_bases["a"]  # "http://127.0.0.1:<port>/v1"
        cluster["a"].update(rate_limited=True)
    """

    def __init__(self, specs: Sequence[DeploymentSpec], *, epoch: float | None = None) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"deployment names must be unique (got {names})")
        start = time.time() if epoch is None else epoch
        self.deployments: dict[str, MockDeployment] = {s.name: MockDeployment(s, epoch=start) for s in specs}

    def __getitem__(self, name: str) -> MockDeployment:
        return self.deployments[name]

    @property
    def api_bases(self) -> dict[str, str]:
        return {name: d.api_base for name, d in self.deployments.items()}

    async def start(self) -> dict[str, str]:
        for deployment in self.deployments.values():
            await deployment.start()
        return self.api_bases

    async def stop(self) -> None:
        for deployment in self.deployments.values():
            await deployment.stop()

    def reset(self, specs: Sequence[DeploymentSpec] | None = None, *, epoch: float | None = None) -> None:
        """Start a new run on every deployment with one shared epoch (``specs`` matched by name)."""
        start = time.time() if epoch is None else epoch
        by_name = {s.name: s for s in specs or ()}
        for name, deployment in self.deployments.items():
            deployment.reset(by_name.get(name), epoch=start)

    def served(self) -> list[ServedRequest]:
        return sorted((r for d in self.deployments.values() for r in d.served()), key=lambda r: r.arrival)

    async def __aenter__(self) -> MockCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


_THIS_FILE = os.path.abspath(__file__)


class MockClusterProcess:
    """A :class:`MockCluster` in a child Python process, driven over its ``/_mock/`` control endpoints::

        async with MockClusterProcess(specs) as cluster:
            cluster.api_bases
            await cluster.reset(epoch=time.time())
            await cluster.update("a", rate_limited=True)
            served = await cluster.served()

    The child exits when this handle closes (or when its stdin closes, e.g. the parent died).
    """

    def __init__(self, specs: Sequence[DeploymentSpec], *, start_timeout: float = 20.0) -> None:
        self._specs = list(specs)
        self._start_timeout = start_timeout
        self._process: asyncio.subprocess.Process | None = None
        self._session: ClientSession | None = None
        self.api_bases: dict[str, str] = {}

    async def start(self) -> dict[str, str]:
        payload = json.dumps([s.to_dict() for s in self._specs]).encode()
        # This file run as a script, isolated (-I): it needs only the standard library and aiohttp, while
        # importing it through the package would import LiteLLM (seconds of CPU per child).
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", _THIS_FILE, "--specs", "-", stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(payload + b"\n")
        await self._process.stdin.drain()
        try:
            line = await asyncio.wait_for(self._process.stdout.readline(), self._start_timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise RuntimeError(f"mock cluster process did not start within {self._start_timeout:.0f} s") from None
        if not line:
            await self.stop()
            raise RuntimeError("mock cluster process exited before reporting its addresses")
        self.api_bases = dict(json.loads(line)["api_bases"])
        self._session = ClientSession(timeout=ClientTimeout(total=10))
        return self.api_bases

    def _control_url(self, name: str, path: str) -> str:
        return self.api_bases[name].removesuffix("/v1") + "/_mock/" + path

    async def _post(self, name: str, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        assert self._session is not None, "not started"
        async with self._session.post(self._control_url(name, path), json=dict(payload)) as response:
            data: dict[str, Any] = await response.json()
            if response.status != 200:
                raise ValueError(f"mock control {path} on {name}: {data.get('error')}")
            return data

    async def update(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change one deployment's behaviour from now on; returns its state."""
        return await self._post(name, "update", changes)

    async def reset(self, specs: Sequence[DeploymentSpec] | None = None, *, epoch: float | None = None) -> None:
        """Start a new run on every deployment with one shared epoch (``specs`` matched by name)."""
        start = time.time() if epoch is None else epoch
        by_name = {s.name: s for s in specs or ()}
        for name in self.api_bases:
            spec = by_name.get(name)
            await self._post(name, "reset", {"epoch": start, "spec": spec.to_dict() if spec else None})

    async def state(self, name: str) -> dict[str, Any]:
        assert self._session is not None, "not started"
        async with self._session.get(self._control_url(name, "state")) as response:
            data: dict[str, Any] = await response.json()
            return data

    async def served(self) -> list[ServedRequest]:
        """Every request the deployments finished since the last reset, by arrival time."""
        assert self._session is not None, "not started"
        records: list[ServedRequest] = []
        for name in self.api_bases:
            async with self._session.get(self._control_url(name, "log")) as response:
                records.extend(ServedRequest(**r) for r in await response.json())
        return sorted(records, key=lambda r: r.arrival)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except asyncio.TimeoutError:
                process.terminate()
                await process.wait()

    async def __aenter__(self) -> MockClusterProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def _serve_until_stdin_closes(specs: Sequence[DeploymentSpec]) -> None:
    async with MockCluster(specs) as cluster:
        print(json.dumps({"api_bases": cluster.api_bases}), flush=True)
        # stdin at EOF = the parent closed it or died: time to go.
        await asyncio.to_thread(sys.stdin.buffer.read)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m litellm_ratebalance.simulate.mock_openai --specs FILE|-``: serve the deployments described by
    a JSON list of :meth:`DeploymentSpec.to_dict` objects (``-`` = first line of stdin), print
    ``{"api_bases": {...}}`` as one line, serve until stdin closes. ``--demo N`` serves N default deployments."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--specs", help="JSON file of deployment specs, or - for the first line of stdin")
    parser.add_argument("--demo", type=int, default=0, help="serve N deployments with default behaviour")
    args = parser.parse_args(argv)
    if args.specs == "-":
        raw = json.loads(sys.stdin.buffer.readline())
    elif args.specs:
        with open(args.specs, encoding="utf-8") as handle:
            raw = json.load(handle)
    else:
        raw = [{"name": f"d{i}"} for i in range(max(1, args.demo))]
    asyncio.run(_serve_until_stdin_closes([DeploymentSpec.from_dict(s) for s in raw]))


if __name__ == "__main__":
    main()
