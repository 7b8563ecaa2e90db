"""Server signals: the inference server's Prometheus endpoint and the local GPUs through NVML.

* :func:`parse_metrics` reads a Prometheus text exposition: vLLM (``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:gpu_cache_usage_perc`` or its newer name ``vllm:kv_cache_usage_perc``,
  a 0..1 fraction despite the name) or TGI (``tgi_queue_size``, ``tgi_batch_current_size``,
  ``tgi_batch_current_max_tokens``). Several label sets (models) on one server are summed (counts) or
  maxed (cache usage).
* :class:`GpuProbe` is the interface to GPU readings; :class:`NvmlProbe` implements it over ``pynvml``
  (package ``nvidia-ml-py``, an optional import) or any module with the same functions (tests pass
  :mod:`litellm_ratebalance.simulate.fake_nvml`).
* :class:`SignalBoard` keeps the latest scrape per deployment and turns readings into the signals of
  :mod:`~litellm_ratebalance.overload.shedding` (:func:`server_signals`).

Degradation: an endpoint that cannot be scraped, or NVML that cannot be loaded, logs one warning line (per
deployment, until it recovers, which logs one info line) and the deployment runs on its other signals; a
scrape older than ``stale_after`` counts as absent. An endpoint warns only once it failed
:data:`SCRAPE_FAILURES_BEFORE_WARNING` scrapes in a row: a single failure, typically the first scrape timing
out while the proxy's event loop is busy with its first requests, is retried at the next interval silently.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "SCRAPE_FAILURES_BEFORE_WARNING",
    "Fetcher",
    "GpuProbe",
    "GpuSample",
    "NvmlProbe",
    "ServerMetrics",
    "SignalBoard",
    "held_at_scrape",
    "httpx_fetcher",
    "parse_metrics",
    "server_signals",
]

logger = logging.getLogger("litellm_ratebalance.backpressure")

ServerKind = Literal["vllm", "tgi"]
Fetcher = Callable[[str, float], Awaitable[str]]
"""``await fetch(url, timeout_seconds) -> body text``; raises on any failure (status >= 400 included)."""

_VLLM_RUNNING = "vllm:num_requests_running"
_VLLM_WAITING = "vllm:num_requests_waiting"
_VLLM_CACHE = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
_TGI_QUEUE = "tgi_queue_size"
_TGI_BATCH = "tgi_batch_current_size"
_TGI_BATCH_TOKENS = "tgi_batch_current_max_tokens"


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What one scrape said; ``None`` for a metric the server did not expose."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    """Fraction of the KV cache in use (vLLM)."""
    batch_tokens: float | None = None
    """Tokens the current batch may reach (TGI ``tgi_batch_current_max_tokens``)."""


def parse_metrics(text: str, server: ServerKind) -> ServerMetrics:
    """Parse a Prometheus text exposition; raise ValueError when it is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    maxima: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if not math.isfinite(value):
                    continue
                sums[sample.name] = sums.get(sample.name, 0.0) + value
                maxima[sample.name] = max(maxima.get(sample.name, value), value)
    except Exception as exc:  # the parser raises ValueError and friends on malformed lines
        raise ValueError(f"not a Prometheus text exposition: {exc}") from exc
    if server == "tgi":
        return ServerMetrics(
            running=sums.get(_TGI_BATCH),
            waiting=sums.get(_TGI_QUEUE),
            batch_tokens=sums.get(_TGI_BATCH_TOKENS),
        )
    cache = next((maxima[name] for name in _VLLM_CACHE if name in maxima), None)
    return ServerMetrics(running=sums.get(_VLLM_RUNNING), waiting=sums.get(_VLLM_WAITING), kv_cache_usage=cache)


@dataclass(frozen=True, slots=True)
class GpuSample:
    memory_used_fraction: float
    """Worst (largest) used / total memory over the GPUs asked for."""
    utilization: float | None = None
    """Worst GPU utilisation over them, 0..1 (``None`` when NVML did not report it)."""


class GpuProbe(Protocol):
    """Reads the GPUs of this host. Must be fast (called once per scrape interval on the event loop)."""

    def sample(self, indices: Sequence[int]) -> GpuSample | None:
        """Readings for the GPUs ``indices``, or ``None`` when they cannot be read."""


class NvmlProbe:
    """:class:`GpuProbe` over NVML. ``module``: a ``pynvml``-compatible module (default: import ``pynvml``).

    NVML is initialised on first use; when the import or ``nvmlInit`` fails the probe logs one warning and
    answers ``None`` from then on. A failing read (e.g. an index with no GPU) logs once and answers ``None``.
    """

    __slots__ = ("_available", "_handles", "_module", "_read_failed")

    def __init__(self, module: Any | None = None) -> None:
        self._module = module
        self._available: bool | None = None
        self._handles: dict[int, Any] = {}
        self._read_failed = False

    def _init(self) -> bool:
        if self._available is not None:
            return self._available
        try:
            if self._module is None:
                import pynvml

                self._module = pynvml
            self._module.nvmlInit()
            self._available = True
        except Exception as exc:
            self._available = False
            logger.warning(
                "litellm_ratebalance backpressure: NVML unavailable (%s: %s); GPU memory/utilisation signals "
                "are off, deployments run on their other signals (install nvidia-ml-py on the GPU host to use it)",
                type(exc).__name__,
                exc,
            )
        return self._available

    def sample(self, indices: Sequence[int]) -> GpuSample | None:
        if not indices or not self._init():
            return None
        nvml: Any = self._module
        try:
            memory = 0.0
            utilization: float | None = None
            for index in indices:
                handle = self._handles.get(index)
                if handle is None:
                    handle = self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                if info.total > 0:
                    memory = max(memory, info.used / info.total)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                utilization = max(utilization or 0.0, rates.gpu / 100.0)
        except Exception as exc:
            if not self._read_failed:
                self._read_failed = True
                logger.warning(
                    "litellm_ratebalance backpressure: reading GPUs %s through NVML failed (%s: %s); GPU signals "
                    "are off until a read succeeds",
                    list(indices),
                    type(exc).__name__,
                    exc,
                )
            return None
        if self._read_failed:
            self._read_failed = False
            logger.info("litellm_ratebalance backpressure: NVML reads work again")
        return GpuSample(memory, utilization)


def held_at_scrape(scraped_at: float, started: float, ended: float, prompt_tokens: int, output_tokens: int) -> float:
    """KV-cache tokens a request that has now finished held when the last scrape's reading was taken: its
    prompt and the part of its output generated by then (generation taken as even over its lifetime); 0
    unless it started before ``scraped_at`` and ended after it. All times in one clock (monotonic seconds).

    ``scraped_at`` must be when the scrape's answer arrived, not when it was sent: a request that ended while
    the scrape was in flight may or may not be in the reading, and only one that ended after the answer
    certainly is (its memory is then subtracted from the reading: :func:`server_signals`)."""
    if started >= scraped_at or ended <= scraped_at:
        return 0.0
    share = (scraped_at - started) / (ended - started)
    return max(0, prompt_tokens) + max(0, output_tokens) * share


def server_signals(
    metrics: ServerMetrics | None,
    gpu: GpuSample | None,
    *,
    kv_cache_tokens: int | None,
    server_queue_limit: int,
    gpu_utilization: bool,
    freed_tokens: float = 0.0,
) -> dict[str, float]:
    """The signals (fractions, 1.0 = full) that these readings support; absent readings give none.

    ``freed_tokens``: KV-cache tokens that requests finished since the scrape held in its reading (the sum of
    :func:`held_at_scrape`). The reading is up to one scrape interval old, and while a request of the top
    tier waits for memory, a reading that still counts requests that have ended would keep it waiting for
    nothing until the next scrape; that memory is subtracted (with a capacity to scale it by)."""
    signals: dict[str, float] = {}
    if metrics is not None:
        if metrics.kv_cache_usage is not None:
            signals["kv_cache"] = metrics.kv_cache_usage
        elif metrics.batch_tokens is not None and kv_cache_tokens:
            signals["kv_cache"] = metrics.batch_tokens / kv_cache_tokens
        if "kv_cache" in signals and kv_cache_tokens and freed_tokens > 0:
            signals["kv_cache"] = max(0.0, signals["kv_cache"] - freed_tokens / kv_cache_tokens)
        if metrics.waiting is not None:
            signals["server_queue"] = metrics.waiting / server_queue_limit
    if gpu is not None:
        signals["gpu_memory"] = gpu.memory_used_fraction
        if gpu_utilization and gpu.utilization is not None:
            signals["gpu_compute"] = gpu.utilization
    return signals


SCRAPE_FAILURES_BEFORE_WARNING = 2
"""Consecutive failed scrapes of one endpoint before it is reported. The first scrape starts with the first
request, while the proxy's event loop is busy with that request's one-off work (LiteLLM's lazy imports, the
tokenizer's load); a loop held past the scrape timeout fails the scrape (``ConnectTimeout``) though the server
is up. Until the last good reading goes stale a failure changes no decision, so one is not worth a warning."""


@dataclass(slots=True)
class _Scrape:
    at: float | None = None
    metrics: ServerMetrics | None = None
    failures: int = 0
    """Failed scrapes since the last good one."""


class SignalBoard:
    """Latest readings per deployment. ``fetch`` and ``gpu_probe`` are injectable (tests fake both).

    Times are the caller's monotonic seconds; the board never reads a clock itself.
    """

    __slots__ = ("_fetch", "_gpu", "_gpu_probe", "_scrapes")

    def __init__(self, fetch: Fetcher | None = None, gpu_probe: GpuProbe | None = None) -> None:
        self._fetch = fetch or httpx_fetcher()
        self._gpu_probe = gpu_probe
        self._scrapes: dict[str, _Scrape] = {}
        self._gpu: dict[tuple[int, ...], tuple[float, GpuSample | None]] = {}

    async def scrape(
        self, deployment_id: str, url: str, server: ServerKind, timeout: float, now: float
    ) -> ServerMetrics | None:
        """Fetch and parse one deployment's endpoint; keep the result; log transitions once (a failure when it
        reaches :data:`SCRAPE_FAILURES_BEFORE_WARNING` in a row, the recovery only after such a warning)."""
        state = self._scrapes.setdefault(deployment_id, _Scrape())
        try:
            metrics = parse_metrics(await self._fetch(url, timeout), server)
        except Exception as exc:
            state.failures += 1
            if state.failures == SCRAPE_FAILURES_BEFORE_WARNING:
                logger.warning(
                    "litellm_ratebalance backpressure: cannot scrape %s for deployment %s (%d attempts in a row, the "
                    "last %s: %s); it runs on its other signals until the endpoint answers",
                    url,
                    deployment_id,
                    state.failures,
                    type(exc).__name__,
                    exc,
                )
            return None
        if state.failures >= SCRAPE_FAILURES_BEFORE_WARNING:
            logger.info("litellm_ratebalance backpressure: metrics of deployment %s are back (%s)", deployment_id, url)
        state.failures = 0
        state.at, state.metrics = now, metrics
        return metrics

    def sample_gpus(self, indices: Sequence[int], now: float) -> GpuSample | None:
        """Read the GPUs through the probe (no probe: ``None``) and keep the reading."""
        key = tuple(indices)
        sample = self._gpu_probe.sample(key) if self._gpu_probe is not None else None
        self._gpu[key] = (now, sample)
        return sample

    def metrics(self, deployment_id: str, now: float, stale_after: float) -> ServerMetrics | None:
        state = self._scrapes.get(deployment_id)
        if state is None or state.at is None or now - state.at > stale_after:
            return None
        return state.metrics

    def gpus(self, indices: Sequence[int], now: float, stale_after: float) -> GpuSample | None:
        entry = self._gpu.get(tuple(indices))
        if entry is None or now - entry[0] > stale_after:
            return None
        return entry[1]

    def is_failing(self, deployment_id: str) -> bool:
        state = self._scrapes.get(deployment_id)
        """Whether the last scrape of this deployment failed (reported or not yet)."""
        return state is not None and state.failures > 0


def httpx_fetcher() -> Fetcher:
    """A :data:`Fetcher` over one shared ``httpx.AsyncClient`` per event loop (created on first use)."""
    clients: dict[int, Any] = {}

    async def fetch(url: str, timeout: float) -> str:
        import asyncio

        import httpx

        loop_id = id(asyncio.get_running_loop())
        client = clients.get(loop_id)
        if client is None:
            clients.clear()  # a client belongs to the loop that made it; an old loop's one is dead anyway
            # trust_env=False: the metrics endpoint sits next to the proxy; an HTTP(S)_PROXY meant for
            # provider traffic must not reroute it.
            client = clients[loop_id] = httpx.AsyncClient(trust_env=False)
        response = await client.get(url, timeout=timeout)
        response.raise_for_status()
        return str(response.text)

    return fetch
