"""Start the real ``litellm`` proxy process from a config dict, for end-to-end tests over HTTP.

Typical use (see tests/e2e/conftest.py for the fixtures)::

    config = {
        "model_list": [mock_deployment("m", rpm=10)],
        "litellm_settings": {"callbacks": ["litellm_ratebalance.rate_limiter"]},
    }
    with LiteLLMProxy(config, redis_url=redis_server.url) as proxy:
        response = httpx.post(proxy.url("/v1/chat/completions"), headers=proxy.auth("sk-prod-1"),
                              json=chat_body("m"))

What the harness does for every proxy:

* writes ``config.yaml`` into a fresh temporary directory (the proxy's cwd), with a random master key,
  ``general_settings.custom_auth: auth_module.user_api_key_auth`` (unless the config names its own) and,
  when ``redis_url`` is given, ``litellm_settings.ratebalance.redis_url``;
* copies ``tests/e2e/auth_module.py`` next to it (LiteLLM loads ``custom_auth`` modules from the config
  file's directory first); test bearer tokens are in ``auth_module.DEFAULT_KEYS``, more via ``keys=``;
* runs ``.venv/bin/litellm --config config.yaml --host 127.0.0.1 --port <free port>`` in its own process
  group, with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and ``PYTHONPATH`` = the repository root (so the
  proxy imports this working tree's ``litellm_ratebalance``, whatever the venv's install says);
* waits for ``GET /health/liveliness`` to answer 200, and on :meth:`stop` kills the whole process group.

Starting a proxy takes seconds: start several at once with :func:`start_all`, and share them across a
module's tests (module-scoped fixtures).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from litellm_ratebalance.simulate.inference_server import ServerSpec
from tests.servers import free_port

__all__ = [
    "REPO_ROOT",
    "LiteLLMProxy",
    "ProxyStartError",
    "chat_body",
    "litellm_binary",
    "mock_deployment",
    "start_all",
    "stop_all",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
AUTH_MODULE = Path(__file__).with_name("auth_module.py")
UNREACHABLE_API_BASE = "http://127.0.0.1:9/v1"
"""Loopback discard port: nothing listens there, so an unmocked call is refused locally."""
START_TIMEOUT_S = 90.0
"""Generous: on 2 busy cores an import of litellm[proxy] alone can take several seconds."""


class ProxyStartError(RuntimeError):
    """The proxy exited or did not become live in time; the message ends with its log tail."""


def litellm_binary() -> Path | None:
    """The venv's ``litellm`` entry point (next to the running interpreter), or ``None``."""
    candidate = Path(sys.executable).with_name("litellm")
    if candidate.exists():
        return candidate
    found = shutil.which("litellm")
    return Path(found) if found else None


def mock_deployment(
    model_name: str,
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    mock_response: str | list[float] | None = "Hello world!",
    mock_delay: float | None = None,
    max_parallel_requests: int = 10_000,
    model: str = "openai/fake",
    model_id: str | None = None,
    **litellm_params: Any,
) -> dict[str, Any]:
    """A ``model_list`` entry served by LiteLLM's ``mock_response`` (no upstream at all).

    ``max_parallel_requests`` is set high by default: LiteLLM otherwise derives a small one from
    ``rpm``/``tpm`` and refuses bursts itself before any callback sees them.
    ``mock_delay`` (seconds) keeps requests in flight. For an embedding deployment pass
    ``model="openai/text-embedding-3-small", mock_response=[0.1, 0.2]`` (LiteLLM's mock embedding reports
    10 prompt tokens). ``mock_response="litellm.InternalServerError"`` makes every call fail.
    ``api_base`` defaults to a closed loopback port, so a request that is not mocked fails at once instead
    of leaving the machine; pass ``api_base`` to point at a local fake upstream.
    """
    params: dict[str, Any] = {
        "model": model,
        "api_key": "sk-fake-upstream",
        "api_base": UNREACHABLE_API_BASE,
        "max_parallel_requests": max_parallel_requests,
        **litellm_params,
    }
    if mock_response is not None:
        params["mock_response"] = mock_response
    if rpm is not None:
        params["rpm"] = rpm
    if tpm is not None:
        params["tpm"] = tpm
    if mock_delay is not None:
        params["mock_delay"] = mock_delay
    entry: dict[str, Any] = {"model_name": model_name, "litellm_params": params}
    if model_id is not None:
        entry["model_info"] = {"id": model_id}
    return entry


def chat_body(
    model: str, content: str = "hi", *, max_tokens: int | None = 20, stream: bool = False, **extra: Any
) -> dict[str, Any]:
    """A ``/v1/chat/completions`` JSON body."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stream:
        body["stream"] = True
    return body


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


class LiteLLMProxy:
    """One real ``litellm`` proxy process.

    ``config``: the config.yaml content as a dict (``model_list``, ``litellm_settings``,
    ``general_settings``, ``router_settings``); it is copied, never modified.
    ``redis_url``: put into ``litellm_settings.ratebalance.redis_url`` (our store's Redis).
    ``keys``: extra bearer tokens for ``auth_module`` (``{token: {"metadata", "team_metadata", "team_id",
    "user_id"}}``). ``env``: extra environment variables for the proxy. ``name``: shown in errors.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        redis_url: str | None = None,
        keys: Mapping[str, Mapping[str, Any]] | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "proxy",
    ) -> None:
        self.name = name
        self.master_key = "sk-e2e-" + secrets.token_urlsafe(24)
        self.port = free_port()
        self.host = "127.0.0.1"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"ratebalance-e2e-{name}-"))
        self.log_path = self.workdir / "proxy.log"
        self.config = self._full_config(config, redis_url)
        self._keys = {token: dict(spec) for token, spec in (keys or {}).items()}
        self._env = dict(env or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    # -- configuration ------------------------------------------------------------------------------------
    def _full_config(self, config: Mapping[str, Any], redis_url: str | None) -> dict[str, Any]:
        full = _merge({}, config)
        general = full.setdefault("general_settings", {})
        general["master_key"] = self.master_key
        general.setdefault("custom_auth", "auth_module.user_api_key_auth")
        if redis_url is not None:
            _merge(full.setdefault("litellm_settings", {}), {"ratebalance": {"redis_url": redis_url}})
        return full

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        """Request headers authenticating as ``token`` (a key of ``auth_module``)."""
        return {"Authorization": f"Bearer {token}"}

    @property
    def admin_headers(self) -> dict[str, str]:
        return self.auth(self.master_key)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` on this proxy (no connection cap: bursts go out at once).

        Idle connections are dropped after 2 s: uvicorn closes them after 5 s, and reusing one it is just
        closing fails with ``httpx.ReadError`` (seen between back-to-back bursts).
        """
        kwargs.setdefault("timeout", httpx.Timeout(60.0))
        kwargs.setdefault(
            "limits", httpx.Limits(max_connections=None, max_keepalive_connections=200, keepalive_expiry=2.0)
        )
        return httpx.AsyncClient(base_url=self.base_url, **kwargs)

    # -- process ---------------------------------------------------------------------------------------------
    def launch(self) -> None:
        """Write the files and start the process; does not wait (see :meth:`wait_ready`)."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} is already running")
        binary = litellm_binary()
        if binary is None:
            raise ProxyStartError("the litellm executable was not found next to the Python interpreter")
        (self.workdir / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        shutil.copyfile(AUTH_MODULE, self.workdir / "auth_module.py")
        env = dict(os.environ)
        env.update(
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
            RATEBALANCE_E2E_MASTER_KEY=self.master_key,
            RATEBALANCE_E2E_KEYS=json.dumps(self._keys),
            NO_PROXY="127.0.0.1,localhost",
        )
        env.update(self._env)
        self._log_file = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [str(binary), "--config", "config.yaml", "--host", self.host, "--port", str(self.port)],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() kills workers too
        )

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Poll ``/health/liveliness`` until it answers 200; raise :class:`ProxyStartError` otherwise."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    raise ProxyStartError(f"{self.name} exited during start-up:\n{self.log_tail()}")
                try:
                    if client.get(self.url("/health/liveliness")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise ProxyStartError(f"{self.name} was not live after {timeout:.0f}s:\n{self.log_tail()}")

    def start(self, timeout: float = START_TIMEOUT_S) -> LiteLLMProxy:
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the process group (SIGTERM, then SIGKILL after 10 s); keeps the log for reading."""
        process, self._process = self._process, None
        if process is not None:
            for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # Workers may outlive the leader for a moment; make sure the group is gone.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        """Stop and delete the working directory (the log goes with it)."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def start_all(proxies: Iterable[LiteLLMProxy], timeout: float = START_TIMEOUT_S) -> list[LiteLLMProxy]:
    """Start several proxies at once (their start-ups overlap); on any failure stop them all."""
    started = list(proxies)
    try:
        for proxy in started:
            proxy.launch()
        for proxy in started:
            proxy.wait_ready(timeout)
    except BaseException:
        stop_all(started)
        raise
    return started


def stop_all(proxies: Iterable[LiteLLMProxy]) -> None:
    for proxy in proxies:
        proxy.cleanup()


@contextlib.contextmanager
def inference_server_process(spec: ServerSpec) -> Iterator[str]:
    """The simulated inference server (:mod:`litellm_ratebalance.simulate.inference_server`) in a child process,
    serving ``spec``; yields its base URL and stops it on exit (sync, so module-scoped
    fixtures can hold it while a proxy runs)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "litellm_ratebalance.simulate.inference_server", "--spec", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(spec.to_dict()).encode() + b"\n")
    process.stdin.flush()
    try:
        yield str(json.loads(process.stdout.readline())["url"])
    finally:
        process.stdin.close()
        process.wait(timeout=10)
        process.stdout.close()
