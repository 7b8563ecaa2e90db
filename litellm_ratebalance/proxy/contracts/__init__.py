"""The contracts part's LiteLLM adapter: traffic contracts per feature (classify, count, enforce).

Users list ``litellm_ratebalance.traffic_contracts`` in ``litellm_settings.callbacks``; settings live under
``litellm_settings.ratebalance.traffic_contracts``. The pure policy is :mod:`litellm_ratebalance.contracts`
(feature resolution, modes, actions), the store operations :mod:`litellm_ratebalance.store.contracts` (one
atomic admit per request, reconciles after it).

* :mod:`.callback`: the hooks (the entry module), :data:`traffic_contracts`, the instance users list, and the
  names of the headers and logging-metadata keys it writes.
"""

from __future__ import annotations

from litellm_ratebalance.proxy.contracts.callback import TrafficContractsCallback, traffic_contracts

__all__ = ["TrafficContractsCallback", "traffic_contracts"]
