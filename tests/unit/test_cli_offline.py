"""``litellm-ratebalance`` works on a host without network access and without ``LITELLM_LOCAL_MODEL_COST_MAP``:
``import litellm_ratebalance`` and ``check-config`` never import LiteLLM, and ``status`` (which does, for the
Router's deployment ids) imports it with the bundled cost map instead of fetching one.

Each check runs in a fresh interpreter (an imported litellm stays imported) whose environment lacks the
variable, and whose ``socket`` module refuses, and records, every name lookup and every connection beyond
loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_config.yaml"

_GUARDED_RUN = """
import ipaddress, json, socket, sys

attempts = []

def _loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

_getaddrinfo, _connect = socket.getaddrinfo, socket.socket.connect

def getaddrinfo(host, *args, **kwargs):
    if host is not None and not _loopback(str(host)):
        attempts.append(f"lookup {host}")
        raise socket.gaierror(socket.EAI_NONAME, "no network in this test")
    return _getaddrinfo(host, *args, **kwargs)

def connect(self, address):
    if isinstance(address, tuple) and not _loopback(str(address[0])):
        attempts.append(f"connect {address[0]}")
        raise OSError("no network in this test")
    return _connect(self, address)

socket.getaddrinfo, socket.socket.connect = getaddrinfo, connect

import litellm_ratebalance
imported_with_package = "litellm" in sys.modules
from litellm_ratebalance.cli import main

code = main(sys.argv[1:])
print(json.dumps({"code": code, "attempts": attempts, "litellm_imported": "litellm" in sys.modules,
                  "litellm_with_package": imported_with_package}))
"""


def _run_offline(*argv: str) -> tuple[dict[str, Any], str]:
    """Run ``litellm-ratebalance argv`` behind the guard; its JSON report (last stdout line) and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    done = subprocess.run(
        [sys.executable, "-c", _GUARDED_RUN, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=180
    )
    assert done.stdout.strip(), done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report, done.stderr


def test_check_config_needs_neither_litellm_nor_the_network() -> None:
    report, stderr = _run_offline("check-config", str(EXAMPLE))
    assert report == {"code": 0, "attempts": [], "litellm_imported": False, "litellm_with_package": False}, stderr


def test_check_config_still_names_a_bad_model_info_value_without_litellm(tmp_path: Path) -> None:
    config = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    config["model_list"][0]["model_info"]["slots"] = 0.5
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    report, stderr = _run_offline("check-config", str(path))
    assert report == {"code": 78, "attempts": [], "litellm_imported": False, "litellm_with_package": False}
    assert "deployment chat-fast (model_name chat): model_info.slots=0.5 must be a number of at least 1" in stderr


@pytest.mark.redis
def test_status_imports_litellm_without_fetching_its_cost_map(tmp_path: Path) -> None:
    """``status`` builds LiteLLM's Router (deployment ids) and reads a local Redis: loopback only."""
    config = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with RedisServer() as server:
        report, stderr = _run_offline("status", "--config", str(path), "--redis-url", server.url, "--json")
    assert report["attempts"] == [], stderr
    assert report["code"] == 0 and report["litellm_imported"] is True, stderr


def test_dashboard_prints_the_packaged_grafana_dashboard() -> None:
    """``litellm-ratebalance dashboard`` writes the file shipped in the package, byte for byte (the wheel
    smoke test checks that the wheel carries it)."""
    packaged = ROOT / "litellm_ratebalance" / "dashboards" / "litellm-ratebalance.json"
    report, stderr = _run_offline("dashboard")
    assert report == {"code": 0, "attempts": [], "litellm_imported": False, "litellm_with_package": False}, stderr
    done = subprocess.run(
        [sys.executable, "-m", "litellm_ratebalance.cli", "dashboard"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == packaged.read_text("utf-8"), done.stderr
    assert json.loads(done.stdout)["panels"]
