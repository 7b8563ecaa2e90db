"""The cost part's LiteLLM adapter: GPU-seconds of local deployments, LiteLLM's response cost of the rest.

Users list ``litellm_ratebalance.cost`` in ``litellm_settings.callbacks`` for API deployments' cost; settings live
under ``litellm_settings.ratebalance.cost``. The pure part is :mod:`litellm_ratebalance.attribution` (labels, the
busy-time sharing; named apart from this part because ``litellm_ratebalance.cost`` is the callback instance users
list), the store operations are :mod:`litellm_ratebalance.store.metering` (marks riding on backpressure's lease
operations) and :mod:`litellm_ratebalance.store.cost` (reads for ``status``).

* :mod:`.callback`: the hooks (the entry module) and :data:`cost`, the instance users list;
* :mod:`.meter`: :class:`CostMeter`, the lease meter backpressure's lease path marks (found through the
  runtime's registry) and the charging of every request's labels.
"""

from __future__ import annotations

from litellm_ratebalance.proxy.cost.callback import CostCallback, cost
from litellm_ratebalance.proxy.cost.meter import CostMeter, cost_meter

__all__ = ["CostCallback", "CostMeter", "cost", "cost_meter"]
