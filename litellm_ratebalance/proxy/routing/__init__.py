"""The routing part's LiteLLM adapters: rate-balanced routing, one core behind two entry points.

Proxy users list ``litellm_ratebalance.rate_balancer`` in ``litellm_settings.callbacks``; SDK users set
:class:`RateBalancedRouting` on their ``litellm.Router``. Settings live under
``litellm_settings.ratebalance.routing``. The pure core is :mod:`litellm_ratebalance.routing` (a thin
:class:`~litellm_ratebalance.routing.RateBalancer` facade over estimator, view, evidence and selection), the
store operation :mod:`litellm_ratebalance.store.routing` (one sync per model group and refresh interval).

* :mod:`.callback`: the proxy callback (:data:`rate_balancer`, the instance users list) and the SDK strategy;
* :mod:`.calls`: what the hooks read from LiteLLM's dicts (candidates, a request's size and id, a finished
  call's sample).
"""

from __future__ import annotations

from litellm_ratebalance.proxy.routing.callback import RateBalancedRouting, RateBalancerCallback, rate_balancer

__all__ = ["RateBalancedRouting", "RateBalancerCallback", "rate_balancer"]
