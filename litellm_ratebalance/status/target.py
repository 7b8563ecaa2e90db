"""Where the proxy's Redis is: a URL, a Redis Cluster's startup nodes, or a Sentinel set whose current
master is asked of its sentinels."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import quote

from litellm_ratebalance.errors import ConfigurationError, StoreError
from litellm_ratebalance.status.config import ProxyConfig, as_mapping
from litellm_ratebalance.status.report import mask_url

__all__ = ["RedisTarget", "SentinelSet", "locate_sentinel_master", "resolve_redis"]


def _resolve_env(value: object) -> object:
    """LiteLLM's ``os.environ/NAME`` indirection (from this process's environment)."""
    if isinstance(value, str) and value.startswith("os.environ/"):
        return os.environ.get(value.removeprefix("os.environ/"))
    return value


def _url_from_parts(
    host: object, port: object, password: object, username: object = None, ssl: object = None, db: object = None
) -> str | None:
    host, port, password, username = (_resolve_env(v) for v in (host, port, password, username))
    if not host:
        return None
    scheme = "rediss" if str(_resolve_env(ssl)).lower() in ("true", "1") else "redis"
    auth = ""
    if password:
        auth = f"{quote(str(username or ''), safe='')}:{quote(str(password), safe='')}@"
    path = f"/{db}" if db not in (None, "") else ""
    return f"{scheme}://{auth}{host}:{port or 6379}{path}"


@dataclass(frozen=True, slots=True)
class SentinelSet:
    """A Sentinel-managed Redis as LiteLLM's client reaches it: the sentinels to ask, the service name, and the
    credentials of the data nodes and of the sentinels (LiteLLM connects to the sentinels with the data
    nodes' connection settings, the password replaced by ``sentinel_password``)."""

    nodes: tuple[tuple[str, int], ...]
    service_name: str
    password: str | None = field(default=None, repr=False)
    username: str | None = None
    ssl: bool = False
    db: int | None = None
    sentinel_password: str | None = field(default=None, repr=False)


class RedisTarget(NamedTuple):
    """Where the proxy's Redis is, as :func:`resolve_redis` finds it."""

    url: str | None
    """A plain Redis: its URL. A Redis Cluster: the URL of one startup node, which carries the auth and TLS of
    every node. A Sentinel set: the current master's, once :func:`locate_sentinel_master` asked (None before).
    None otherwise: nothing this command can read (``source`` says why)."""
    source: str
    """Where it came from (a config key or variable), or why there is nothing to read."""
    cluster: bool = False
    """``url`` is a node of a Redis Cluster."""
    other_nodes: tuple[tuple[str, int], ...] = ()
    """A Redis Cluster's further startup nodes (host, port), besides ``url``'s."""
    sentinel: bool = False
    """The proxy's Redis is a Sentinel set (``sentinel_set``): its master is found by asking the sentinels."""
    sentinel_set: SentinelSet | None = None

    def masked(self) -> str:
        """``url`` with its password masked (:func:`mask_url`), a cluster's other startup nodes appended as
        ``,host:port``; empty without a URL."""
        if self.url is None:
            return ""
        return ",".join([mask_url(self.url), *(f"{host}:{port}" for host, port in self.other_nodes)])


def _cluster_nodes(value: object, where: str) -> tuple[tuple[str, int], ...]:
    """Startup nodes as LiteLLM takes them (``[{"host": ..., "port": ...}, ...]``, or that list as JSON text,
    as in ``REDIS_CLUSTER_NODES``); ConfigurationError naming ``where`` when they are not that."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not valid JSON ({exc})") from None
    expected = 'a list of {"host": str, "port": 1..65535} mappings'
    if not isinstance(value, list):
        raise ConfigurationError(f"{where}: must be {expected} (got {type(value).__name__})")
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(value):
        host = item.get("host") if isinstance(item, dict) else None
        port = item.get("port", 6379) if isinstance(item, dict) else None
        try:
            number = int(port) if isinstance(port, (int, str)) and not isinstance(port, bool) else None
        except ValueError:
            number = None
        if not isinstance(host, str) or not host or number is None or not 1 <= number <= 65535:
            raise ConfigurationError(f'{where}[{i}]: must be {{"host": str, "port": 1..65535}} (got {item!r})')
        nodes.append((host, number))
    return tuple(nodes)


def _cluster_target(
    nodes: tuple[tuple[str, int], ...], source: str, password: object, username: object, ssl: object
) -> RedisTarget:
    host, port = nodes[0]
    url = _url_from_parts(host, port, password, username, ssl)
    assert url is not None  # (a node always has a host)
    return RedisTarget(url, source, cluster=True, other_nodes=nodes[1:])


def _sentinel_nodes(value: object, where: str) -> tuple[tuple[str, int], ...]:
    """Sentinel nodes as LiteLLM takes them (``[[host, port], ...]``, or that list as JSON text, as in
    ``REDIS_SENTINEL_NODES``); ConfigurationError naming ``where`` when they are not that."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigurationError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(value, list) or not value:
        raise ConfigurationError(f"{where}: must be a non-empty list of [host, port 1..65535] pairs (got {value!r})")
    nodes: list[tuple[str, int]] = []
    for i, item in enumerate(value):
        pair = list(item) if isinstance(item, (list, tuple)) else []
        host, port = (pair[0], pair[1]) if len(pair) == 2 else (None, None)
        try:
            number = int(port) if isinstance(port, (int, str)) and not isinstance(port, bool) else None
        except ValueError:
            number = None
        if not isinstance(host, str) or not host or number is None or not 1 <= number <= 65535:
            raise ConfigurationError(f"{where}[{i}]: must be a [host, port 1..65535] pair (got {item!r})")
        nodes.append((host, number))
    return tuple(nodes)


def _truthy(value: object) -> bool:
    return str(_resolve_env(value)).lower() in ("true", "1")


def _sentinel_target(params: Mapping[str, Any], password: object, username: object, ssl: object) -> RedisTarget:
    env = os.environ.get
    if params.get("sentinel_nodes"):
        where = "litellm_settings.cache_params.sentinel_nodes"
        nodes = _sentinel_nodes(_resolve_env(params["sentinel_nodes"]), where)
    else:
        where = "REDIS_SENTINEL_NODES"
        nodes = _sentinel_nodes(env(where), where)
    service = _resolve_env(params.get("service_name")) or env("REDIS_SERVICE_NAME")
    if not isinstance(service, str) or not service:
        # (LiteLLM builds its Sentinel client only with both; without a service name it is not a Sentinel client)
        raise ConfigurationError(
            f"litellm_settings.cache_params.service_name: required with {where} (or REDIS_SERVICE_NAME): the "
            "Sentinel service whose master the proxy uses"
        )
    db = _resolve_env(params.get("db"))
    spec = SentinelSet(
        nodes=nodes,
        service_name=service,
        password=str(_resolve_env(password)) if password else None,
        username=str(_resolve_env(username)) if username else None,
        ssl=_truthy(ssl),
        db=int(db) if isinstance(db, (int, str)) and str(db).isdigit() else None,
        sentinel_password=str(_resolve_env(params.get("sentinel_password")) or env("REDIS_SENTINEL_PASSWORD") or "")
        or None,
    )
    return RedisTarget(None, f"{where}, service {service!r}", sentinel=True, sentinel_set=spec)


async def locate_sentinel_master(target: RedisTarget, timeout: float) -> RedisTarget:
    """``target`` (a Sentinel set from :func:`resolve_redis`) with ``url`` set to its current master, as the
    sentinels name it (the first that answers and reports a healthy master, as redis-py's Sentinel client
    picks). StoreError when none does within ``timeout`` per sentinel."""
    from redis.asyncio.sentinel import Sentinel
    from redis.exceptions import RedisError

    spec = target.sentinel_set
    if spec is None:
        raise ValueError("not a Sentinel target")
    sentinel_kwargs: dict[str, Any] = {
        "password": spec.sentinel_password,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    if spec.username:
        sentinel_kwargs["username"] = spec.username
    if spec.ssl:
        sentinel_kwargs["ssl"] = True
    sentinel = Sentinel(list(spec.nodes), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    nodes = ", ".join(f"{host}:{port}" for host, port in spec.nodes)
    try:
        host, port = await asyncio.wait_for(
            sentinel.discover_master(spec.service_name), timeout * (len(spec.nodes) + 1)
        )
    except (RedisError, OSError, asyncio.TimeoutError) as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise StoreError(f"no sentinel ({nodes}) named a master for service {spec.service_name!r}: {detail}") from exc
    finally:
        for client in sentinel.sentinels:
            with contextlib.suppress(Exception):  # (closing a connection that never opened)
                await client.aclose()
    url = _url_from_parts(host, port, spec.password, spec.username, "true" if spec.ssl else None, spec.db)
    assert url is not None  # (a master always has a host)
    return target._replace(url=url, source=f"{target.source}: master {host}:{port} per the sentinels")


def resolve_redis(config: ProxyConfig, override: str | None = None, *, override_cluster: bool = False) -> RedisTarget:
    """Where the proxy's Redis is (:class:`RedisTarget`), in the proxy's order; a target without a URL (and
    the reason) when the proxy would run on the embedded store; for a Sentinel set, a target whose master
    :func:`locate_sentinel_master` finds (this function does no I/O).

    Order: ``--redis-url`` (one node of a Redis Cluster with ``override_cluster``); ``ratebalance.redis_url``;
    the proxy's cache (``litellm_settings.cache`` with ``cache_params`` of type redis: its startup nodes, or
    ``REDIS_CLUSTER_NODES``, make it a Redis Cluster, as in LiteLLM; else its Sentinel nodes, or
    ``REDIS_SENTINEL_NODES``, with ``service_name`` (or ``REDIS_SERVICE_NAME``); else its URL or host,
    LiteLLM's ``REDIS_*`` variables when it names no host); the router's (``router_settings.redis_url`` /
    ``redis_host``, a Redis Cluster when ``REDIS_CLUSTER_NODES`` is set). ConfigurationError on startup or
    sentinel nodes that are not a list of host and port, and on sentinel nodes without a service name.
    """
    if override:
        return RedisTarget(override, "--redis-url", cluster=override_cluster)
    if config.settings.ratebalance.redis_url:
        return RedisTarget(config.settings.ratebalance.redis_url, "ratebalance.redis_url")
    env_nodes = os.environ.get("REDIS_CLUSTER_NODES")
    params = as_mapping(config.litellm_settings.get("cache_params"), "litellm_settings.cache_params")
    if config.litellm_settings.get("cache") and params.get("type") == "redis":
        env = os.environ.get
        password = params.get("password") or env("REDIS_PASSWORD")
        username = params.get("username") or env("REDIS_USERNAME")
        ssl = params.get("ssl") if params.get("ssl") is not None else env("REDIS_SSL")
        startup = _resolve_env(params.get("redis_startup_nodes") or params.get("startup_nodes"))
        if startup:
            where = "litellm_settings.cache_params.redis_startup_nodes"
            return _cluster_target(_cluster_nodes(startup, where), where, password, username, ssl)
        if env_nodes:
            return _cluster_target(
                _cluster_nodes(env_nodes, "REDIS_CLUSTER_NODES"), "REDIS_CLUSTER_NODES", password, username, ssl
            )
        if params.get("sentinel_nodes") or env("REDIS_SENTINEL_NODES"):
            return _sentinel_target(params, password, username, ssl)
        url = _resolve_env(params.get("url") or params.get("redis_url"))
        if isinstance(url, str) and url:
            return RedisTarget(url, "litellm_settings.cache_params")
        url = _url_from_parts(
            params.get("host"), params.get("port"), params.get("password"), params.get("username"), params.get("ssl")
        )
        if url:
            return RedisTarget(url, "litellm_settings.cache_params")
        if os.environ.get("REDIS_URL"):
            return RedisTarget(os.environ["REDIS_URL"], "REDIS_URL")
        url = _url_from_parts(
            env("REDIS_HOST"), env("REDIS_PORT"), env("REDIS_PASSWORD"), env("REDIS_USERNAME"), env("REDIS_SSL")
        )
        if url:
            return RedisTarget(url, "REDIS_HOST/REDIS_PORT")
    router = config.router_settings
    url = _resolve_env(router.get("redis_url"))
    source = "router_settings.redis_url"
    if not (isinstance(url, str) and url):
        url = _url_from_parts(router.get("redis_host"), router.get("redis_port"), router.get("redis_password"))
        source = "router_settings.redis_host"
    if isinstance(url, str) and url:
        if env_nodes:
            # LiteLLM's Router makes its Redis a cluster of these nodes (with the router's password).
            nodes = _cluster_nodes(env_nodes, "REDIS_CLUSTER_NODES")
            return _cluster_target(nodes, "REDIS_CLUSTER_NODES", router.get("redis_password"), None, None)
        return RedisTarget(url, source)
    return RedisTarget(
        None, "the config names no Redis (no ratebalance.redis_url, cache_params or router_settings.redis_*)"
    )
