"""tests/store/test_concurrency_store.py, unchanged, on the local Redis Cluster (see tests/cluster/suites.py)."""

from __future__ import annotations

import pytest

from tests.cluster.suites import store_tests

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

globals().update(store_tests("tests.store.test_concurrency_store"))
