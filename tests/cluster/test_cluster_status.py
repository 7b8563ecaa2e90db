"""``litellm-ratebalance status`` on the local Redis Cluster: found through LiteLLM's cluster settings (the
config's startup nodes, or ``--redis-url`` of one node with ``--cluster``), and a clear hint when a plain
client is pointed at a cluster node.

Synchronous tests: the CLI runs its own event loop, as it does for an operator.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from litellm_ratebalance.cli import main
from litellm_ratebalance.routing.balancer import RateBalancer
from litellm_ratebalance.settings import parse_settings
from litellm_ratebalance.store import KeySpace, RedisStore
from tests.cluster.cluster import RedisClusterNodes, fresh_cluster_client

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

PREFIX = "rbstatuscluster"
MODEL_LIST: list[dict[str, Any]] = [
    {
        "model_name": "chat",
        "litellm_params": {"model": "openai/a", "api_key": "sk-x", "rpm": 6},
        "model_info": {"id": "a"},
    },
    {
        "model_name": "chat",
        "litellm_params": {"model": "openai/b", "api_key": "sk-x", "rpm": 4},
        "model_info": {"id": "b"},
    },
]


async def _record_samples(cluster: RedisClusterNodes) -> None:
    """Routing statistics written to the cluster as a proxy replica writes them: a at 100, b at 50 tok/s."""
    client = await fresh_cluster_client(cluster)
    settings = parse_settings({"ratebalance": {"key_prefix": PREFIX}})
    balancer = RateBalancer(RedisStore(client, KeySpace(PREFIX), timeout_seconds=5.0), settings.ratebalance.routing)
    for _ in range(3):
        balancer.record("chat", "a", latency=1.0, output_tokens=100)
        balancer.record("chat", "b", latency=2.0, output_tokens=100)
    await balancer.aclose()  # flushes the write-behind samples
    await client.aclose()


def _config(tmp_path: Path, startup_nodes: list[dict[str, Any]] | None) -> Path:
    litellm_settings: dict[str, Any] = {"ratebalance": {"key_prefix": PREFIX}}
    if startup_nodes is not None:
        litellm_settings |= {"cache": True, "cache_params": {"type": "redis", "redis_startup_nodes": startup_nodes}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model_list": MODEL_LIST, "litellm_settings": litellm_settings}, sort_keys=False))
    return path


def _rates(doc: dict[str, Any]) -> dict[str, float]:
    (group,) = doc["model_groups"]
    return {d["deployment_id"]: d["estimated_rate"] for d in group["deployments"]}


def test_status_reads_the_cluster_that_cache_params_name(
    redis_cluster: RedisClusterNodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_record_samples(redis_cluster))
    # The port as text in one node, as LiteLLM's docs write it; the first node left out, so that
    # discovery (not the startup list) has to find the slots it holds.
    (_, second), (_, third) = redis_cluster.startup_nodes[1:]
    nodes: list[dict[str, Any]] = [{"host": "127.0.0.1", "port": str(second)}, {"host": "127.0.0.1", "port": third}]
    config = _config(tmp_path, nodes)
    capsys.readouterr()

    assert main(["status", "--config", str(config), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["store"] == {
        "backend": "redis-cluster",
        "url": f"redis://127.0.0.1:{second},127.0.0.1:{third}",
        "source": "litellm_settings.cache_params.redis_startup_nodes",
        "key_prefix": PREFIX,
    }
    assert _rates(doc) == {"a": 100.0, "b": 50.0}

    assert main(["status", "--config", str(config)]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"store: redis-cluster redis://127.0.0.1:{second},127.0.0.1:{third} ")


def test_one_node_with_cluster_flag_and_without(
    redis_cluster: RedisClusterNodes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_record_samples(redis_cluster))
    config = _config(tmp_path, None)
    host, port = redis_cluster.startup_nodes[0]
    url = f"redis://{host}:{port}"
    capsys.readouterr()

    assert main(["status", "--config", str(config), "--redis-url", url, "--cluster", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["store"]["backend"], doc["store"]["url"], doc["store"]["source"]) == (
        "redis-cluster",
        url,
        "--redis-url",
    )
    assert _rates(doc) == {"a": 100.0, "b": 50.0}

    # Without --cluster a plain client reaches only that node's slots; the model group's hash tag is on
    # another node for at least one of the three (the group name decides), so try each node.
    hinted = []
    for host, port in redis_cluster.startup_nodes:
        code = main(["status", "--config", str(config), "--redis-url", f"redis://{host}:{port}", "--timeout", "2"])
        captured = capsys.readouterr()
        if code != 0:
            assert code == 1 and "MovedError" in captured.err
            hinted.append(captured.err.rstrip().endswith("the server is a Redis Cluster node: add --cluster"))
    assert hinted and all(hinted)
