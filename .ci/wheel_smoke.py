"""Wheel smoke test: the package as a user gets it, not as the checkout runs it.

1. Build the sdist, and the wheel from that sdist (``python -m build``), so a file missing from either fails.
   The build runs in a copy of the checkout's files (``git ls-files``), so nothing an earlier build left
   behind can stand in for a file the configuration misses.
2. Compare the archives with the source: every file of the package in the checkout (the Lua scripts,
   ``py.typed``, the Grafana dashboard included) must be in the wheel and in the sdist.
3. Install the wheel into a fresh virtual environment that has nothing else but the pinned
   ``litellm[proxy]`` (the constraints file), and check that Python imports the package from there and
   finds its data files through ``importlib.resources``, as the store does.
4. Start ``litellm --config`` from that environment on 127.0.0.1 with a random master key, on
   ``example_config.yaml`` with every deployment answered by LiteLLM's ``mock_response`` (no upstream) and
   the embedded store (no Redis): send a request to each model group, read our series
   (``litellm_ratebalance_*``) on ``/metrics`` for each of the four callbacks, and run
   ``litellm-ratebalance check-config`` on the same file and ``litellm-ratebalance dashboard`` (without
   ``LITELLM_LOCAL_MODEL_COST_MAP``).

Run by ``make wheel-smoke`` (CI: ``.ci/run``) with the dev environment's Python (it needs ``build``, ``httpx``
and ``pyyaml``); it exits 0 when every check passed, else 1 with what failed. Nothing leaves the machine but
pip's downloads from the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "litellm_ratebalance"
REQUIRED = ("py.typed", "dashboards/litellm-ratebalance.json")
"""Data files the installed package reads or ships, besides every ``store/lua/*.lua`` (named as a reminder:
the comparison with the checkout covers them too)."""
CALLBACK_COMPONENTS = ("rate_limiter", "routing", "traffic_contracts", "backpressure")
"""``component`` label values of ``litellm_ratebalance_hook_latency_seconds``: one per callback of the config."""
START_TIMEOUT_S = 180.0
"""Generous: the first start of a fresh environment compiles every module it imports."""


class SmokeFailure(Exception):
    """A check failed; the message says which and shows what was seen."""


def log(message: str) -> None:
    print(f"wheel-smoke: {message}", flush=True)


def run(command: Sequence[str | Path], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run ``command``; its stdout, or SmokeFailure with its output when it exits non-zero."""
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if done.returncode != 0:
        raise SmokeFailure(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


# -- 1, 2: build and compare with the checkout -----------------------------------------------------------------
_NOT_SOURCE = ("__pycache__", "build", "dist", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis")


def source_files() -> list[str]:
    """The checkout's files, relative to the repository root, as they are in the working tree: the tracked
    ones in a git checkout (untracked scratch files are nobody's release); elsewhere (an unpacked tarball)
    every file but build outputs, caches, virtual environments, bytecode and compiled extensions."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
        files = [name for name in listed.split("\0") if name and (ROOT / name).is_file()]  # (deleted, not committed)
        if files:
            return sorted(files)
    except (OSError, subprocess.CalledProcessError):
        pass
    return sorted(
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if (parts := path.relative_to(ROOT).parts)
        and path.is_file()
        and not any(part in _NOT_SOURCE or part.startswith(".venv") or part.endswith(".egg-info") for part in parts)
        and path.suffix not in (".pyc", ".so", ".pyd")
    )


def build(files: Sequence[str], tree: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist of ``files`` (copied into ``tree`` first) and the wheel built from that sdist.

    A copy, because setuptools reuses what an earlier build left in the checkout (``*.egg-info/SOURCES.txt``
    lists every file an earlier sdist had), which would hide a file the current configuration leaves out.
    ``--no-isolation``: built with the environment's pinned setuptools, checked against ``[build-system]
    requires``, so the result does not depend on the newest setuptools release."""
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, tree], cwd=tree)
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise SmokeFailure(f"expected one sdist and one wheel in {dist}, found {[p.name for p in dist.iterdir()]}")
    return sdists[0], wheels[0]


def check_archives(sdist: Path, wheel: Path, expected: Iterable[str]) -> None:
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    with tarfile.open(sdist) as archive:
        # sdist members are "<name>-<version>/<path>"
        in_sdist = {member.name.split("/", 1)[1] for member in archive.getmembers() if "/" in member.name}
    expected = sorted(set(expected))
    lua = [name for name in expected if re.fullmatch(rf"{PACKAGE}/store/lua/[^/]+\.lua", name)]
    if not lua:
        raise SmokeFailure(f"no {PACKAGE}/store/lua/*.lua in the checkout: is this the repository root?")
    missing_required = [f"{PACKAGE}/{name}" for name in REQUIRED if f"{PACKAGE}/{name}" not in expected]
    if missing_required:
        raise SmokeFailure(f"the checkout lacks {missing_required}: update REQUIRED in {Path(__file__).name}")
    problems = []
    for label, members in (("wheel", in_wheel), ("sdist", in_sdist)):
        missing = [name for name in expected if name not in members]
        if missing:
            problems.append(f"the {label} lacks {len(missing)} file(s) of the package: {missing}")
    for name in ("pyproject.toml", "setup.py", "README.md", "example_config.yaml"):
        if name not in in_sdist:
            problems.append(f"the sdist lacks {name}")
    if problems:
        raise SmokeFailure("\n".join(problems))
    log(f"{wheel.name} and {sdist.name} hold all {len(expected)} files of the package ({len(lua)} Lua scripts)")


# -- 3: a fresh environment with only litellm[proxy] and the wheel ---------------------------------------------
def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment for the fresh venv's programs: its bin first on PATH, nothing pointing at the checkout
    or at another environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env.update(extra)
    return env


def install(venv: Path, wheel: Path, constraints: Path, litellm: str) -> None:
    run([sys.executable, "-m", "venv", venv])
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    run([*pip, "-c", constraints, f"litellm[proxy]=={litellm}", wheel], env=clean_env(venv))
    log(f"installed {wheel.name} with litellm[proxy]=={litellm} into a fresh environment")


_CHECK_INSTALLED = """
import json, sys
from importlib import resources
from pathlib import Path
import litellm_ratebalance
from litellm_ratebalance.store._scripts import load_lua

package = resources.files("litellm_ratebalance")
scripts = sorted(p.name[:-4] for p in package.joinpath("store", "lua").iterdir() if p.name.endswith(".lua"))
print(json.dumps({
    "file": litellm_ratebalance.__file__,
    "version": litellm_ratebalance.__version__,
    "scripts": {name: len(load_lua(name)) for name in scripts},
    "data": {name: package.joinpath(*name.split("/")).is_file() for name in sys.argv[1:]},
    "dashboard_panels": len(json.loads(package.joinpath("dashboards/litellm-ratebalance.json").read_text())["panels"]),
}))
"""


def check_installed(venv: Path, workdir: Path, expected: Iterable[str]) -> None:
    """The package imports from the fresh environment (not the checkout), and ``importlib.resources`` finds its
    data files there: each Lua script through the store's own loader."""
    out = run([venv / "bin" / "python", "-c", _CHECK_INSTALLED, *REQUIRED], env=clean_env(venv), cwd=workdir)
    report = json.loads(out.strip().splitlines()[-1])
    site = (venv / "lib").resolve()
    if not Path(report["file"]).resolve().is_relative_to(site):
        raise SmokeFailure(f"{PACKAGE} was imported from {report['file']}, not from the fresh environment {site}")
    lua = sorted(Path(n).stem for n in expected if re.fullmatch(rf"{PACKAGE}/store/lua/[^/]+\.lua", n))
    empty = [name for name, size in report["scripts"].items() if size == 0]
    if sorted(report["scripts"]) != lua or empty:
        raise SmokeFailure(f"installed Lua scripts {sorted(report['scripts'])} (empty: {empty}), checkout {lua}")
    absent = [name for name, present in report["data"].items() if not present]
    if absent or report["dashboard_panels"] < 1:
        raise SmokeFailure(f"installed package lacks {absent} (dashboard panels: {report['dashboard_panels']})")
    log(f"{PACKAGE} {report['version']} imports from the fresh environment with {len(lua)} Lua scripts and {REQUIRED}")


# -- 4: the proxy on the example config --------------------------------------------------------------------------
def smoke_config(example: Path) -> dict[str, object]:
    """``example_config.yaml`` as written, but served without upstreams: every deployment answers with
    LiteLLM's ``mock_response``; the local server's metrics endpoint is left out (backpressure then runs on
    its concurrency signal alone, as documented); no Redis (the example names none: the embedded store)."""
    config = yaml.safe_load(example.read_text("utf-8"))
    for deployment in config["model_list"]:
        deployment["litellm_params"]["mock_response"] = "Hello from the wheel smoke test!"
        backpressure = (deployment.get("model_info") or {}).get("backpressure")
        if isinstance(backpressure, dict):
            backpressure.pop("metrics_url", None)
    ours = config["litellm_settings"].get("ratebalance") or {}
    if ours.get("redis_url"):
        raise SmokeFailure("example_config.yaml names a Redis: the smoke test runs the embedded store")
    return dict(config)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def series(metrics_text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every ``litellm_ratebalance_*`` sample in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("litellm_ratebalance_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def exercise_proxy(venv: Path, workdir: Path, config_path: Path, config: dict[str, object]) -> None:
    master_key = "sk-smoke-" + secrets.token_hex(16)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(venv, LITELLM_MASTER_KEY=master_key, LITELLM_LOCAL_MODEL_COST_MAP="True", NO_PROXY="127.0.0.1")
    log_path = workdir / "proxy.log"
    with log_path.open("wb") as proxy_log:
        process = subprocess.Popen(
            [venv / "bin" / "litellm", "--config", config_path, "--host", "127.0.0.1", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=proxy_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it takes its workers too
        )
    try:
        _wait_ready(base, process, log_path)
        headers = {"Authorization": f"Bearer {master_key}"}
        groups = sorted({str(d["model_name"]) for d in config["model_list"]})  # type: ignore[attr-defined]
        with httpx.Client(base_url=base, headers=headers, timeout=60.0) as client:
            for group in groups:
                body = {"model": group, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
                response = client.post("/v1/chat/completions", json=body)
                if response.status_code != 200 or "choices" not in response.json():
                    raise SmokeFailure(f"model {group}: {response.status_code} {response.text[:500]}")
            log(f"one completion from each model group {groups}: 200")
            # (without a database LiteLLM refuses any other key with 400 "No connected db", not 401)
            wrong = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-wrong"})
            if wrong.status_code == 200:
                raise SmokeFailure("the proxy served a wrong key: the master key is not in force")
            ours = _scrape_until_every_component(client)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=20)
    log(f"/metrics: {len(ours)} litellm_ratebalance_* samples, hook latencies of {list(CALLBACK_COMPONENTS)}")


def _wait_ready(base: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SmokeFailure(f"the proxy exited with {process.returncode}; log:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{base}/health/liveliness", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SmokeFailure(f"the proxy did not answer in {START_TIMEOUT_S:.0f} s; log:\n{_tail(log_path)}")


_HOOK_COUNT = re.compile(r'litellm_ratebalance_hook_latency_seconds_count\{.*component="(\w+)"')


def _scrape_until_every_component(client: httpx.Client) -> dict[str, float]:
    """Our samples on ``/metrics`` once every callback's hook latency has a count (hooks after the response,
    such as the success logging, may finish a moment after the client has its answer)."""
    missing: list[str] = list(CALLBACK_COMPONENTS)
    ours: dict[str, float] = {}
    for _ in range(20):
        response = client.get("/metrics", follow_redirects=True)  # (LiteLLM redirects /metrics to /metrics/)
        if response.status_code != 200:
            raise SmokeFailure(f"/metrics answered {response.status_code}: {response.text[:300]}")
        ours = series(response.text)
        counted = {match.group(1) for key, value in ours.items() if value > 0 and (match := _HOOK_COUNT.match(key))}
        missing = [component for component in CALLBACK_COMPONENTS if component not in counted]
        if not missing:
            return ours
        time.sleep(0.5)
    raise SmokeFailure(f"/metrics has no hook latency of {missing}; our series: {sorted(ours)[:40]}")


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_commands(venv: Path, workdir: Path, config_path: Path) -> None:
    """``litellm-ratebalance check-config`` on the proxy's config and ``litellm-ratebalance dashboard``, from the
    fresh environment, without the cost-map variable (neither command imports LiteLLM)."""
    env = clean_env(venv)
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    command = venv / "bin" / "litellm-ratebalance"
    started = time.monotonic()
    out = run([command, "check-config", config_path], env=env, cwd=workdir)
    if "litellm_ratebalance settings are valid" not in out:
        raise SmokeFailure(f"check-config said:\n{out}")
    log(f"litellm-ratebalance check-config: valid ({time.monotonic() - started:.1f} s)")
    checkout = (ROOT / PACKAGE / "dashboards" / "litellm-ratebalance.json").read_text("utf-8")
    if run([command, "dashboard"], env=env, cwd=workdir) != checkout:
        raise SmokeFailure("litellm-ratebalance dashboard does not print the checkout's dashboard")
    log("litellm-ratebalance dashboard: the checkout's dashboard")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--constraints", type=Path, required=True, help="pip constraints file of the pinned LiteLLM")
    parser.add_argument("--litellm", required=True, help="the pinned LiteLLM version (litellm[proxy]==VERSION)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "wheel-smoke", help="emptied first")
    args = parser.parse_args(argv)
    work: Path = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "run").mkdir(parents=True)
    try:
        files = source_files()
        expected = [name for name in files if name.startswith(f"{PACKAGE}/")]
        sdist, wheel = build(files, work / "source", work / "dist")
        check_archives(sdist, wheel, expected)
        venv = work / "venv"
        install(venv, wheel, args.constraints.resolve(), args.litellm)
        # The proxy and the commands run in a directory of their own: nothing of the checkout next to them.
        check_installed(venv, work / "run", expected)
        config = smoke_config(ROOT / "example_config.yaml")
        config_path = work / "run" / "config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
        exercise_proxy(venv, work / "run", config_path, config)
        check_commands(venv, work / "run", config_path)
    except SmokeFailure as exc:
        print(f"wheel-smoke: FAILED: {exc}", file=sys.stderr)
        return 1
    log("passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
