"""``.ci/proxy_extra_requirements.py``: what ``make install`` installs of LiteLLM's ``[proxy]`` extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "proxy_extra_requirements.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proxy_extra_requirements", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REQUIRES = [
    "httpx[http2]>=0.28.0,<1.0",  # litellm's own: not the extra's
    "rich>=13.9.4,<14.0 ; extra == 'cli'",  # another extra
    "litellm-proxy==1.110.2 ; extra == 'proxy'",
    "fastapi>=0.136.3,<1.0 ; extra == 'proxy'",
    "uvloop>=0.22.1,<1.0 ; sys_platform == 'nonesuch' and extra == 'proxy'",  # not this platform
    "litellm_enterprise==0.1.83.post1 ; extra == 'proxy'",
    "anthropic[vertex]>=0.84.0,<1.0 ; extra == 'proxy'",
    "pyyaml>=6.0.3,<7.0 ; extra == 'cli'",
    "pyyaml>=6.0.3,<7.0 ; extra == 'proxy'",
]


def test_only_what_the_proxy_extra_adds_for_this_interpreter() -> None:
    lines = _script().extra_requirements(REQUIRES)
    assert lines == [
        "anthropic[vertex]<1.0,>=0.84.0",
        "fastapi<1.0,>=0.136.3",
        "litellm_enterprise==0.1.83.post1",
        "litellm-proxy==1.110.2",
        "pyyaml<7.0,>=6.0.3",
    ]


def test_left_out_and_unpinned_by_normalised_name() -> None:
    lines = _script().extra_requirements(REQUIRES, leave_out=["litellm_proxy"], any_version=["litellm-enterprise"])
    assert "litellm-proxy==1.110.2" not in lines
    assert "litellm_enterprise" in lines
    assert "fastapi<1.0,>=0.136.3" in lines  # the others keep their versions


def test_the_installed_litellm_has_a_proxy_extra(capsys: pytest.CaptureFixture[str]) -> None:
    """What ``make install`` runs, on the LiteLLM of this environment: the proxy server's own packages."""
    assert _script().main(["--leave-out", "litellm-proxy", "--any-version", "litellm-enterprise"]) == 0
    printed = capsys.readouterr().out.split()
    names = {line.split("<")[0].split(">")[0].split("=")[0].split("[")[0].lower() for line in printed}
    assert {"fastapi", "uvicorn", "litellm-enterprise"} <= names
    assert "litellm-enterprise" in printed  # unpinned
    assert "litellm-proxy" not in names
