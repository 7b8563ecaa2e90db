"""A throwaway Redis Cluster of three masters on loopback free ports (no replicas, no persistence).

Each node is a ``redis-server --cluster-enabled yes`` in its own temporary directory (its
``nodes.conf`` lives there); ``redis-cli --cluster create`` assigns the 16384 slots, and :meth:`start`
returns once every node reports ``cluster_state:ok``. :meth:`stop` kills the nodes and deletes the
directories. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.servers import redis_server_binary

__all__ = [
    "ClusterStartError",
    "RedisClusterNodes",
    "cluster_key_count",
    "cluster_keys",
    "fresh_cluster_client",
    "redis_cli_binary",
]

START_TIMEOUT_S = 30.0


class ClusterStartError(RuntimeError):
    """The cluster did not form in time (the message says which step failed)."""


def redis_cli_binary() -> str | None:
    return shutil.which("redis-cli")


def _command(port: int, *words: str) -> bytes:
    """Send one inline command to 127.0.0.1:``port`` and return the raw reply (good enough for INFO-like
    bulk replies of a few kB; only used while setting up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        sock.sendall((" ".join(words) + "\r\n").encode())
        chunks: list[bytes] = []
        sock.settimeout(0.3)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


BUS_PORT_OFFSET = 10_000
"""A cluster node also listens on its port + 10000 (the cluster bus), so its port must be at most 55535."""


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster-bus port (+10000) is free too."""
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + BUS_PORT_OFFSET > 65535:
            port -= BUS_PORT_OFFSET + 1024 * (port % 7 + 1)  # fold into the range below 55535
        if port < 1024 or port in taken or port + BUS_PORT_OFFSET in taken:
            continue
        if _bindable(port) and _bindable(port + BUS_PORT_OFFSET):
            return port
    raise ClusterStartError("no free port pair (port, port + 10000) found on 127.0.0.1")


class RedisClusterNodes:
    """Three cluster-enabled redis-server processes joined into one cluster of three masters."""

    def __init__(self, masters: int = 3) -> None:
        server, cli = redis_server_binary(), redis_cli_binary()
        if server is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed for the Redis Cluster tests")
        self.server_binary, self.cli_binary = server, cli
        taken: set[int] = set()
        self.ports: list[int] = []
        for _ in range(masters):
            port = free_cluster_port(taken)
            taken.update((port, port + BUS_PORT_OFFSET))
            self.ports.append(port)
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-cluster-"))
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.ports]

    def start(self) -> None:
        try:
            for port in self.ports:
                self._start_node(port)
            self._create()
            self._wait_ok()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, port: int) -> None:
        node_dir = self.dir / str(port)
        node_dir.mkdir()
        args = [
            self.server_binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "2000",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(node_dir),
            # A log file, not /dev/null: redis-server 7.0 in cluster mode was seen to exit at once with its
            # output sent to /dev/null here; the file also explains a failed start.
            "--logfile", str(node_dir / "redis.log"),
        ]  # fmt: skip
        self.processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if _command(port, "PING").startswith(b"+PONG"):
                    return
            except OSError:
                time.sleep(0.05)
        log = (node_dir / "redis.log").read_text(errors="replace")[-2000:] if (node_dir / "redis.log").exists() else ""
        raise ClusterStartError(f"cluster node on port {port} did not start:\n{log}")

    def _create(self) -> None:
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        result = subprocess.run(
            [self.cli_binary, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")[-2000:]
            raise ClusterStartError(f"redis-cli --cluster create failed ({result.returncode}):\n{output}")

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(b"cluster_state:ok" in _command(port, "CLUSTER", "INFO") for port in self.ports):
                return
            time.sleep(0.1)
        raise ClusterStartError(f"the cluster did not reach cluster_state:ok in {START_TIMEOUT_S:.0f}s")

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(timeout=10)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisClusterNodes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def fresh_cluster_client(cluster: RedisClusterNodes, **kwargs: Any) -> Any:
    """A cluster client with every master emptied and every script cache flushed (NOSCRIPT reloads run)."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    client = RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in cluster.startup_nodes], **kwargs)
    await client.initialize()
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    await client.script_flush()  # a cluster client sends SCRIPT FLUSH to every master
    return client


async def cluster_key_count(client: Any) -> int:
    """DBSIZE summed over the masters (a cluster client sends plain DBSIZE to one node only)."""
    from redis.asyncio.cluster import RedisCluster

    sizes = await client.dbsize(target_nodes=RedisCluster.PRIMARIES)
    return int(sum(sizes.values())) if isinstance(sizes, dict) else int(sizes)


async def cluster_keys(client: Any, pattern: str = "*") -> list[str]:
    """Every key matching ``pattern`` on every master."""
    return [key.decode() if isinstance(key, bytes) else str(key) async for key in client.scan_iter(match=pattern)]
