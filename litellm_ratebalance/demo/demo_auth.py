"""custom_auth module the demo proxy loads: bearer tokens -> keys with priority metadata, no database.

``sk-demo-prod``  team "checkout", team metadata priority prod
``sk-demo-batch`` key metadata priority batch
``sk-demo-anon``  no priority (shared default pool)
"""

from __future__ import annotations

from typing import Any

from litellm.proxy._types import UserAPIKeyAuth

_KEYS: dict[str, dict[str, Any]] = {
    "sk-demo-prod": {"team_id": "checkout", "team_metadata": {"priority": "prod"}, "metadata": {}},
    "sk-demo-batch": {"team_id": "analytics", "team_metadata": {}, "metadata": {"priority": "batch"}},
    "sk-demo-anon": {"team_id": None, "team_metadata": {}, "metadata": {}},
}


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    token = api_key.removeprefix("Bearer ").strip()
    entry = _KEYS.get(token)
    if entry is None:
        raise Exception("unknown demo key")
    return UserAPIKeyAuth(api_key=token, **entry)
