"""The operator CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from litellm_ratebalance.cli import main
from litellm_ratebalance.routing import core_build


def test_check_config_accepts_valid_and_names_bad_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("litellm_settings:\n  priority_reservation: {prod: 0.9}\n  ratebalance: {fail_mode: closed}\n")
    assert main(["check-config", str(good)]) == 0
    expected_build = "compiled (mypyc)" if core_build() == "compiled" else "pure Python"
    assert f"routing core in this environment: {expected_build}" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "litellm_settings:\n  ratebalance:\n    limiter: {window_seconds: 0}\n"
        "general_settings:\n  token_rate_limit_type: both\n"
    )
    assert main(["check-config", str(bad)]) == 78
    err = capsys.readouterr().err
    assert "litellm_settings.ratebalance.limiter.window_seconds: must be between 1 and 3600" in err
    assert "token_rate_limit_type" in err


def test_check_config_names_a_bad_model_info_value_of_the_rate_balancer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_list = (
        "model_list:\n"
        "  - {model_name: m, litellm_params: {model: openai/a}, model_info: {id: box-a, slots: 0.5}}\n"
        "  - {model_name: m, litellm_params: {model: openai/b}, model_info: {input_to_output_ratio: 100}}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(model_list + "litellm_settings: {callbacks: [litellm_ratebalance.rate_balancer]}\n")
    assert main(["check-config", str(config)]) == 78
    err = capsys.readouterr().err
    assert "deployment box-a (model_name m): model_info.slots=0.5 must be a number of at least 1" in err
    assert "openai/b" not in err and "input_to_output_ratio" not in err
    # The keys mean nothing without the rate balancer: then they are not checked.
    config.write_text(model_list + "litellm_settings: {callbacks: [litellm_ratebalance.rate_limiter]}\n")
    assert main(["check-config", str(config)]) == 0


def test_status_refuses_an_invalid_config_with_key_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("litellm_settings:\n  ratebalance: {fail_mode: sometimes, redis_url: 'redis://127.0.0.1:1'}\n")
    assert main(["status", "--config", str(bad)]) == 78
    assert "litellm_settings.ratebalance.fail_mode" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    assert main(["status", "--config", str(missing)]) == 78
    assert "cannot read the config" in capsys.readouterr().err


def test_status_without_redis_says_there_is_nothing_to_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model_list: []\nlitellm_settings: {callbacks: [litellm_ratebalance.rate_limiter]}\n")
    assert main(["status", "--config", str(config)]) == 3
    err = capsys.readouterr().err
    assert "nothing to show" in err and "embedded store" in err and "--redis-url" in err


def test_status_rejects_a_malformed_redis_url_without_echoing_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model_list: []\n")
    assert main(["status", "--config", str(config), "--redis-url", "http://u:topsecret@127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "invalid Redis URL http://u:***@127.0.0.1:1 (--redis-url)" in err and "topsecret" not in err


def test_check_config_names_a_bad_backpressure_block_of_a_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_list = (
        "model_list:\n"
        "  - {model_name: m, litellm_params: {model: openai/a},\n"
        "     model_info: {id: gpu-a, backpressure: {shed_threshold: 1.5}}}\n"
        "  - {model_name: m, litellm_params: {model: openai/b}, model_info: {backpressure: {shed_treshold: 0.8}}}\n"
        "  - {model_name: m, litellm_params: {model: openai/c}, model_info: {backpressure: {max_limit: 8}}}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(model_list + "litellm_settings: {callbacks: [litellm_ratebalance.backpressure]}\n")
    assert main(["check-config", str(config)]) == 78
    err = capsys.readouterr().err
    assert "deployment gpu-a (model_name m): model_info.backpressure.shed_threshold" in err
    assert "deployment model_list[1] (model_name m): model_info.backpressure.shed_treshold" in err
    assert "model_list[2]" not in err
    # Without the backpressure callback the blocks mean nothing: not checked.
    config.write_text(model_list + "litellm_settings: {callbacks: [litellm_ratebalance.rate_limiter]}\n")
    assert main(["check-config", str(config)]) == 0
