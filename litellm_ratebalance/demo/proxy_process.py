"""Start and stop a real ``litellm`` proxy process on loopback (demo, benchmarks, end-to-end tests)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

__all__ = ["ProxyProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _litellm_executable() -> str:
    candidate = Path(sys.executable).with_name("litellm")
    return str(candidate) if candidate.exists() else "litellm"


class ProxyProcess:
    """One proxy: ``config`` (a config.yaml as a dict) is written into ``workdir`` with any ``files``
    (e.g. a custom_auth module) beside it; the proxy runs in its own process group on 127.0.0.1."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        files: dict[str, str] | None = None,
        port: int | None = None,
        master_key: str | None = None,
        env: dict[str, str] | None = None,
        log_name: str = "proxy.log",
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.master_key = master_key or "sk-" + secrets.token_hex(16)
        config = dict(config)
        general = dict(config.get("general_settings") or {})
        general.setdefault("master_key", self.master_key)
        config["general_settings"] = general
        self.config = config
        self.files = files or {}
        self.env = env or {}
        self.log_path = workdir / log_name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        """Write the config (and ``files``) and start the process; does not wait for it (see
        :meth:`wait_ready` / :meth:`wait_ready_async`), so several proxies can start at once."""
        if self.process is not None:
            raise RuntimeError(f"the proxy on port {self.port} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        for name, text in self.files.items():
            (self.workdir / name).write_text(text)
        env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1", **self.env)
        env.setdefault("LITELLM_LOG", "ERROR")
        env.setdefault("NO_PROXY", "127.0.0.1,localhost")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [_litellm_executable(), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() takes its workers too, Ctrl-C does not reach it
            )

    def start(self, timeout: float = 90.0) -> None:
        self.launch()
        self._wait_ready(timeout)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until ``/health/liveliness`` answers 200; stop the proxy and raise RuntimeError otherwise."""
        self._wait_ready(timeout)

    async def wait_ready_async(self, timeout: float = 90.0) -> None:
        """:meth:`wait_ready` for an event loop (cancellable: the caller's cleanup then stops the proxy)."""
        import asyncio

        import httpx

        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    raise RuntimeError(f"the proxy exited with {code}; log:\n{self.log_tail()}")
                try:
                    if (await client.get(f"{self.base_url}/health/liveliness")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the proxy did not become ready in {timeout:.0f}s; log:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"the proxy exited with {code}; log:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health/liveliness", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the proxy did not become ready in {timeout:.0f}s; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def terminate(self) -> None:
        """Ask the proxy to exit (SIGTERM to its process group) without waiting; :meth:`stop` then waits.
        Lets several proxies shut down at once."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM to the proxy's process group, SIGKILL after 10 s; then SIGKILL whatever of the group is
        left (workers may outlive the leader for a moment). Safe to call twice."""
        process = self.process
        if process is None:
            return
        self.process = None
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    def __enter__(self) -> ProxyProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
