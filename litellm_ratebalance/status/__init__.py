"""``litellm-ratebalance status``: what the shared store says right now, as a table or as JSON.

Pure (no I/O, no clock):

* :mod:`.report`: the report dataclasses, :func:`group_status` / :func:`contracts_status` (figures from
  store snapshots, settings and an explicit store time), :func:`mask_url`;
* :mod:`.render`: :func:`report_json`, :func:`dumps` and :func:`format_table`.

I/O:

* :mod:`.config`: :func:`load_proxy_config` (config.yaml), :func:`config_deployments` (deployment ids by
  LiteLLM's own rule: ``model_info.id``, else the hash ``litellm.Router`` derives from the params, so they
  match what the proxy records), :func:`group_capacity`;
* :mod:`.target`: :func:`resolve_redis` (where the proxy's Redis is), :func:`locate_sentinel_master` (the
  current master of a Sentinel set, asked of its sentinels);
* :mod:`.collect`: :func:`collect` (reads the store).

JSON output (``--json``), schema 1; keys are stable, new keys may be added::

    {"schema": 1,
     "generated_at_ms": <store clock (Redis TIME), ms>,
     "store": {"backend": "redis"|"redis-cluster", "url": <password masked; a cluster's further startup nodes
               appended as ,host:port>, "source": <where the URL came from>,
               "key_prefix": str},
     "model_groups": [{
         "model_group": str, "rpm": int|null, "tpm": int|null,     # summed deployment limits
         "window_seconds": int,
         "window": {"start_ms": int|null, "end_ms": int|null, "live": bool, "reset_seconds": int|null},
         "requests": int, "tokens": int,                           # live window (reservations included)
         "saturation": float, "saturation_threshold": float,
         "mode": "unlimited"|"lenient"|"strict",
         "priorities": [{"priority": str ("default" = shared pool), "requests": int, "tokens": int,
                         "weight": float, "reserved_requests": float|null, "reserved_tokens": float|null}],
         "deployments": [{"deployment_id": str, "estimated_rate": float (tokens/s, window mean),
                          "weight": float|null (routing choice probability), "samples": float,
                          "failures": float (both recency-weighted when routing weighs by age),
                          "routing_mode": str, "in_flight": int|null, "reserved_tokens": int|null,
                          "concurrency_limit": {"min": int, "initial": int, "max": int}|null,
                          "gpu_seconds_per_1k_output_tokens": float|null,
                          "signals": null (not behind backpressure) | {
                              "metrics_url": bool, "server": "vllm"|"tgi"|"sglang"|null,
                              "problems": [str] (codes: unreachable, unrecognised, server_mismatch,
                                         no_kv_usage, no_kv_capacity, no_queue, out_of_range),
                              "detail": str (one "<code>: <text>" line per problem),
                              "age_seconds": float|null (null: no replica reported lately)}}]}],
     "contracts": null | {
         "window_seconds": int, "window_start": int (s), "reset_seconds": int,
         "features": [{"feature": str, "requests": int, "rpm_limit": int|null, "tokens": int,
                       "tpm_limit": int|null, "rpm_mode": str, "tpm_mode": str}],
         "basket": {same keys, "feature": "__basket__"}},
     "replicas": [{"replica": str (host:pid), "reported_ms": int, "interval_seconds": float,
                   "store_calls": int, "store_call_max_seconds": float, "loop_lag_max_seconds": float,
                   "store_errors": {cause: int}}]}    # every 10 s, from each proxy replica using Redis

Contract modes are those the *next* request would get (one request, one token): ``normal``,
``borrowed`` (over its feature's contract) or ``degraded`` (the basket is full). Backpressure's adaptive
concurrency limit lives in each replica (gauge ``litellm_ratebalance_backpressure_concurrency_limit``);
the store holds the in-flight leases of all replicas, so status shows in flight and the configured range.
Each replica that scrapes a deployment's ``metrics_url`` writes what its signals are worth (the server
answering, every problem) to the store; status shows the last report, or none when no replica renewed it
for 90 s.
"""

from __future__ import annotations

from litellm_ratebalance.status.collect import collect
from litellm_ratebalance.status.config import (
    ProxyConfig,
    config_deployments,
    group_capacity,
    load_proxy_config,
)
from litellm_ratebalance.status.render import dumps, format_table, report_json
from litellm_ratebalance.status.report import (
    ConcurrencyRange,
    ContractLine,
    ContractsStatus,
    DeploymentStatus,
    GroupStatus,
    PoolStatus,
    SignalStatus,
    StatusReport,
    contracts_status,
    group_status,
    mask_url,
)
from litellm_ratebalance.status.target import RedisTarget, SentinelSet, locate_sentinel_master, resolve_redis

__all__ = [
    "ConcurrencyRange",
    "ContractLine",
    "ContractsStatus",
    "DeploymentStatus",
    "GroupStatus",
    "PoolStatus",
    "ProxyConfig",
    "RedisTarget",
    "SentinelSet",
    "SignalStatus",
    "StatusReport",
    "collect",
    "config_deployments",
    "contracts_status",
    "dumps",
    "format_table",
    "group_capacity",
    "group_status",
    "load_proxy_config",
    "locate_sentinel_master",
    "mask_url",
    "report_json",
    "resolve_redis",
]
