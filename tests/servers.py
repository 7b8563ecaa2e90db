"""Throwaway redis-server processes for the test session (loopback, free ports, no persistence)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from litellm_ratebalance.demo.services import wait_until_redis_answers

__all__ = ["EXACT_COUNT_TIMEOUT_SECONDS", "RedisServer", "free_port", "redis_server_binary"]

EXACT_COUNT_TIMEOUT_SECONDS = 10.0
"""Store timeout for tests of exact counts under concurrent bursts: they check behaviour, not latency, and on a
loaded 2-core CI machine a burst can wait longer than the default 0.5 s for a connection (and then fail open)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer:
    """One redis-server on 127.0.0.1; ``stop``/``start`` keep the port so clients can reconnect."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = ()) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (make test installs it with apt-get)")
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = extra_args
        self.dir = Path(tempfile.mkdtemp(prefix="ratebalance-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until_redis_answers(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
