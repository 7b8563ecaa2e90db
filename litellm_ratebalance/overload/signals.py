"""Server signals: the inference server's Prometheus endpoint and the local GPUs through NVML.

* :func:`parse_metrics` reads a Prometheus text exposition as one server's metrics (vLLM, TGI, SGLang:
  :mod:`.servers` has the names, the combination of data-parallel engines and the range checks).
* :class:`GpuProbe` is the interface to GPU readings; :class:`NvmlProbe` implements it over ``pynvml``
  (package ``nvidia-ml-py``, an optional import) or any module with the same functions (tests pass
  :mod:`litellm_ratebalance.simulate.fake_nvml`). :class:`IdleMemory` turns a reading next to a server that
  reserves its memory up front into the memory above what it holds while idle.
* :class:`SignalBoard` keeps the latest scrape per deployment, which server answers and what is wrong with
  its signals (:class:`SignalHealth`), the KV-cache capacity it exports and the rise of its preemption
  counter; :func:`server_signals` turns readings into the signals of :mod:`~litellm_ratebalance.overload.shedding`.

Reporting: every problem of a deployment's signals (:class:`~.servers.Problem`: an endpoint that does not
answer, a body of no supported server, a configured ``server`` that is not the one answering, a signal not
exported, a value out of range) logs one WARNING when it appears and one INFO line when it clears, and stays
in :meth:`SignalBoard.health` (the adapter turns that into a metric and the ``status`` report) while it
holds; nothing falls back silently. The deployment runs on the signals it still has: a scrape older than
``stale_after`` counts as absent. An endpoint is reported only once it failed
:data:`SCRAPE_FAILURES_BEFORE_WARNING` scrapes in a row: a single failure, typically the first scrape timing
out while the proxy's event loop is busy with its first requests, is retried at the next interval silently.
NVML that cannot be loaded logs one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from litellm_ratebalance.overload.servers import (
    Finding,
    Problem,
    ServerKind,
    ServerMetrics,
    ServerReading,
    ServerSetting,
    counter_rise,
    parse_exposition,
    read_server,
)

__all__ = [
    "OVERFLOW_MARKERS",
    "SCRAPE_FAILURES_BEFORE_WARNING",
    "SIGNAL_REPORT_REFRESH_SECONDS",
    "SIGNAL_REPORT_TTL_SECONDS",
    "Fetcher",
    "GpuProbe",
    "GpuSample",
    "IdleMemory",
    "LogOnce",
    "NvmlProbe",
    "ServerMetrics",
    "ServerSetting",
    "SignalBoard",
    "SignalHealth",
    "SignalUpkeep",
    "held_at_scrape",
    "httpx_fetcher",
    "is_overflow_error",
    "parse_metrics",
    "server_signals",
]

logger = logging.getLogger("litellm_ratebalance.backpressure")

Fetcher = Callable[[str, float], Awaitable[str]]
"""``await fetch(url, timeout_seconds) -> body text``; raises on any failure (status >= 400 included)."""


def parse_metrics(text: str, server: ServerSetting = "auto") -> ServerMetrics:
    """Parse a Prometheus text exposition as ``server``'s metrics (``auto``: whichever server exported them;
    another server than the one named is read as the one it is); ValueError when it is not an exposition."""
    return read_server(parse_exposition(text), None if server == "auto" else server).metrics


@dataclass(frozen=True, slots=True)
class GpuSample:
    memory_used_fraction: float | None
    """Worst (largest) used / total memory over the GPUs asked for (``None``: no memory signal, see
    :class:`IdleMemory`)."""
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


class IdleMemory:
    """GPU memory above what the GPUs hold while their server is idle, as a fraction of what is left then.

    vLLM, SGLang and TGI reserve most of the GPU's memory when they start (vLLM's ``--gpu-memory-utilization``
    0.9 by default) and keep the KV cache inside it, so NVML reads ~0.9 whether they serve nothing or are
    full; their KV-cache usage comes from ``/metrics`` instead. Next to such a server the memory signal is
    ``(used - idle) / (1 - idle)``, ``idle`` being the lowest reading taken while the server answered its
    metrics and had no request running and none in flight through the proxy: 0 while the server keeps to
    what it reserved, rising when something else takes the GPU's memory (another process, a server that grows
    past its reservation). Until such an idle reading exists there is no memory signal; :meth:`reset` (the
    endpoint stopped answering, e.g. the server restarts) forgets the floor.
    """

    __slots__ = ("_floor",)

    def __init__(self) -> None:
        self._floor: float | None = None

    @property
    def floor(self) -> float | None:
        """The idle reading (used / total), ``None`` before one."""
        return self._floor

    def observe_idle(self, fraction: float) -> None:
        """A reading taken while the server was idle."""
        if 0.0 <= fraction <= 1.0:
            self._floor = fraction if self._floor is None else min(self._floor, fraction)

    def reset(self) -> None:
        self._floor = None

    def above_idle(self, sample: GpuSample) -> GpuSample:
        """``sample`` with its memory read as the share of the idle headroom in use (``None`` before a floor)."""
        used = sample.memory_used_fraction
        if used is None or self._floor is None:
            return replace(sample, memory_used_fraction=None)
        headroom = 1.0 - self._floor
        share = 1.0 if used > self._floor else 0.0
        if headroom > 0:
            share = (used - self._floor) / headroom
        return replace(sample, memory_used_fraction=max(0.0, min(1.0, share)))


class SignalUpkeep:
    """One deployment's signal bookkeeping between background steps (no clock of its own: times are passed).

    * :attr:`idle_memory`: the GPU memory floor of a server that reserves its memory up front;
    * :meth:`report_due`: whether the signal report (server, problems) must be written to the shared store:
      when it changed, or ``refresh`` seconds after the last write (the stored report lapses unless renewed);
    * :meth:`preemptions_to_log`: the preemptions to name in a log line now, at most one line per ``interval``
      (the preemptions in between are summed into the next line).
    """

    __slots__ = ("_logged_at", "_published", "_published_at", "_unlogged", "idle_memory", "overflows")

    def __init__(self) -> None:
        self.idle_memory = IdleMemory()
        self.overflows = LogOnce()
        """The server's out-of-memory failures the layer did not prevent, at most one log line per interval."""
        self._published: object = None
        self._published_at = float("-inf")
        self._logged_at = float("-inf")
        self._unlogged = 0.0

    def report_due(self, report: object, now: float, refresh: float) -> bool:
        """True (and noted as written) when ``report`` differs from the last one written or ``refresh``
        seconds passed since; call :meth:`report_failed` when the write then fails."""
        if report == self._published and now - self._published_at < refresh:
            return False
        self._published, self._published_at = report, now
        return True

    def report_failed(self) -> None:
        """The last write did not land: the next step tries again."""
        self._published, self._published_at = None, float("-inf")

    def preemptions_to_log(self, rise: float, now: float, interval: float) -> float | None:
        """Add ``rise`` preemptions; the count to log now (all since the last line), or ``None`` to stay quiet."""
        self._unlogged += max(0.0, rise)
        if self._unlogged <= 0 or now - self._logged_at < interval:
            return None
        count, self._unlogged, self._logged_at = self._unlogged, 0.0, now
        return count


class LogOnce:
    """Events to name in a log line at most once per interval (no clock: times are passed); the events in
    between are summed into the next line."""

    __slots__ = ("_logged_at", "_unlogged")

    def __init__(self) -> None:
        self._logged_at = float("-inf")
        self._unlogged = 0.0

    def to_log(self, count: float, now: float, interval: float) -> float | None:
        """Add ``count`` events; the count to log now (all since the last line), or ``None`` to stay quiet."""
        self._unlogged += max(0.0, count)
        if self._unlogged <= 0 or now - self._logged_at < interval:
            return None
        logged, self._unlogged, self._logged_at = self._unlogged, 0.0, now
        return logged


OVERFLOW_MARKERS = ("out of memory", "outofmemory", "kv cache overflow", "kv-cache overflow")
"""Lower-case phrases of a server error that says the server ran out of GPU / KV-cache memory (CUDA's
``CUDA out of memory``, PyTorch's ``OutOfMemoryError``)."""


def is_overflow_error(message: str) -> bool:
    """Whether a server error's message says it ran out of GPU or KV-cache memory."""
    text = message.lower()
    return any(marker in text for marker in OVERFLOW_MARKERS)


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
        if gpu.memory_used_fraction is not None:
            signals["gpu_memory"] = gpu.memory_used_fraction
        if gpu_utilization and gpu.utilization is not None:
            signals["gpu_compute"] = gpu.utilization
    return signals


SIGNAL_REPORT_REFRESH_SECONDS = 30.0
"""An unchanged signal report (server answering, problems) is written to the shared store again this often,
per deployment and replica; a changed one at once."""
SIGNAL_REPORT_TTL_SECONDS = 90.0
"""A stored signal report that no replica renewed for this long lapses (``status`` then shows none)."""

SCRAPE_FAILURES_BEFORE_WARNING = 2
"""Consecutive failed scrapes of one endpoint before it is reported. The first scrape starts with the first
request, while the proxy's event loop is busy with that request's one-off work (LiteLLM's lazy imports, the
tokenizer's load); a loop held past the scrape timeout fails the scrape (``ConnectTimeout``) though the server
is up. Until the last good reading goes stale a failure changes no decision, so one is not worth a warning."""


@dataclass(frozen=True, slots=True)
class SignalHealth:
    """What a deployment's signals are worth now: the server answering (``None``: not recognised or never
    read), the engines combined, and every problem that holds (:class:`~.servers.Finding`; empty: all well)."""

    server: ServerKind | None
    engines: int
    findings: tuple[Finding, ...]

    @property
    def problems(self) -> tuple[Problem, ...]:
        """The problems, each once, in the order found."""
        return tuple(dict.fromkeys(f.problem for f in self.findings))


@dataclass(slots=True)
class _Scrape:
    at: float | None = None
    metrics: ServerMetrics | None = None
    failures: int = 0
    """Failed scrapes since the last good one."""
    failure: str = ""
    reading: ServerReading | None = None
    """The last good scrape, read."""
    capacity: int | None = None
    """The last KV-cache capacity the server exported (kept while the endpoint is down: it does not change
    while the server runs, and the next good scrape brings a new one)."""
    counter: float | None = None
    preempted: float = 0.0
    """Rise of the server's preemption counter not yet taken (:meth:`SignalBoard.take_preemptions`)."""
    reported: frozenset[Problem] = frozenset()
    """Problems logged as appeared and not yet as cleared."""
    override_noted: bool = False


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
        self,
        deployment_id: str,
        url: str,
        server: ServerSetting,
        timeout: float,
        now: float,
        *,
        kv_cache_tokens: int | None = None,
    ) -> ServerMetrics | None:
        """Fetch and read one deployment's endpoint as ``server`` (``auto``: whichever answers); keep the
        result; log what changed once (see the module docstring). ``kv_cache_tokens``: the deployment's
        configured capacity (then an exported one need not exist). ``None`` when the scrape failed."""
        state = self._scrapes.setdefault(deployment_id, _Scrape())
        try:
            exposition = parse_exposition(await self._fetch(url, timeout))
        except Exception as exc:
            state.failures += 1
            state.failure = f"{type(exc).__name__}: {exc}"
            if state.failures == SCRAPE_FAILURES_BEFORE_WARNING:
                logger.warning(
                    "litellm_ratebalance backpressure: cannot scrape %s for deployment %s (%d attempts in a row, the "
                    "last %s); it runs on its other signals until the endpoint answers",
                    url,
                    deployment_id,
                    state.failures,
                    state.failure,
                )
            return None
        if state.failures >= SCRAPE_FAILURES_BEFORE_WARNING:
            logger.info("litellm_ratebalance backpressure: metrics of deployment %s are back (%s)", deployment_id, url)
        state.failures = 0
        reading = read_server(
            exposition, None if server == "auto" else server, capacity_configured=kv_cache_tokens is not None
        )
        metrics = reading.metrics
        if metrics.kv_capacity_tokens is not None:
            state.capacity = metrics.kv_capacity_tokens
        if metrics.preemptions is not None:
            state.preempted += counter_rise(state.counter, metrics.preemptions)
            state.counter = metrics.preemptions
        self._report(deployment_id, url, state, reading, kv_cache_tokens)
        state.at, state.metrics, state.reading = now, metrics, reading
        return metrics

    def _report(
        self, deployment_id: str, url: str, state: _Scrape, reading: ServerReading, kv_cache_tokens: int | None
    ) -> None:
        """Log each problem once when it appears and the problems that cleared (a deployment whose signals are
        all there logs nothing), and a configured capacity that differs from the exported one, once."""
        exported = reading.metrics.kv_capacity_tokens
        if kv_cache_tokens is not None and exported is not None and not state.override_noted:
            state.override_noted = True
            if abs(kv_cache_tokens - exported) > 0.01 * exported:
                log = logger.warning if kv_cache_tokens > exported else logger.info
                log(
                    "litellm_ratebalance backpressure: deployment %s: kv_cache_tokens %d overrides the %d tokens its "
                    "server exports%s",
                    deployment_id,
                    kv_cache_tokens,
                    exported,
                    " (more than the server has: requests admitted on it may be preempted)"
                    if kv_cache_tokens > exported
                    else "",
                )
        problems = reading.problems
        for finding in reading.findings:
            if finding.problem not in state.reported:
                logger.warning(
                    "litellm_ratebalance backpressure: deployment %s (%s): %s [%s]",
                    deployment_id,
                    url,
                    finding.detail,
                    finding.problem.value,
                )
        cleared = sorted(p.value for p in state.reported - problems)
        if cleared:
            logger.info(
                "litellm_ratebalance backpressure: deployment %s: signal problems cleared: %s",
                deployment_id,
                ", ".join(cleared),
            )
        state.reported = problems

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
        """Whether the last scrape of this deployment failed (reported or not yet)."""
        state = self._scrapes.get(deployment_id)
        return state is not None and state.failures > 0

    def capacity(self, deployment_id: str) -> int | None:
        """The KV-cache capacity (tokens) the deployment's server last exported; ``None``: never."""
        state = self._scrapes.get(deployment_id)
        return None if state is None else state.capacity

    def server(self, deployment_id: str) -> ServerKind | None:
        """The server the last good scrape recognised (``None``: none yet, or not a supported one)."""
        state = self._scrapes.get(deployment_id)
        return None if state is None or state.reading is None else state.reading.server

    def health(self, deployment_id: str) -> SignalHealth | None:
        """The deployment's signal problems now (``None`` before its first scrape answered or was reported
        as failing): those of the last good scrape, and :attr:`~.servers.Problem.UNREACHABLE` while the
        endpoint has failed :data:`SCRAPE_FAILURES_BEFORE_WARNING` scrapes or more in a row."""
        state = self._scrapes.get(deployment_id)
        if state is None:
            return None
        failing = state.failures >= SCRAPE_FAILURES_BEFORE_WARNING
        if state.reading is None and not failing:
            return None
        reading = state.reading
        findings = reading.findings if reading is not None else ()
        if failing:
            unreachable = Finding(
                Problem.UNREACHABLE, f"{state.failures} scrapes in a row failed, the last {state.failure}"
            )
            findings = (unreachable, *findings)
        return SignalHealth(
            reading.server if reading is not None else None, reading.engines if reading is not None else 0, findings
        )

    def take_preemptions(self, deployment_id: str) -> float:
        """How far the server's preemption (vLLM) or retraction (SGLang) counter rose since the last call: 0 at
        the first reading, and after a restart (the counter falls) its new value. Resets to 0."""
        state = self._scrapes.get(deployment_id)
        if state is None:
            return 0.0
        rise, state.preempted = state.preempted, 0.0
        return rise


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
