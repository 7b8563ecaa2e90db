"""The admission part's LiteLLM adapter: priority admission against model-group TPM / RPM.

Users list ``litellm_ratebalance.rate_limiter`` in ``litellm_settings.callbacks``; settings live under
``litellm_settings.priority_reservation*`` and ``litellm_settings.ratebalance.limiter``. The pure policy is
:mod:`litellm_ratebalance.admission`, the store operation :mod:`litellm_ratebalance.store.admission` (one
atomic acquire per request, settles riding on it).

* :mod:`.callback`: the hooks (the entry module) and :data:`rate_limiter`, the instance users list;
* :mod:`.capacity`: a model group's TPM / RPM read from the Router, cached;
* :mod:`.tickets`: the admitted requests whose reservation is still to correct;
* :mod:`.settle_queue`: corrections waiting to travel with the next admission of their model group.
"""

from __future__ import annotations

from litellm_ratebalance.proxy.admission.callback import PriorityRateLimiter, rate_limiter

__all__ = ["PriorityRateLimiter", "rate_limiter"]
