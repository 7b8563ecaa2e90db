"""``general_settings.custom_auth`` of the proxies that ``bench_proxy_overhead.py`` starts (copied next to their
config.yaml): the demo's keys (:mod:`litellm_ratebalance.demo.demo_auth`: a priority and a traffic-contract
feature from admin-set key or team metadata), no database.

With ``RATEBALANCE_BENCH_LITELLM_LICENSE=1`` in the environment (the proxy running LiteLLM's
``dynamic_rate_limiter_v3``) it also sets ``LITELLM_LICENSE`` to a placeholder, which that limiter needs before it
applies priority weights (it only checks that the variable is set), and stubs LiteLLM's online license check: the
bench never leaves the machine. This file is loaded after LiteLLM's import-time license check (which sees no
license and makes no request) and before its start-up check (which then meets the stub).
"""

from __future__ import annotations

import os

from litellm.proxy.auth.litellm_license import LicenseCheck

from litellm_ratebalance.demo.demo_auth import user_api_key_auth

__all__ = ["user_api_key_auth"]

if os.environ.get("RATEBALANCE_BENCH_LITELLM_LICENSE") == "1":
    LicenseCheck._verify = lambda self, license_str: False  # type: ignore[method-assign]
    os.environ.setdefault("LITELLM_LICENSE", "bench-only-placeholder")
