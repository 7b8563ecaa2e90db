"""The operator CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from litellm_ratebalance.cli import main


def test_check_config_accepts_valid_and_names_bad_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("litellm_settings:\n  priority_reservation: {prod: 0.9}\n  ratebalance: {fail_mode: closed}\n")
    assert main(["check-config", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "litellm_settings:\n  ratebalance:\n    limiter: {window_seconds: 0}\n"
        "general_settings:\n  token_rate_limit_type: both\n"
    )
    assert main(["check-config", str(bad)]) == 78
    err = capsys.readouterr().err
    assert "litellm_settings.ratebalance.limiter.window_seconds: must be between 1 and 3600" in err
    assert "token_rate_limit_type" in err
