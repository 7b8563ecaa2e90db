"""What an inference server's ``/metrics`` says: which server it is, its load, its KV-cache capacity, and what
is missing or wrong in it. Pure: the exposition's text in, a :class:`ServerReading` out (no I/O, no clock).

**Servers** (:data:`DIALECTS`), recognised by their metric names:

==========  =======================================  ==================================================
server      read                                     from
==========  =======================================  ==================================================
``vllm``    running / waiting requests               ``vllm:num_requests_running`` / ``_waiting``
            KV-cache usage (fraction 0..1)           ``vllm:kv_cache_usage_perc`` (V1), else
                                                     ``vllm:gpu_cache_usage_perc`` (V0, early V1)
            KV-cache capacity (tokens)               ``vllm:cache_config_info`` labels
                                                     ``num_gpu_blocks`` x ``block_size``
            preemptions (counter)                    ``vllm:num_preemptions_total``
``sglang``  running / waiting requests               ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``
            KV-cache usage (fraction 0..1)           ``sglang:token_usage``
            KV-cache capacity (tokens)               ``sglang:max_total_num_tokens``
            retractions (counter)                    ``sglang:num_retracted_requests_total``
``tgi``     running / waiting requests               ``tgi_batch_current_size`` / ``tgi_queue_size``
            tokens the batch may reach               ``tgi_batch_current_max_tokens``
            token budget (capacity)                  ``tgi_batch_max_total_tokens`` (TGI 3)
==========  =======================================  ==================================================

**Engines.** A data-parallel server exports one series per engine: vLLM labels them ``engine``, SGLang
``dp_rank``. Counts are summed over engines; the KV-cache usage is the memory used over the capacity of all
engines together (``sum(usage_i x capacity_i) / sum(capacity_i)``; the plain mean when a capacity is not
exported), never the fullest engine: a request goes to the engine with room. Series of one engine that
differ only by a shard label (SGLang's ``tp_rank``, ``pp_rank``, ``moe_ep_rank``) repeat one scheduler's
state and count once. Several ``model_name`` values behind one endpoint are summed (counts) and the fullest
one gives the usage and its capacity.

**Problems** (:class:`Problem`) are reported, never passed over: a body with none of the three servers'
metrics (a vLLM started with ``--disable-log-stats`` exports only process and HTTP metrics), a configured
``server`` that is not the one answering (the body is then read as the server it is), a signal the server
does not export, and a value out of its range (a usage fraction above 1, a negative count, a capacity of 0),
which is dropped.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal

__all__ = [
    "DIALECTS",
    "PREALLOCATING",
    "SERVER_KINDS",
    "Dialect",
    "Exposition",
    "Finding",
    "Problem",
    "Sample",
    "ServerKind",
    "ServerMetrics",
    "ServerReading",
    "ServerSetting",
    "counter_rise",
    "parse_exposition",
    "read_server",
]

ServerKind = Literal["vllm", "tgi", "sglang"]
SERVER_KINDS: tuple[ServerKind, ...] = ("vllm", "tgi", "sglang")
ServerSetting = Literal["auto", "vllm", "tgi", "sglang"]
"""The ``server`` setting of a deployment: a server kind, or ``auto`` (whichever answers)."""

PREALLOCATING: frozenset[ServerKind] = frozenset(SERVER_KINDS)
"""Servers that reserve their GPU memory at start-up (vLLM ``--gpu-memory-utilization``, SGLang
``--mem-fraction-static``, TGI's warm-up): NVML reads ~0.9 on such a server when it is idle."""

_SHARD_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_MAX_CAPACITY = 10**10
"""The largest capacity taken as real (the bound of the ``kv_cache_tokens`` setting)."""
_FRACTION_SLACK = 1e-6
"""A usage fraction this far above 1 is rounding, read as 1."""


class Problem(str, Enum):
    """What is wrong with a deployment's signals (the ``problem`` label of the metric, the codes in status)."""

    UNREACHABLE = "unreachable"
    """The endpoint did not answer (or answered an error) for several scrapes in a row."""
    UNRECOGNISED = "unrecognised"
    """The body has metrics of none of the supported servers."""
    SERVER_MISMATCH = "server_mismatch"
    """The configured ``server`` is not the one answering."""
    NO_KV_USAGE = "no_kv_usage"
    """No KV-cache usage can be read (not exported, out of range, or TGI without a capacity)."""
    NO_KV_CAPACITY = "no_kv_capacity"
    """No KV-cache capacity exported and no ``kv_cache_tokens``: the token-aware check is off."""
    NO_QUEUE = "no_queue"
    """The server's waiting-requests count is not exported: no ``server_queue`` signal."""
    OUT_OF_RANGE = "out_of_range"
    """A value outside its range was dropped."""


@dataclass(frozen=True, slots=True)
class Finding:
    problem: Problem
    detail: str
    """One sentence for the log and ``status``: what is missing or wrong, and what to do."""


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What one scrape said, combined over the server's engines; ``None`` for what it did not export."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    """Fraction of the KV cache in use, 0..1 (vLLM, SGLang)."""
    batch_tokens: float | None = None
    """Tokens the current batch may reach (TGI ``tgi_batch_current_max_tokens``): over the capacity, the usage."""
    kv_capacity_tokens: int | None = None
    """KV-cache capacity the server exports, all engines, in tokens."""
    preemptions: float | None = None
    """The server's counter of requests preempted (vLLM) or retracted (SGLang) for want of KV cache."""


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One scrape, read: the server answering (``None``: not recognised), its metrics, and what is wrong."""

    server: ServerKind | None
    metrics: ServerMetrics
    engines: int = 0
    """Engines (data-parallel ranks) whose series were combined."""
    findings: tuple[Finding, ...] = ()

    @property
    def problems(self) -> frozenset[Problem]:
        return frozenset(f.problem for f in self.findings)


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Dialect:
    """The metric names one server exports (see the module docstring)."""

    kind: ServerKind
    title: str
    prefix: str
    running: str
    waiting: str
    usage: tuple[str, ...] = ()
    """KV-cache usage fractions, by preference (the first one present is read)."""
    batch_tokens: str | None = None
    capacity: str | None = None
    """A gauge whose value is the capacity in tokens."""
    capacity_info: str | None = None
    """An info gauge whose labels ``num_gpu_blocks`` x ``block_size`` give the capacity."""
    preemptions: str | None = None
    capacity_hint: str = ""
    """Where a user finds the capacity to set ``kv_cache_tokens`` by hand."""

    @property
    def pattern(self) -> re.Pattern[str]:
        """Matches the start of each of its sample lines."""
        return _line_start(self.prefix)


@functools.cache
def _line_start(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]*{re.escape(prefix)}", re.MULTILINE)


DIALECTS: Mapping[ServerKind, Dialect] = {
    "vllm": Dialect(
        kind="vllm",
        title="vLLM",
        prefix="vllm:",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        capacity_info="vllm:cache_config_info",
        preemptions="vllm:num_preemptions_total",
        capacity_hint='"GPU KV cache size: N tokens" in its start-up log',
    ),
    "sglang": Dialect(
        kind="sglang",
        title="SGLang",
        prefix="sglang:",
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        usage=("sglang:token_usage",),
        capacity="sglang:max_total_num_tokens",
        preemptions="sglang:num_retracted_requests_total",
        capacity_hint='"max_total_num_tokens" in its start-up log',
    ),
    "tgi": Dialect(
        kind="tgi",
        title="TGI",
        prefix="tgi_",
        running="tgi_batch_current_size",
        waiting="tgi_queue_size",
        batch_tokens="tgi_batch_current_max_tokens",
        capacity="tgi_batch_max_total_tokens",
        capacity_hint='"Setting max batch total tokens to N" in its start-up log, or --max-batch-total-tokens',
    ),
}


@dataclass(frozen=True, slots=True)
class Exposition:
    """A ``/metrics`` body, as far as the servers' signals need it."""

    series: Mapping[ServerKind, int]
    """Sample lines per server whose metric names start with its prefix (``vllm:``, ``tgi_``, ``sglang:``)."""
    samples: tuple[Sample, ...]
    """The samples of the metrics :data:`DIALECTS` read, with a finite value."""
    others: frozenset[str] = frozenset()
    """When no server's metric is there: the names the body has instead (to say what it is)."""


_READ = frozenset(
    name
    for d in DIALECTS.values()
    for name in (d.running, d.waiting, *d.usage, d.batch_tokens, d.capacity, d.capacity_info, d.preemptions)
    if name is not None
)
"""Every metric name a dialect reads."""
_READ_LINES = re.compile(
    rf"^[ \t]*(?:{'|'.join(re.escape(name) for name in sorted(_READ, key=len, reverse=True))})[{{ \t].*$",
    re.MULTILINE,
)
"""The sample lines of those metrics."""


def parse_exposition(text: str) -> Exposition:
    """Read a Prometheus text exposition; ValueError when it is not one.

    Only the lines of the metrics :data:`DIALECTS` read are parsed (labels unescaped, values checked): a
    vLLM body is mostly histogram buckets, and parsing all of it costs the proxy's event loop several
    milliseconds per scrape. A body with none of those lines is checked line by line instead."""
    from prometheus_client.parser import text_string_to_metric_families

    series = {kind: len(DIALECTS[kind].pattern.findall(text)) for kind in SERVER_KINDS}
    kept = _READ_LINES.findall(text)
    others: frozenset[str] = frozenset()
    if not kept and not any(series.values()):
        others = _names(text)
    samples: list[Sample] = []
    try:
        for family in text_string_to_metric_families("\n".join(kept) + "\n"):
            for sample in family.samples:
                value = float(sample.value)
                if math.isfinite(value):
                    samples.append(Sample(sample.name, sample.labels, value))
    except Exception as exc:  # the parser raises ValueError and friends on malformed lines
        raise ValueError(f"not a Prometheus text exposition: {exc}") from exc
    return Exposition({k: n for k, n in series.items() if n}, tuple(samples), others)


def _names(text: str) -> frozenset[str]:
    """Every sample's metric name; ValueError at a line that is no sample (an HTML error page, say)."""
    names: set[str] = set()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _METRIC_NAME.match(stripped)
        if match is None or match.end() == len(stripped) or stripped[match.end()] not in "{ \t":
            raise ValueError(f"not a Prometheus text exposition: {stripped[:80]!r} is not a sample")
        names.add(match.group())
    return frozenset(names)


def _detect(series: Mapping[ServerKind, int]) -> list[ServerKind]:
    """The servers with series in a body, most series first."""
    return sorted((kind for kind, n in series.items() if n), key=lambda kind: -series[kind])


def read_server(
    exposition: Exposition, configured: ServerKind | None = None, *, capacity_configured: bool = False
) -> ServerReading:
    """Read a parsed body (:func:`parse_exposition`) as the server that exported it.

    ``configured``: the ``server`` setting (``None``: detect it); when another server answers, the body is
    read as that server and :attr:`Problem.SERVER_MISMATCH` says so. ``capacity_configured``: the deployment
    sets ``kv_cache_tokens``, so a capacity the server does not export is no problem."""
    present = _detect(exposition.series)
    if not present:
        return ServerReading(None, ServerMetrics(), 0, (_unrecognised(exposition.others),))
    findings: list[Finding] = []
    kind = configured if configured in present else present[0]
    if configured is not None and configured != kind:
        findings.append(
            Finding(
                Problem.SERVER_MISMATCH,
                f"configured server: {configured}, but the endpoint exports {DIALECTS[kind].title}'s metrics; "
                f"they are read as {kind} (set server: {kind}, or auto)",
            )
        )
    reader = _Reader(DIALECTS[kind], exposition.samples, findings)
    metrics, engines = reader.read()
    _missing(DIALECTS[kind], metrics, reader, capacity_configured, findings)
    return ServerReading(kind, metrics, engines, tuple(findings))


def counter_rise(previous: float | None, current: float | None) -> float:
    """How much a server counter rose between two readings: 0 for the first one or a missing one; after a
    fall (the server restarted and counts from 0 again) the whole new value."""
    if previous is None or current is None:
        return 0.0
    return current - previous if current >= previous else current


# -- reading one dialect ----------------------------------------------------------------------------------


_Key = tuple[str, str]
"""(model_name, engine) of a series."""


class _Reader:
    """Collects one dialect's series by (model, engine), collapsing shard labels, and validates them."""

    __slots__ = ("_by_name", "_dialect", "_findings", "engines_seen", "rejected")

    def __init__(self, dialect: Dialect, samples: Iterable[Sample], findings: list[Finding]) -> None:
        self._dialect = dialect
        self._findings = findings
        self._by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            if sample.name.startswith(dialect.prefix):
                self._by_name.setdefault(sample.name, []).append(sample)
        self.engines_seen: set[str] = set()
        self.rejected: set[str] = set()
        """Metrics dropped for a value out of range (reported as such)."""

    def has(self, name: str | None) -> bool:
        return name is not None and name in self._by_name

    def read(self) -> tuple[ServerMetrics, int]:
        d = self._dialect
        running = self._total(d.running)
        waiting = self._total(d.waiting)
        batch_tokens = self._total(d.batch_tokens) if d.batch_tokens else None
        preemptions = self._total(d.preemptions) if d.preemptions else None
        capacities = self._capacities()
        usage_name = next((name for name in d.usage if name in self._by_name), None)
        usage: float | None = None
        capacity = sum(capacities.values()) if capacities else None
        if usage_name is not None:
            usage, capacity = self._usage(usage_name, capacities, capacity)
        metrics = ServerMetrics(
            running=running,
            waiting=waiting,
            kv_cache_usage=usage,
            batch_tokens=batch_tokens,
            kv_capacity_tokens=None if capacity is None else int(capacity),
            preemptions=preemptions,
        )
        return metrics, len(self.engines_seen)

    # -- series ---------------------------------------------------------------------------------------------
    def _series(self, name: str) -> dict[_Key, tuple[float, Sample]]:
        """The series of ``name`` by (model, engine); shards of one engine count once (their largest value)."""
        out: dict[_Key, tuple[float, Sample]] = {}
        for sample in self._by_name.get(name, ()):
            labels = sample.labels
            engine = labels.get("engine", labels.get("dp_rank", ""))
            key = (labels.get("model_name", ""), engine)
            if key not in out or sample.value > out[key][0]:
                out[key] = (sample.value, sample)
            self.engines_seen.add(engine)
        return out

    def _total(self, name: str) -> float | None:
        """Sum of a count over engines and models; ``None`` when absent or a value is negative (reported)."""
        series = self._series(name)
        if not series:
            return None
        bad = [sample for value, sample in series.values() if value < 0]
        if bad:
            self._out_of_range(bad[0], "a count of at least 0")
            return None
        return sum(value for value, _ in series.values())

    def _capacities(self) -> dict[str, float]:
        """Exported KV-cache capacity per engine, in tokens (empty when not exported or out of range)."""
        d = self._dialect
        per_engine: dict[str, float] = {}
        if d.capacity is not None:
            for (_, engine), (value, sample) in self._series(d.capacity).items():
                if not 0 < value <= _MAX_CAPACITY:
                    self._out_of_range(sample, f"a capacity of 1 to {_MAX_CAPACITY} tokens")
                    return {}
                per_engine[engine] = max(per_engine.get(engine, 0.0), value)
        elif d.capacity_info is not None:
            for sample in self._by_name.get(d.capacity_info, ()):
                tokens = _blocks_times_size(sample.labels)
                if tokens is None:
                    continue  # not profiled yet ("None"): no capacity, not an error
                engine = sample.labels.get("engine", "")
                if not 0 < tokens <= _MAX_CAPACITY:
                    self._out_of_range(sample, "num_gpu_blocks and block_size of at least 1", shown=tokens)
                    return {}
                per_engine[engine] = max(per_engine.get(engine, 0.0), tokens)
        return per_engine

    def _usage(
        self, name: str, capacities: Mapping[str, float], capacity: float | None
    ) -> tuple[float | None, float | None]:
        """The usage of all engines together (see the module docstring) and the capacity it refers to."""
        series = self._series(name)
        by_model: dict[str, list[tuple[str, float]]] = {}
        for (model, engine), (value, sample) in series.items():
            if not 0.0 <= value <= 1.0 + _FRACTION_SLACK:
                self._out_of_range(sample, "a fraction from 0 to 1")
                return None, capacity
            by_model.setdefault(model, []).append((engine, min(1.0, value)))
        worst: tuple[float, float | None] | None = None
        model_capacity: float | None
        for engines in by_model.values():
            caps = [capacities.get(engine) for engine, _ in engines]
            if len(engines) == 1:
                combined, model_capacity = engines[0][1], caps[0] if caps[0] is not None else capacity
            elif all(c is not None for c in caps) and sum(c or 0.0 for c in caps) > 0:
                total = sum(c or 0.0 for c in caps)
                combined = sum(u * (c or 0.0) for (_, u), c in zip(engines, caps, strict=True)) / total
                model_capacity = total
            else:
                combined = sum(u for _, u in engines) / len(engines)
                model_capacity = capacity
            if worst is None or combined > worst[0]:
                worst = (combined, model_capacity)
        if worst is None:
            return None, capacity
        return worst

    def _out_of_range(self, sample: Sample, expected: str, *, shown: float | None = None) -> None:
        self.rejected.add(sample.name)
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in _SHARD_LABELS)
        series = f"{sample.name}{{{labels}}}" if labels else sample.name
        value = sample.value if shown is None else shown
        self._findings.append(
            Finding(Problem.OUT_OF_RANGE, f"{series} = {value:g} is not {expected}: the value is ignored")
        )


def _blocks_times_size(labels: Mapping[str, str]) -> float | None:
    try:
        return float(int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
    except (KeyError, ValueError):
        return None


def _missing(
    d: Dialect, metrics: ServerMetrics, reader: _Reader, capacity_configured: bool, findings: list[Finding]
) -> None:
    """Findings for the signals ``d`` should export but did not (a value out of range is reported as such)."""
    if not reader.has(d.waiting):
        findings.append(Finding(Problem.NO_QUEUE, f"{d.title} exports no {d.waiting}: no server_queue signal"))
    capacity_rejected = bool({d.capacity, d.capacity_info} & reader.rejected)
    has_capacity = metrics.kv_capacity_tokens is not None or capacity_configured
    hint = f"set kv_cache_tokens ({d.capacity_hint})"
    if d.batch_tokens is not None:  # TGI: the usage is the batch's tokens over the capacity
        if not reader.has(d.batch_tokens):
            findings.append(Finding(Problem.NO_KV_USAGE, f"{d.title} exports no {d.batch_tokens}: no kv_cache signal"))
        elif not has_capacity and not capacity_rejected:
            findings.append(
                Finding(
                    Problem.NO_KV_USAGE,
                    f"{d.title} exports {d.batch_tokens} but no {d.capacity} (a TGI before 3.0?) and kv_cache_tokens "
                    f"is unset: no kv_cache signal; {hint}",
                )
            )
    elif not any(reader.has(name) for name in d.usage):
        findings.append(
            Finding(Problem.NO_KV_USAGE, f"{d.title} exports none of {', '.join(d.usage)}: no kv_cache signal")
        )
    if not has_capacity and not capacity_rejected:
        source = d.capacity or f"{d.capacity_info} with num_gpu_blocks x block_size"
        findings.append(
            Finding(
                Problem.NO_KV_CAPACITY,
                f"{d.title} exports no KV-cache capacity ({source}) and kv_cache_tokens is unset: the token-aware "
                f"check is off; {hint}",
            )
        )


def _unrecognised(names: frozenset[str]) -> Finding:
    families = sorted({_family_prefix(name) for name in names})
    seen = f"it has {len(names)} metrics ({', '.join(families[:6])}{', ...' if len(families) > 6 else ''})"
    if not names:
        seen = "it is empty"
    return Finding(
        Problem.UNRECOGNISED,
        f"the endpoint exports no metric of vLLM (vllm:*), TGI (tgi_*) or SGLang (sglang:*): {seen}; the "
        "deployment runs on its concurrency limit alone. A vLLM started with --disable-log-stats exports none; "
        "SGLang needs --enable-metrics",
    )


def _family_prefix(name: str) -> str:
    """``process_cpu_seconds_total`` -> ``process_*``; ``vllm:x`` -> ``vllm:*``."""
    for separator in (":", "_"):
        head, sep, _ = name.partition(separator)
        if sep and head:
            return f"{head}{separator}*"
    return name
