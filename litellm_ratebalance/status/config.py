"""The proxy's config.yaml as status reads it: settings, deployments (ids by LiteLLM's own rule) and their
summed limits."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.proxy._litellm import group_deployments
from litellm_ratebalance.settings import Settings

__all__ = ["ConfigDeployment", "ProxyConfig", "as_mapping", "config_deployments", "group_capacity", "load_proxy_config"]

# -- config (I/O) ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The parts of a LiteLLM config.yaml status reads."""

    path: Path
    model_list: list[dict[str, Any]]
    litellm_settings: dict[str, Any]
    router_settings: dict[str, Any]
    general_settings: dict[str, Any]
    settings: Settings


def as_mapping(value: object, where: str) -> dict[str, Any]:
    """``value`` when it is a mapping, ``{}`` when it is absent; else a ConfigurationError naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{where}: must be a mapping (got {type(value).__name__})")
    return value


def load_proxy_config(path: Path) -> ProxyConfig:
    """Read config.yaml and validate our settings (ConfigurationError on a bad file or setting)."""
    import yaml

    from litellm_ratebalance.settings import parse_settings

    try:
        raw = yaml.safe_load(path.read_text("utf-8")) or {}
    except OSError as exc:
        raise ConfigurationError(f"cannot read the config: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"the config is not valid YAML: {exc}") from None
    config = as_mapping(raw, "the config file")
    litellm_settings = as_mapping(config.get("litellm_settings"), "litellm_settings")
    general = as_mapping(config.get("general_settings"), "general_settings")
    model_list = config.get("model_list") or []
    if not isinstance(model_list, list) or not all(isinstance(m, dict) for m in model_list):
        raise ConfigurationError("model_list: must be a list of mappings")
    ours = dict(litellm_settings)
    if general.get("token_rate_limit_type") is not None:
        ours["token_rate_limit_type"] = general["token_rate_limit_type"]
    return ProxyConfig(
        path=path,
        model_list=model_list,
        litellm_settings=litellm_settings,
        router_settings=as_mapping(config.get("router_settings"), "router_settings"),
        general_settings=general,
        settings=parse_settings(ours),
    )


@dataclass(frozen=True, slots=True)
class ConfigDeployment:
    model_group: str
    deployment_id: str
    deployment: dict[str, Any]
    """The deployment dict as the Router holds it (``model_name``, ``litellm_params``, ``model_info``)."""


def config_deployments(config: ProxyConfig) -> list[ConfigDeployment]:
    """Deployments of ``model_list`` with the ids the proxy's Router gives them.

    The Router itself builds them (no network), so an id without ``model_info.id`` is LiteLLM's hash of
    the params, ``os.environ/`` values resolved from this environment: run status where the proxy's
    environment variables are set, or give deployments an explicit ``model_info.id``.
    """
    if not config.model_list:
        return []
    from litellm.router import Router

    try:
        router = Router(model_list=copy.deepcopy(config.model_list))
        deployments = group_deployments(router)
    except Exception as exc:
        raise ConfigurationError(f"model_list: LiteLLM's Router refused it: {exc}") from None
    out: list[ConfigDeployment] = []
    for deployment in deployments:
        info = deployment.get("model_info") or {}
        name = deployment.get("model_name")
        if isinstance(name, str) and info.get("id") is not None:
            out.append(ConfigDeployment(name, str(info["id"]), dict(deployment)))
    return out


def _positive_int(value: object) -> int | None:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def group_capacity(deployments: Sequence[ConfigDeployment]) -> tuple[int | None, int | None]:
    """Summed rpm / tpm of a group's deployments (``litellm_params`` first, then ``model_info``), as the
    limiter reads them; None where no deployment sets one."""
    rpm: int | None = None
    tpm: int | None = None
    for d in deployments:
        params = d.deployment.get("litellm_params") or {}
        info = d.deployment.get("model_info") or {}
        one_rpm = _positive_int(params.get("rpm", info.get("rpm")))
        one_tpm = _positive_int(params.get("tpm", info.get("tpm")))
        if one_rpm is not None:
            rpm = (rpm or 0) + one_rpm
        if one_tpm is not None:
            tpm = (tpm or 0) + one_tpm
    return rpm, tpm
