"""``litellm-ratebalance``: command-line tools for operators.

``check-config CONFIG``  validate our settings in a LiteLLM config.yaml, and the rate balancer's ``model_info``
keys in its ``model_list`` (exit 0, or 78 with key paths); it does not import LiteLLM
``status --config CONFIG [--redis-url URL [--cluster]] [--json] [--model GROUP]...``  what the shared store holds now
``dashboard``  print the Grafana dashboard of our metrics (JSON, packaged with the wheel) to import

``status`` exit codes: 0 shown; 1 the store could not be read (Redis unreachable, timeout, no sentinel
naming a master); 2 bad usage (e.g. an unknown ``--model``); 3 nothing to read (the config names no Redis:
the proxy then keeps its state in process, out of reach of this command); 78 invalid config. A Redis Cluster
is read through its startup nodes (``cache_params.redis_startup_nodes`` or ``REDIS_CLUSTER_NODES``, as
LiteLLM takes them), or ``--redis-url`` of one node with ``--cluster``; a Sentinel set through the master its
sentinels name now (``cache_params.sentinel_nodes`` and ``service_name``, or ``REDIS_SENTINEL_NODES``).

No command needs the network beyond the Redis it reads: ``status`` imports LiteLLM (its Router gives the
deployments their ids) with LiteLLM's bundled model cost map, unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set
otherwise in the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from litellm_ratebalance.errors import ConfigurationError, StoreError, redact

if TYPE_CHECKING:
    from litellm_ratebalance.settings import Settings

__all__ = ["main"]

EXIT_CONFIG = 78
EXIT_STORE = 1
EXIT_USAGE = 2
EXIT_NO_STORE = 3


def _load_config(path: Path) -> dict[str, Any]:
    import yaml

    config = yaml.safe_load(path.read_text("utf-8")) or {}
    if not isinstance(config, dict):
        raise ConfigurationError(f"{path}: the config file is not a mapping")
    return config


def load_config_settings(path: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``litellm_settings``-shaped mapping our settings are read from, taken from a config file (or from
    its already loaded contents, ``config``)."""
    if config is None:
        config = _load_config(path)
    litellm_settings = dict(config.get("litellm_settings") or {})
    general = config.get("general_settings") or {}
    if isinstance(general, dict) and general.get("token_rate_limit_type") is not None:
        litellm_settings["token_rate_limit_type"] = general["token_rate_limit_type"]
    return litellm_settings


def model_list_problems(config: dict[str, Any], settings: Settings | None = None) -> list[str]:
    """Per-deployment problems in a loaded config's ``model_list``, as the proxy's start-up check reports
    them: the rate balancer's ``model_info.slots`` / ``model_info.input_to_output_ratio`` when the config
    loads ``litellm_ratebalance.rate_balancer``, and ``model_info.backpressure`` blocks (with the
    ``backpressure.deployments`` overrides of ``settings``) when it loads ``litellm_ratebalance.backpressure``."""
    litellm_settings = config.get("litellm_settings")
    callbacks = litellm_settings.get("callbacks") if isinstance(litellm_settings, dict) else None
    model_list = config.get("model_list")
    if not isinstance(callbacks, list) or not isinstance(model_list, list):
        return []
    deployments = [d for d in model_list if isinstance(d, dict)]
    problems: list[str] = []
    if "litellm_ratebalance.rate_balancer" in callbacks:
        from litellm_ratebalance.routing.model_info import model_info_problems

        problems += model_info_problems(deployments, consequence=False)
    if "litellm_ratebalance.backpressure" in callbacks and settings is not None:
        problems += _backpressure_problems(deployments, settings)
    return problems


def _backpressure_problems(deployments: list[dict[str, Any]], settings: Settings) -> list[str]:
    backpressure = settings.ratebalance.backpressure
    problems: list[str] = []
    for index, deployment in enumerate(deployments):
        info = deployment.get("model_info")
        info = info if isinstance(info, dict) else {}
        # Without an id in the file the Router makes one up at start-up: name the entry by its position.
        deployment_id = str(info["id"]) if info.get("id") is not None else f"model_list[{index}]"
        problems += backpressure.deployment_problems(deployment_id, deployment.get("model_name") or "", info)
    return problems


def check_config(path: Path) -> int:
    from litellm_ratebalance.settings import parse_settings

    try:
        config = _load_config(path)
        settings = parse_settings(load_config_settings(path, config))
        problems = model_list_problems(config, settings)
    except (ConfigurationError, OSError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except Exception as exc:  # YAML syntax errors and the like
        print(f"{path}: cannot read the config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if problems:
        listed = "".join(f"\n  {problem}" for problem in problems)
        print(f"{path}: invalid model_info:{listed}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{path}: litellm_ratebalance settings are valid")
    from litellm_ratebalance.routing import core_build

    build = "compiled (mypyc)" if core_build() == "compiled" else "pure Python"
    print(f"routing core in this environment: {build}")
    return 0


def dashboard() -> int:
    """Write the packaged Grafana dashboard to stdout, as it is in the package."""
    from importlib import resources

    text = resources.files("litellm_ratebalance").joinpath("dashboards", "litellm-ratebalance.json").read_text("utf-8")
    sys.stdout.write(text)
    return 0


def _scrub(text: str, secret: str | None) -> str:
    """Never echo a password, even inside a driver's error message."""
    return text.replace(secret, "***") if secret else text


def _cluster_client(url: str, other_nodes: tuple[tuple[str, int], ...], timeout: float) -> Any:
    """redis-py's async ``RedisCluster`` from ``url`` (a startup node's, which carries the auth and TLS of all),
    with the ``other_nodes`` as startup nodes too, ``timeout`` seconds per connect and operation;
    ValueError or RedisClusterException on a URL redis-py cannot read or cannot use for a cluster."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    return RedisCluster.from_url(
        url,
        startup_nodes=[ClusterNode(host, port) for host, port in other_nodes],
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
    )


async def _status(args: argparse.Namespace) -> int:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisClusterException

    from litellm_ratebalance import status
    from litellm_ratebalance.store import KeySpace, RedisStore

    if args.cluster and not args.redis_url:
        print("--cluster reads the --redis-url given as a Redis Cluster node: give --redis-url", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = status.load_proxy_config(args.config)
        target = status.resolve_redis(config, args.redis_url, override_cluster=args.cluster)
    except ConfigurationError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if target.sentinel and target.url is None:
        try:
            target = await status.locate_sentinel_master(target, args.timeout)
        except StoreError as exc:
            print(f"cannot read the store ({target.source}): {redact(str(exc))}", file=sys.stderr)
            return EXIT_STORE
    url, source = target.url, target.source
    if url is None:
        print(
            f"{args.config}: nothing to show: {source}, so the proxy keeps its counters in its own process "
            "(the embedded store), which this command cannot read. Pass --redis-url, or configure a Redis.",
            file=sys.stderr,
        )
        return EXIT_NO_STORE
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    masked = target.masked()
    client: Any
    try:
        if target.cluster:
            client = _cluster_client(url, target.other_nodes, args.timeout)
        else:
            client = aioredis.Redis.from_url(url, socket_connect_timeout=args.timeout, socket_timeout=args.timeout)
    except (ValueError, RedisClusterException) as exc:  # (the latter: e.g. a unix:// URL with --cluster)
        print(f"invalid Redis URL {masked} ({source}): {_scrub(str(exc), password)}", file=sys.stderr)
        return EXIT_USAGE
    store = RedisStore(
        client,
        KeySpace(config.settings.ratebalance.key_prefix),
        owns_client=True,
        timeout_seconds=args.timeout,
        cooldown_seconds=0.0,
    )
    try:
        deployments = status.config_deployments(config)
        known = sorted({d.model_group for d in deployments})
        if args.model:
            unknown = [m for m in args.model if m not in known]
            if unknown:
                print(f"unknown model group(s) {unknown}; the config has {known}", file=sys.stderr)
                return EXIT_USAGE
        report = await asyncio.wait_for(
            status.collect(store, config, target=target, model_groups=args.model or None),
            timeout=args.timeout * 10,
        )
    except ConfigurationError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (StoreError, OSError, asyncio.TimeoutError) as exc:
        detail = _scrub(f"{exc}" or type(exc).__name__, password)
        cause = exc.__cause__
        if cause is not None:
            detail += _scrub(f" ({type(cause).__name__}: {cause})", password)
        if not target.cluster and "MovedError" in detail:
            # A plain client on a cluster node reaches only the keys of that node's slots.
            detail += "; the server is a Redis Cluster node: add --cluster"
        print(f"cannot read the store at {masked} ({source}): {detail}", file=sys.stderr)
        return EXIT_STORE
    finally:
        with contextlib.suppress(Exception):  # closing a connection that never opened
            await store.aclose()
    sys.stdout.write(status.dumps(report) if args.json else status.format_table(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command (``argv``: the arguments after the program name; default ``sys.argv[1:]``) and return
    its exit code (see the module docstring)."""
    # Importing litellm otherwise fetches its model cost map over the network (and retries without one):
    # nothing here reads costs, and an operator's shell or a locked-down host must not wait on GitHub.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    parser = argparse.ArgumentParser(prog="litellm-ratebalance", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate our settings in a LiteLLM config.yaml")
    check.add_argument("config", type=Path)
    show = commands.add_parser("status", help="show admission, routing, concurrency and contract state from Redis")
    show.add_argument("--config", type=Path, required=True, help="the proxy's config.yaml")
    show.add_argument("--redis-url", help="Redis to read (default: the one the config names, as the proxy finds it)")
    show.add_argument(
        "--cluster", action="store_true", help="--redis-url is one node of a Redis Cluster (the rest are discovered)"
    )
    show.add_argument("--json", action="store_true", help="JSON output (schema: litellm_ratebalance.status)")
    show.add_argument("--model", action="append", metavar="GROUP", help="only this model group (repeatable)")
    show.add_argument("--timeout", type=float, default=3.0, help="seconds per Redis operation (default 3)")
    commands.add_parser("dashboard", help="print the Grafana dashboard of our metrics (JSON) to import")
    args = parser.parse_args(argv)
    if args.command == "dashboard":
        return dashboard()
    if args.command == "check-config":
        return check_config(args.config)
    if args.command == "status":
        return asyncio.run(_status(args))
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
