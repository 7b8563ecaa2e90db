"""A fake vLLM-like inference server on loopback: continuous batching, latency that grows with the batch,
a KV cache that runs out (simulated OOM), and a Prometheus ``/metrics`` endpoint.

The model of the GPU (all parameters in :class:`ServerSpec`):

* **Continuous batching.** Up to ``max_num_seqs`` requests run; more wait in the server's own queue
  (``vllm:num_requests_waiting``). Every engine step, each running request produces one output token.
* **Latency grows with load.** A step takes ``step_seconds`` while at most ``knee`` requests run (decoding is
  memory-bound, the batch is free), and ``step_seconds x running / knee`` beyond it (compute-bound: the
  server's token throughput is flat past the knee, each request slows down). Requests that join a step add
  their prefill, ``prompt_tokens / prefill_tokens_per_second``, to it.
* **Memory cliff.** Each running request holds ``prompt + generated`` tokens of KV cache. When the cache
  would pass ``memory_tokens``, the server fails like a GPU out of memory: every running request gets a
  500 ``CUDA out of memory (simulated)`` and the cache is emptied. There is no graceful degradation.
  With ``kv_overflow="preempt"`` it behaves as vLLM and SGLang do instead: a waiting request starts only when
  its prompt fits, and when the running requests outgrow the cache the latest started ones are preempted
  (back to the head of the queue, their cache freed, to be computed again), counted in
  ``vllm:num_preemptions_total`` / ``sglang:num_retracted_requests_total``.
* **Answer length.** By default a request generates exactly ``max_tokens`` tokens (``default_max_tokens``
  when unset), as benchmark clients that ignore end-of-sequence do, so its cost is known in advance. With
  ``answer_tokens = (low, high)`` every prompt has a natural answer length in that range instead
  (:func:`answer_length`: a hash of the message text, so the same prompt always gets the same answer), and
  a request stops at that length or at its ``max_tokens``, whichever comes first, as a real model stops at
  end-of-sequence. A request without ``max_tokens`` then runs to its natural end.
* **Ground truth of cost.** Each step's measured time is shared among the requests in it as the model spends
  it: the decode part equally, the prefill part by prompt tokens among the requests prefilled in that step.
  A request's share is in its response's ``x-sim-gpu-seconds`` header (errors included), and the shares are
  summed per ``x-sim-cost-tag`` request header in ``/_sim/stats`` (``gpu_seconds_by_tag``), beside the
  engine's ``busy_seconds``; ``bench/bench_cost.py`` checks the proxy's attribution against them.

Endpoints: ``POST /v1/chat/completions`` (non-streaming OpenAI JSON with usage), ``GET /metrics`` (the
names and labels of a one-engine vLLM V1 with ``metrics_flavor="vllm"``, TGI 3's with ``"tgi"``, SGLang's
with ``"sglang"``, each with its KV-cache capacity, ``memory_tokens``; ``"none"``: process metrics only, as a
vLLM started with ``--disable-log-stats``), and control endpoints under ``/_sim/``: ``stats`` (counters),
``reset``, ``metrics_down`` (make ``/metrics`` answer 503, to test degradation).

Use in-process with :class:`InferenceServer` (``async with``) or in a child process with
:class:`InferenceServerProcess`, so a load generator's CPU does not distort the served timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import ClientSession, ClientTimeout, web

from litellm_ratebalance.simulate.mock_openai import estimate_prompt_tokens

COST_TAG_HEADER = "x-sim-cost-tag"
"""Request header naming the tag a request's ground-truth GPU time is summed under (at most 64 characters)."""
GPU_SECONDS_HEADER = "x-sim-gpu-seconds"
"""Response header: the request's ground-truth GPU-seconds (its share of the steps it ran in)."""

__all__ = ["InferenceServer", "InferenceServerProcess", "ServerSpec", "ServerStats", "answer_length"]


@dataclass(frozen=True)
class ServerSpec:
    """Behaviour of the simulated server (seconds, tokens)."""

    knee: int = 8
    step_seconds: float = 0.02
    max_num_seqs: int = 64
    memory_tokens: int = 4096
    prefill_tokens_per_second: float = 50_000.0
    default_max_tokens: int = 64
    model: str = "sim-llm"
    metrics_flavor: Literal["vllm", "tgi", "sglang", "none"] = "vllm"
    answer_tokens: tuple[int, int] | None = None
    """Natural answer lengths (inclusive range, tokens); ``None``: every request generates its max_tokens."""
    kv_overflow: Literal["fail", "preempt"] = "fail"
    """What a full KV cache does: fail every running request (an OOM), or preempt the latest started ones."""

    def __post_init__(self) -> None:
        if self.answer_tokens is not None:
            low, high = self.answer_tokens
            if not 1 <= low <= high:
                raise ValueError(f"answer_tokens must be (low, high) with 1 <= low <= high (got {self.answer_tokens})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerSpec:
        fields = dict(data)
        if fields.get("answer_tokens") is not None:
            fields["answer_tokens"] = tuple(fields["answer_tokens"])  # JSON has lists
        return cls(**fields)

    def capacity_tokens_per_second(self) -> float:
        """Output tokens per second with the batch at or past the knee (decode only)."""
        return self.knee / self.step_seconds


def answer_length(spec: ServerSpec, messages: Any) -> int | None:
    """The natural answer length of a prompt under ``spec.answer_tokens`` (``None`` when unset): a CRC-32 of
    the messages' string contents mapped into the range, so a client that knows the prompt knows the answer's
    length (only the contents: a proxy may add other fields to a message on the way)."""
    if spec.answer_tokens is None:
        return None
    low, high = spec.answer_tokens
    contents = [m.get("content") for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
    text = "\n".join(c for c in contents if isinstance(c, str)).encode()
    return low + zlib.crc32(text) % (high - low + 1)


@dataclass
class ServerStats:
    """Counters since the last reset."""

    completed: int = 0
    output_tokens: int = 0
    oom_events: int = 0
    oom_failures: int = 0
    """Requests failed by a simulated out-of-memory."""
    preemptions: int = 0
    """Requests preempted for want of KV cache (``kv_overflow="preempt"``)."""
    peak_running: int = 0
    peak_memory_tokens: int = 0
    busy_seconds: float = 0.0
    """Engine time spent in steps (the simulated GPU's busy time)."""
    gpu_seconds_by_tag: dict[str, float] = field(default_factory=dict)
    """Ground truth of cost attribution: each step's time shared among the requests in it (decode equally, the
    prefill part by prompt tokens among the requests prefilled in it), summed per request tag (the
    ``x-sim-cost-tag`` request header; ``""`` without one)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(eq=False)
class _Request:
    prompt_tokens: int
    max_tokens: int
    done: asyncio.Future[int]
    generated: int = 0
    prefilled: bool = False
    tag: str = ""
    gpu_seconds: float = 0.0
    """Ground truth: this request's share of the engine steps it ran in (see ``ServerStats.gpu_seconds_by_tag``)."""

    @property
    def memory(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class _Engine:
    spec: ServerSpec
    running: list[_Request] = field(default_factory=list)
    waiting: list[_Request] = field(default_factory=list)
    stats: ServerStats = field(default_factory=ServerStats)
    task: asyncio.Task[None] | None = None

    @property
    def memory_used(self) -> int:
        return sum(r.memory for r in self.running)

    def submit(self, prompt_tokens: int, max_tokens: int, tag: str = "") -> asyncio.Future[int]:
        return self.submit_request(prompt_tokens, max_tokens, tag).done

    def submit_request(self, prompt_tokens: int, max_tokens: int, tag: str = "") -> _Request:
        request = _Request(prompt_tokens, max_tokens, asyncio.get_running_loop().create_future(), tag=tag)
        self.waiting.append(request)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        return request

    async def _run(self) -> None:
        # Runs while there is work; exits when both lists are empty (next submit starts it again).
        while self.running or self.waiting:
            while self.waiting and len(self.running) < self.spec.max_num_seqs and self._may_start(self.waiting[0]):
                self.running.append(self.waiting.pop(0))
            self.running = [r for r in self.running if not r.done.done()]  # clients that went away
            prefilling = [r for r in self.running if not r.prefilled]
            prefill = sum(r.prompt_tokens for r in prefilling)
            for request in self.running:
                request.prefilled = True
            if self._out_of_memory(extra=len(self.running)):
                continue
            n = len(self.running)
            self.stats.peak_running = max(self.stats.peak_running, n)
            step = self.spec.step_seconds * max(1.0, n / self.spec.knee) + prefill / self.spec.prefill_tokens_per_second
            started = time.monotonic()
            await asyncio.sleep(step)
            self._charge(time.monotonic() - started, step, prefilling)
            finished: list[_Request] = []
            for request in self.running:
                request.generated += 1
                if request.generated >= request.max_tokens:
                    finished.append(request)
            self.stats.peak_memory_tokens = max(self.stats.peak_memory_tokens, self.memory_used)
            for request in finished:
                self.running.remove(request)
                self.stats.completed += 1
                self.stats.output_tokens += request.generated
                if not request.done.done():
                    request.done.set_result(request.generated)

    def _charge(self, elapsed: float, step: float, prefilling: list[_Request]) -> None:
        """Ground truth of cost: the step's measured time, shared as the step's model spends it (the decode part
        equally among the running requests, the prefill part by prompt tokens among those prefilled in it)."""
        n = len(self.running)
        decode = step - sum(r.prompt_tokens for r in prefilling) / self.spec.prefill_tokens_per_second
        scale = elapsed / step if step > 0 else 0.0
        prefilled = {id(r) for r in prefilling}
        self.stats.busy_seconds += elapsed
        for request in self.running:
            share = decode / n
            if id(request) in prefilled:
                share += request.prompt_tokens / self.spec.prefill_tokens_per_second
            request.gpu_seconds += share * scale
            by_tag = self.stats.gpu_seconds_by_tag
            by_tag[request.tag] = by_tag.get(request.tag, 0.0) + share * scale

    def _may_start(self, request: _Request) -> bool:
        """Whether a waiting request may join the batch: always when overflow fails (the cliff), only when its
        prompt and one token per running request fit when it preempts (as vLLM's scheduler)."""
        if self.spec.kv_overflow == "fail":
            return True
        return self.memory_used + request.prompt_tokens + len(self.running) + 1 <= self.spec.memory_tokens

    def _out_of_memory(self, extra: int) -> bool:
        """The next step needs one more token of cache per running request; past capacity, all fail (or, with
        ``kv_overflow="preempt"``, the latest started are preempted until the rest fit)."""
        if self.memory_used + extra <= self.spec.memory_tokens:
            return False
        if self.spec.kv_overflow == "preempt":
            while len(self.running) > 1 and self.memory_used + len(self.running) > self.spec.memory_tokens:
                request = self.running.pop()
                request.generated, request.prefilled = 0, False  # its cache is freed: computed again later
                self.waiting.insert(0, request)
                self.stats.preemptions += 1
            return False
        self.stats.oom_events += 1
        self.stats.oom_failures += len(self.running)
        for request in self.running:
            if not request.done.done():
                request.done.set_exception(MemoryError(f"needed {self.memory_used + extra} KV-cache tokens"))
        self.running = []
        return True


class InferenceServer:
    """The simulated server in this process: ``async with InferenceServer(spec) as server: server.api_base``."""

    def __init__(self, spec: ServerSpec | None = None, *, port: int = 0) -> None:
        self.spec = spec or ServerSpec()
        self._engine = _Engine(self.spec)
        self._metrics_down = False
        self._started_at = time.time()
        self._runner: web.AppRunner | None = None
        self._port = port

    # -- state ------------------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self._engine.running)

    @property
    def waiting(self) -> int:
        return len(self._engine.waiting)

    @property
    def memory_used(self) -> int:
        return self._engine.memory_used

    @property
    def stats(self) -> ServerStats:
        return self._engine.stats

    @property
    def url(self) -> str:
        if self._port == 0:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def reset(self) -> None:
        self._engine.stats = ServerStats()

    def set_metrics_down(self, down: bool) -> None:
        self._metrics_down = down

    # -- HTTP -------------------------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body is not JSON", "invalid_request_error")
        if body.get("stream"):
            return _error(400, "the simulated server does not stream", "invalid_request_error")
        messages = body.get("messages")
        prompt = estimate_prompt_tokens(messages)  # the same count the routing mock reports
        raw_max = body.get("max_completion_tokens") or body.get("max_tokens")
        natural = answer_length(self.spec, messages)
        if raw_max is None and natural is None:
            raw_max = self.spec.default_max_tokens
        if prompt >= self.spec.memory_tokens:
            return _error(400, "the prompt exceeds the model's context", "invalid_request_error")
        if raw_max is not None and prompt + max(1, int(raw_max)) > self.spec.memory_tokens:
            return _error(400, "prompt + max_tokens exceed the model's context", "invalid_request_error")
        limit = self.spec.memory_tokens - prompt if raw_max is None else max(1, int(raw_max))
        max_tokens = limit if natural is None else max(1, min(natural, limit))
        job = self._engine.submit_request(prompt, max_tokens, request.headers.get(COST_TAG_HEADER, "")[:64])
        truth = {GPU_SECONDS_HEADER: f"{job.gpu_seconds:.6f}"}
        try:
            generated = await job.done
        except MemoryError as exc:
            error = _error(500, f"CUDA out of memory (simulated): {exc}", "server_error")
            error.headers[GPU_SECONDS_HEADER] = f"{job.gpu_seconds:.6f}"
            return error
        truth[GPU_SECONDS_HEADER] = f"{job.gpu_seconds:.6f}"
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.spec.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(["tok"] * generated)},
                    "finish_reason": "stop" if natural is not None and generated >= natural else "length",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
        }
        return web.json_response(payload, headers=truth)

    async def _metrics(self, _: web.Request) -> web.Response:
        if self._metrics_down:
            return web.Response(status=503, text="metrics unavailable (simulated)\n")
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    def metrics_text(self) -> str:
        """The Prometheus text exposition ``/metrics`` serves (see the module docstring)."""
        engine, spec = self._engine, self.spec
        running, waiting = len(engine.running), len(engine.waiting)
        usage = engine.memory_used / spec.memory_tokens
        rows: list[tuple[str, str, str, float]]
        if spec.metrics_flavor == "tgi":
            batch_tokens = sum(r.prompt_tokens + r.max_tokens for r in engine.running)
            rows = [
                ("tgi_queue_size", "gauge", "", waiting),
                ("tgi_batch_current_size", "gauge", "", running),
                ("tgi_batch_current_max_tokens", "gauge", "", batch_tokens),
                ("tgi_batch_max_total_tokens", "gauge", "", spec.memory_tokens),
            ]
        elif spec.metrics_flavor == "sglang":
            label = f'{{engine_type="unified",model_name="{spec.model}",pp_rank="0",tp_rank="0"}}'
            rows = [
                ("sglang:num_running_reqs", "gauge", label, running),
                ("sglang:num_queue_reqs", "gauge", label, waiting),
                ("sglang:num_used_tokens", "gauge", label, engine.memory_used),
                ("sglang:token_usage", "gauge", label, usage),
                ("sglang:max_total_num_tokens", "gauge", label, spec.memory_tokens),
                ("sglang:num_retracted_requests_total", "counter", label, engine.stats.preemptions),
            ]
        elif spec.metrics_flavor == "none":
            rows = [
                ("process_start_time_seconds", "gauge", "", self._started_at),
                ("http_requests_total", "counter", '{handler="/v1/chat/completions",method="POST",status="2xx"}',
                 engine.stats.completed),
            ]  # fmt: skip
        else:
            label = f'{{engine="0",model_name="{spec.model}"}}'
            rows = [
                ("vllm:num_requests_running", "gauge", label, running),
                ("vllm:num_requests_waiting", "gauge", label, waiting),
                ("vllm:gpu_cache_usage_perc", "gauge", label, usage),
                ("vllm:kv_cache_usage_perc", "gauge", label, usage),
                ("vllm:num_preemptions_total", "counter", label, engine.stats.preemptions),
                ("vllm:cache_config_info", "gauge",
                 f'{{block_size="1",engine="0",num_gpu_blocks="{spec.memory_tokens}"}}', 1),
            ]  # fmt: skip
        lines: list[str] = []
        for name, kind, labels, value in rows:
            lines += [f"# HELP {name} simulated", f"# TYPE {name} {kind}", f"{name}{labels} {float(value)}"]
        return "\n".join(lines) + "\n"

    async def _stats(self, _: web.Request) -> web.Response:
        data = self.stats.to_dict()
        data.update(running=self.running, waiting=self.waiting, memory_used=self.memory_used)
        return web.json_response(data)

    async def _reset(self, _: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    async def _set_metrics_down(self, request: web.Request) -> web.Response:
        self.set_metrics_down(bool((await request.json()).get("down", True)))
        return web.json_response({"ok": True})

    async def start(self) -> InferenceServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/_sim/stats", self._stats)
        app.router.add_post("/_sim/reset", self._reset)
        app.router.add_post("/_sim/metrics_down", self._set_metrics_down)
        # handler_cancellation: a client that gives up frees its place in the batch, as a real server would.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        site = web.SockSite(self._runner, sock, shutdown_timeout=0.5, backlog=1024)
        await site.start()
        self._port = int(sock.getsockname()[1])
        return self

    async def stop(self) -> None:
        task = self._engine.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> InferenceServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class InferenceServerProcess:
    """:class:`InferenceServer` in a child process (exits when this handle closes or its parent dies)."""

    def __init__(self, spec: ServerSpec | None = None, *, start_timeout: float = 20.0) -> None:
        self.spec = spec or ServerSpec()
        self._start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._session: ClientSession | None = None
        self.url = ""

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def _spawn(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "litellm_ratebalance.simulate.inference_server", "--spec", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps(self.spec.to_dict()).encode() + b"\n")
        process.stdin.flush()
        return process

    async def start(self) -> InferenceServerProcess:
        self._process = await asyncio.to_thread(self._spawn)
        assert self._process.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self._process.stdout.readline), self._start_timeout)
        if not line:
            raise RuntimeError("inference server process exited before reporting its address")
        self.url = str(json.loads(line)["url"])
        self._session = ClientSession(timeout=ClientTimeout(total=10))
        return self

    async def stats(self) -> ServerStats:
        assert self._session is not None, "not started"
        async with self._session.get(self.url + "/_sim/stats") as response:
            data = await response.json()
        return ServerStats(**{k: data[k] for k in ServerStats.__dataclass_fields__})

    async def reset(self) -> None:
        assert self._session is not None, "not started"
        async with self._session.post(self.url + "/_sim/reset") as response:
            response.raise_for_status()

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            await asyncio.wait_for(asyncio.to_thread(process.wait), 5)
        except asyncio.TimeoutError:
            process.terminate()
            await asyncio.to_thread(process.wait)
        if process.stdout is not None:
            process.stdout.close()

    async def __aenter__(self) -> InferenceServerProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _serve_until_stdin_closes(spec: ServerSpec) -> None:
    async with InferenceServer(spec) as server:
        print(json.dumps({"url": server.url}), flush=True)
        await asyncio.to_thread(sys.stdin.buffer.read)  # EOF: the parent closed it or died


def main(argv: list[str] | None = None) -> None:
    """``python -m litellm_ratebalance.simulate.inference_server [--spec FILE|-]``: serve one simulated
    server, print ``{"url": ...}`` as one line, serve until stdin closes."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--spec", help="JSON file of a ServerSpec, or - for the first line of stdin")
    args = parser.parse_args(argv)
    if args.spec == "-":
        spec = ServerSpec.from_dict(json.loads(sys.stdin.buffer.readline()))
    elif args.spec:
        with open(args.spec, encoding="utf-8") as handle:
            spec = ServerSpec.from_dict(json.load(handle))
    else:
        spec = ServerSpec()
    asyncio.run(_serve_until_stdin_closes(spec))


if __name__ == "__main__":
    main()
