"""Local services the demo starts besides the proxies: a throwaway ``redis-server`` for ``--replicas 2``.

The mock deployments and the simulated inference server come from ``litellm_ratebalance.simulate``
(child processes that exit when their stdin closes, so they never outlive the demo).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from litellm_ratebalance.demo.proxy_process import free_port

__all__ = ["LocalRedis", "wait_until_redis_answers"]


def wait_until_redis_answers(port: int, process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Block until the ``redis-server`` ``process`` on 127.0.0.1:``port`` answers PING (a plain RESP
    exchange: no client library needed); RuntimeError when it exits first or stays silent for ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode} (port {port} taken?)")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer on port {port} within {timeout:.0f}s")


class LocalRedis:
    """``redis-server`` on 127.0.0.1 and a free port, no persistence, data in a temporary directory.

    ``with LocalRedis() as redis: redis.url`` -- stopped (and its directory removed) on exit.
    """

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed; `make demo REPLICAS=2` installs it (apt-get), or install it yourself"
            )
        self.binary = binary
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-demo-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.dir), "--maxmemory-policy", "noeviction"]
        # Own session: a Ctrl-C in the terminal reaches the demo, which stops Redis after the proxies.
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            wait_until_redis_answers(self.port, self.process, timeout)
        except RuntimeError:
            self.stop()
            raise

    def dbsize(self) -> int:
        """Number of keys (a plain RESP exchange: no client library needed)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
            sock.sendall(b"DBSIZE\r\n")
            reply = sock.recv(64)
        return int(reply[1:].split(b"\r\n", 1)[0])

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
