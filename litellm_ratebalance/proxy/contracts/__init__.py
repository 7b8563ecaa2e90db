"""The contracts part's LiteLLM adapter: traffic contracts per feature (classify, count, enforce).

Users list ``litellm_ratebalance.traffic_contracts`` in ``litellm_settings.callbacks``; settings live under
``litellm_settings.ratebalance.traffic_contracts``. The pure policy is :mod:`litellm_ratebalance.contracts`
(feature resolution, modes, actions), the store operations :mod:`litellm_ratebalance.store.contracts` (one
atomic admit per request, reconciles after it).

* :mod:`.callback`: the hooks (the entry module) and :data:`traffic_contracts`, the instance users list.
"""

from __future__ import annotations

from litellm_ratebalance.proxy.contracts.callback import (
    FEATURE_HEADER,
    LOG_FEATURE_KEY,
    LOG_RPM_MODE_KEY,
    LOG_TPM_MODE_KEY,
    RPM_MODE_HEADER,
    TPM_MODE_HEADER,
    TrafficContractsCallback,
    traffic_contracts,
)

__all__ = [
    "FEATURE_HEADER",
    "LOG_FEATURE_KEY",
    "LOG_RPM_MODE_KEY",
    "LOG_TPM_MODE_KEY",
    "RPM_MODE_HEADER",
    "TPM_MODE_HEADER",
    "TrafficContractsCallback",
    "traffic_contracts",
]
