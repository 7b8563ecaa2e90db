"""The cost part's LiteLLM adapter: LiteLLM's response cost of API deployments.

Config: ``litellm_settings.callbacks: [..., "litellm_ratebalance.cost"]`` for API deployments' cost; local
deployments (those behind ``litellm_ratebalance.backpressure``) are metered by backpressure's lease path through
the runtime's lease meter (:mod:`.meter`), listed or not. Settings under ``litellm_settings.ratebalance.cost``.
See docs/cost.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from litellm_ratebalance.proxy.cost.meter import cost_meter
from litellm_ratebalance.proxy.runtime import schedule_startup_check

__all__ = ["CostCallback", "cost"]

logger = logging.getLogger("litellm_ratebalance.cost")


class CostCallback(CustomLogger):  # type: ignore[misc]
    """Counts LiteLLM's response cost of API deployments (``litellm_ratebalance.cost`` in callbacks).

    Local deployments are metered by backpressure through the runtime's lease meter (:func:`cost_meter`); their
    calls are skipped here, so nothing is charged twice. In the proxy, building one schedules the start-up
    check of the settings.
    """

    def __init__(self) -> None:
        super().__init__()
        schedule_startup_check()

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        try:
            meter = cost_meter()
            if isinstance(kwargs, Mapping) and meter is not None:
                meter.api_cost(kwargs, response_obj)
        except Exception:
            logger.exception("litellm_ratebalance cost: accounting of a response cost failed")


cost = CostCallback()
