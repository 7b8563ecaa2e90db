"""A throwaway Redis Sentinel set on loopback: one master, one replica, three sentinels (``redis-sentinel``).

Failure detection is fast (``down-after-milliseconds`` 1000, quorum 2, ``failover-timeout`` 5000), so a
killed master is replaced within a few seconds. :meth:`SentinelSet.start` returns once every sentinel knows
the replica and the two other sentinels (a failover needs a majority of them to elect a leader)::

    with SentinelSet() as redis_set:
        redis_set.sentinel_nodes      # [[host, port], ...] as LiteLLM's cache_params.sentinel_nodes take them
        redis_set.kill_master()       # SIGKILL; the replica is promoted
        redis_set.wait_for_new_master()
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from litellm_ratebalance.demo.services import wait_until_redis_answers
from tests.servers import RedisServer, free_port, skip_without_real_redis

__all__ = ["SERVICE", "SentinelSet"]

SERVICE = "ratebalance-faults"
"""The Sentinel service name (``cache_params.service_name``)."""
SENTINELS = 3
READY_TIMEOUT_S = 30.0


class SentinelSet:
    def __init__(self) -> None:
        skip_without_real_redis("redis-server", "redis-sentinel")
        self.master = RedisServer()
        self.replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(self.master.port)))
        self.sentinel_ports = [free_port() for _ in range(SENTINELS)]
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-sentinel-"))
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def sentinel_nodes(self) -> list[list[str | int]]:
        return [["127.0.0.1", port] for port in self.sentinel_ports]

    def sentinel(self, index: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_ports[index], socket_timeout=2)

    def master_port(self, index: int = 0) -> int:
        """The master's port as sentinel ``index`` reports it now."""
        with self.sentinel(index) as client:
            _host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(port)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> SentinelSet:
        try:
            self.master.start()
            self.replica.start()
            for port in self.sentinel_ports:
                self._start_sentinel(port)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, port: int) -> None:
        binary = shutil.which("redis-sentinel")
        assert binary is not None  # (checked in __init__)
        conf = self.dir / f"sentinel-{port}.conf"  # sentinels rewrite their config: one writable file each
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.dir}/sentinel-{port}.log\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        process = subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.sentinels.append(process)
        wait_until_redis_answers(port, process)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(self._knows_everyone(i) for i in range(SENTINELS)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the sentinels did not discover the replica and each other in {READY_TIMEOUT_S:.0f}s")

    def _knows_everyone(self, index: int) -> bool:
        with self.sentinel(index) as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
            others = client.execute_command("SENTINEL", "SENTINELS", SERVICE)
        return len(replicas) == 1 and len(others) == SENTINELS - 1

    def kill_master(self) -> int:
        """SIGKILL the current master; returns its port."""
        port = self.master_port()
        server = self.master if self.master.port == port else self.replica
        server.stop()
        return port

    def wait_for_new_master(self, old_port: int, timeout_s: float = 30.0) -> float:
        """Block until every sentinel reports a master other than ``old_port``; return the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            try:
                if all(self.master_port(i) != old_port for i in range(SENTINELS)):
                    return time.monotonic() - started
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"no new master within {timeout_s:.0f}s")

    def stop(self) -> None:
        for process in self.sentinels:
            process.kill()
        for process in self.sentinels:
            process.wait(timeout=10)
        self.sentinels.clear()
        for server in (self.master, self.replica):
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
