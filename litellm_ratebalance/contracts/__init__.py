"""Traffic contracts: per-feature and basket RPM/TPM per fixed window, labelled normal / borrowed /
degraded (pure policy in :mod:`.policy`, settings in :mod:`.config`; the LiteLLM adapter is
:mod:`litellm_ratebalance.proxy.contracts`)."""

from __future__ import annotations

from litellm_ratebalance.contracts.config import TrafficContractSettings
from litellm_ratebalance.contracts.policy import ContractBook, ContractLimits, Mode, resolve_feature

__all__ = ["ContractBook", "ContractLimits", "Mode", "TrafficContractSettings", "resolve_feature"]
