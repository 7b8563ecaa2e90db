"""``/metrics`` bodies of real inference servers, written from their sources (names, labels, types and the
exposition format of the client library each uses); the values are made up.

* vLLM V1 (``vllm/v1/metrics/loggers.py``): labels ``model_name`` and ``engine`` (one per data-parallel
  engine); ``vllm:cache_config_info`` is an info gauge whose labels are the cache config's fields as strings
  plus ``engine``; counters through ``prometheus_client`` (``_total`` and ``_created`` samples).
* vLLM V0 (``vllm/engine/metrics.py``): label ``model_name`` only, ``gpu_cache_usage_perc``,
  ``num_preemptions_total``, ``cache_config_info`` without ``engine``.
* vLLM started with ``--disable-log-stats``: no stat logger, so only the default registry's process and
  Python collectors and the HTTP instrumentator's series.
* TGI 3 (``backends/v3/src``, ``router/src/server.rs``): the ``metrics`` crate through
  ``metrics-exporter-prometheus`` 0.15: no labels on the gauges, ``# HELP`` only for described metrics,
  counters without ``_total``, a blank line between families.
* SGLang (``python/sglang/srt/metrics/collector.py``, ``scheduler_metrics_mixin.py``): scheduler gauges
  labelled ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank`` and, with data parallelism, ``dp_rank``;
  ``prometheus_client`` in multiprocess mode (no ``_created`` samples).
"""

from __future__ import annotations

from typing import Any

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

_PROCESS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12873.0
python_gc_objects_collected_total{generation="1"} 3341.0
python_gc_objects_collected_total{generation="2"} 981.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"} 1.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 3.178496e+09
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76518304297e+09
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 812.44
# HELP process_open_fds Number of open file descriptors.
# TYPE process_open_fds gauge
process_open_fds 97.0
"""

_HTTP = """\
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 447.0
http_requests_total{handler="/v1/models",method="GET",status="2xx"} 3.0
# HELP http_requests_created Total number of requests by method, status and handler.
# TYPE http_requests_created gauge
http_requests_created{handler="/v1/chat/completions",method="POST",status="2xx"} 1.765183101e+09
# HELP http_request_size_bytes Content length of incoming requests by handler.
# TYPE http_request_size_bytes summary
http_request_size_bytes_count{handler="/v1/chat/completions"} 447.0
http_request_size_bytes_sum{handler="/v1/chat/completions"} 512311.0
# HELP http_request_duration_highr_seconds Latency with many buckets but no API specific labels.
# TYPE http_request_duration_highr_seconds histogram
http_request_duration_highr_seconds_bucket{le="0.01"} 3.0
http_request_duration_highr_seconds_bucket{le="0.5"} 12.0
http_request_duration_highr_seconds_bucket{le="1.0"} 96.0
http_request_duration_highr_seconds_bucket{le="+Inf"} 450.0
http_request_duration_highr_seconds_count 450.0
http_request_duration_highr_seconds_sum 1311.9
# HELP http_request_duration_seconds Latency with only few buckets by handler.
# TYPE http_request_duration_seconds histogram
http_request_duration_seconds_bucket{handler="/v1/chat/completions",le="0.1",method="POST"} 0.0
http_request_duration_seconds_bucket{handler="/v1/chat/completions",le="1.0",method="POST"} 96.0
http_request_duration_seconds_bucket{handler="/v1/chat/completions",le="+Inf",method="POST"} 447.0
http_request_duration_seconds_count{handler="/v1/chat/completions",method="POST"} 447.0
http_request_duration_seconds_sum{handler="/v1/chat/completions",method="POST"} 1310.2
"""

_V1_CACHE_INFO_LABELS = (
    'block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",'
    'engine="{engine}",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",'
    'num_gpu_blocks="{blocks}",num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",'
    'sliding_window="None",swap_space="4",swap_space_bytes="4294967296"'
)


def vllm_v1(engines: list[dict[str, float]], *, model: str = MODEL) -> str:
    """A vLLM V1 body; one dict per engine: running, waiting, usage, preemptions, blocks."""

    def per_engine(name: str, key: str, fmt: str = "{:.1f}") -> str:
        return "".join(
            f'{name}{{engine="{i}",model_name="{model}"}} {fmt.format(e[key])}\n' for i, e in enumerate(engines)
        )

    created = "".join(f'vllm:num_preemptions_created{{engine="{i}",model_name="{model}"}} 1.765183051e+09\n'
                      for i in range(len(engines)))  # fmt: skip
    info = "".join(
        f"vllm:cache_config_info{{{_V1_CACHE_INFO_LABELS.format(engine=i, blocks=int(e['blocks']))}}} 1.0\n"
        for i, e in enumerate(engines)
    )
    success = "".join(
        f'vllm:request_success_total{{engine="{i}",finished_reason="{reason}",model_name="{model}"}} {n}\n'
        for i in range(len(engines))
        for reason, n in (("stop", "410.0"), ("length", "37.0"), ("abort", "0.0"))
    )
    ttft = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{engine="{i}",le="{le}",model_name="{model}"}} {n}\n'
        for i in range(len(engines))
        for le, n in (("0.001", "0.0"), ("0.02", "15.0"), ("0.1", "301.0"), ("1.0", "440.0"), ("+Inf", "447.0"))
    )
    return (
        _PROCESS
        + "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        + "# TYPE vllm:num_requests_running gauge\n"
        + per_engine("vllm:num_requests_running", "running")
        + "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        + "# TYPE vllm:num_requests_waiting gauge\n"
        + per_engine("vllm:num_requests_waiting", "waiting")
        + "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
        + "vllm:kv_cache_usage_perc instead.\n"
        + "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        + per_engine("vllm:gpu_cache_usage_perc", "usage", "{}")
        + "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        + "# TYPE vllm:kv_cache_usage_perc gauge\n"
        + per_engine("vllm:kv_cache_usage_perc", "usage", "{}")
        + "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        + "# TYPE vllm:num_preemptions_total counter\n"
        + per_engine("vllm:num_preemptions_total", "preemptions")
        + "# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.\n"
        + "# TYPE vllm:num_preemptions_created gauge\n"
        + created
        + "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        + "# TYPE vllm:request_success_total counter\n"
        + success
        + "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
        + "# TYPE vllm:time_to_first_token_seconds histogram\n"
        + ttft
        + "".join(
            f'vllm:time_to_first_token_seconds_count{{engine="{i}",model_name="{model}"}} 447.0\n'
            f'vllm:time_to_first_token_seconds_sum{{engine="{i}",model_name="{model}"}} 61.2\n'
            for i in range(len(engines))
        )
        + "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        + "# TYPE vllm:cache_config_info gauge\n"
        + info
        + _HTTP
    )


VLLM_V1_ONE_ENGINE = vllm_v1([{"running": 14, "waiting": 3, "usage": 0.6875, "preemptions": 2, "blocks": 27931}])
VLLM_V1_TWO_ENGINES = vllm_v1(
    [
        {"running": 9, "waiting": 4, "usage": 0.91, "preemptions": 5, "blocks": 27931},
        {"running": 2, "waiting": 0, "usage": 0.22, "preemptions": 0, "blocks": 27931},
    ]
)

VLLM_V0 = (
    """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",cpu_offload_gb="0",enable_prefix_caching="False",\
gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="2048",num_gpu_blocks="7281",\
num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"} 1.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4127
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.81832e+06
# HELP vllm:avg_generation_throughput_toks_per_s Average generation throughput in tokens/s.
# TYPE vllm:avg_generation_throughput_toks_per_s gauge
vllm:avg_generation_throughput_toks_per_s{model_name="meta-llama/Llama-3.1-8B-Instruct"} 612.4
"""
    + _PROCESS
)

VLLM_DISABLE_LOG_STATS = _PROCESS + _HTTP
"""``vllm serve ... --disable-log-stats``: no ``vllm:`` series at all."""

TGI_V3 = """\
# HELP tgi_request_count Total number of requests
# TYPE tgi_request_count counter
tgi_request_count 982

# HELP tgi_request_success Number of successful requests
# TYPE tgi_request_success counter
tgi_request_success 941

# TYPE tgi_request_failure counter
tgi_request_failure{err="validation"} 3
tgi_request_failure{err="generation"} 1

# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 4

# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12

# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 61440

# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 122880

# TYPE tgi_batch_inference_success counter
tgi_batch_inference_success{method="decode"} 51210
tgi_batch_inference_success{method="prefill"} 950

# HELP tgi_request_duration Request duration
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.00015"} 0
tgi_request_duration_bucket{le="0.5"} 88
tgi_request_duration_bucket{le="2.5"} 803
tgi_request_duration_bucket{le="+Inf"} 941
tgi_request_duration_sum 1201.5
tgi_request_duration_count 941
"""

TGI_WITHOUT_CAPACITY = TGI_V3.replace(
    "# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens 122880\n", ""
)
"""A TGI whose router does not export its token budget (before 3.0)."""


def sglang(ranks: list[dict[str, Any]], *, model: str = "Qwen/Qwen2.5-7B-Instruct") -> str:
    """An SGLang body; one dict per scheduler: dp (None: no data parallelism), tp, running, queue, usage,
    capacity, retracted."""

    def labels(r: dict[str, Any]) -> str:
        dp = "" if r.get("dp") is None else f',dp_rank="{int(r["dp"])}"'
        return f'{{engine_type="unified"{dp},model_name="{model}",pp_rank="0",tp_rank="{int(r["tp"])}"}}'

    def gauge(name: str, help_text: str, key: str, fmt: str = "{:.1f}") -> str:
        rows = "".join(f"{name}{labels(r)} {fmt.format(r[key])}\n" for r in ranks)
        return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{rows}"

    used = [dict(r, used=round(r["usage"] * r["capacity"])) for r in ranks]
    ranks = used
    return (
        gauge("sglang:num_running_reqs", "The number of running requests.", "running")
        + gauge("sglang:num_used_tokens", "The number of used tokens.", "used")
        + gauge("sglang:token_usage", "The token usage.", "usage", "{}")
        + gauge("sglang:gen_throughput", "The generation throughput (token/s).", "running", "{:.2f}")
        + gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "queue")
        + gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", "usage", "{}")
        + gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "capacity")
        + "# HELP sglang:num_retracted_reqs The number of retracted requests.\n"
        + "# TYPE sglang:num_retracted_reqs gauge\n"
        + "".join(f"sglang:num_retracted_reqs{labels(r)} 0.0\n" for r in ranks)
        + "# HELP sglang:num_retracted_requests_total Total number of retracted requests.\n"
        + "# TYPE sglang:num_retracted_requests_total counter\n"
        + "".join(f"sglang:num_retracted_requests_total{labels(r)} {r['retracted']:.1f}\n" for r in ranks)
        + "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
        + "# TYPE sglang:prompt_tokens_total counter\n"
        + f'sglang:prompt_tokens_total{{model_name="{model}"}} 2.4021e+06\n'
        + "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
        + "# TYPE sglang:time_to_first_token_seconds histogram\n"
        + f'sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="{model}"}} 520.0\n'
        + f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="{model}"}} 733.0\n'
        + f'sglang:time_to_first_token_seconds_count{{model_name="{model}"}} 733.0\n'
        + f'sglang:time_to_first_token_seconds_sum{{model_name="{model}"}} 88.1\n'
    )


SGLANG_ONE_ENGINE = sglang(
    [{"dp": None, "tp": 0, "running": 21, "queue": 2, "usage": 0.58, "capacity": 471040, "retracted": 3}]
)
SGLANG_DP2_TP2 = sglang(
    [
        # --dp 2 --tp 2 --enable-metrics-for-all-schedulers: both TP ranks of an engine report its one state.
        {"dp": 0, "tp": 0, "running": 30, "queue": 6, "usage": 0.9, "capacity": 200000, "retracted": 4},
        {"dp": 0, "tp": 1, "running": 30, "queue": 6, "usage": 0.9, "capacity": 200000, "retracted": 4},
        {"dp": 1, "tp": 2, "running": 10, "queue": 0, "usage": 0.3, "capacity": 300000, "retracted": 0},
        {"dp": 1, "tp": 3, "running": 10, "queue": 0, "usage": 0.3, "capacity": 300000, "retracted": 0},
    ]
)
