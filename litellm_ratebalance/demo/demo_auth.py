"""custom_auth module the demo proxy loads: bearer tokens -> keys with admin-set metadata, no database.

===================  ==============================================  ==========================================
token                priority (limiter, backpressure tier)           traffic-contract feature
===================  ==============================================  ==========================================
``sk-demo-prod``     ``prod`` from team "checkout"'s team metadata   ``checkout-assistant`` (team metadata)
``sk-demo-batch``    ``batch`` from the key's metadata               ``summaries`` (key metadata)
``sk-demo-anon``     none: the shared default pool / tier            ``search``, through the key's tag ``lookup``
===================  ==============================================  ==========================================

The proxy copies this file next to its config (``general_settings.custom_auth:
demo_auth.user_api_key_auth``); it imports only LiteLLM's own types.
"""

from __future__ import annotations

from typing import Any

from litellm.proxy._types import UserAPIKeyAuth

__all__ = ["DEMO_KEYS", "user_api_key_auth"]

DEMO_KEYS: dict[str, dict[str, Any]] = {
    "sk-demo-prod": {
        "team_id": "checkout",
        "team_metadata": {"priority": "prod", "feature": "checkout-assistant"},
        "metadata": {},
    },
    "sk-demo-batch": {
        "team_id": "analytics",
        "team_metadata": {},
        "metadata": {"priority": "batch", "feature": "summaries"},
    },
    "sk-demo-anon": {"team_id": None, "team_metadata": {}, "metadata": {"tags": ["lookup"]}},
}


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    token = api_key.removeprefix("Bearer ").strip()
    entry = DEMO_KEYS.get(token)
    if entry is None:
        raise Exception("unknown demo key")
    return UserAPIKeyAuth(api_key=token, **entry)
