"""The backpressure part's LiteLLM adapter: admission per deployment of local inference servers.

Users list ``litellm_ratebalance.backpressure`` in ``litellm_settings.callbacks``; settings live under
``litellm_settings.ratebalance.backpressure``. The pure policy is :mod:`litellm_ratebalance.overload` (named
apart from this part because ``litellm_ratebalance.backpressure`` is the callback instance users list), the
store operations are the lease, peer and signal-report operations of :mod:`litellm_ratebalance.store`.

The modules, in the order one request meets them:

* :mod:`.callback`: the hooks (the entry module) and :data:`backpressure`, the instance users list;
* :mod:`.requests`: what a request is to the policy before the call, and what it teaches after it;
* :mod:`.book`: this process's state (deployments, the lease book) and the pure decision on it;
* :mod:`.admit`: taking and giving back slots, the wait queue and its dispatcher (the store calls);
* :mod:`.refusals`: the 429 / 503 a refused request gets, and how it is logged;
* :mod:`.peers`: what this replica shares with the other replicas of a deployment (waiting tiers, learned
  limit, answer lengths, top-tier demand);
* :mod:`.maintain` and :mod:`.signals`: the background step (scrapes, lease renewal, signal reports);
* :mod:`.metrics`: the part's Prometheus series.
"""

from __future__ import annotations

from litellm_ratebalance.proxy.backpressure.callback import (
    BackpressureCallback,
    backpressure,
    startup_model_info_problems,
)

__all__ = ["BackpressureCallback", "backpressure", "startup_model_info_problems"]
