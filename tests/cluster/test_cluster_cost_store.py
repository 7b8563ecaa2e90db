"""tests/store/test_cost_store.py, unchanged, on the local Redis Cluster (see tests/cluster/suites.py): the cost
scripts read the lease set and write the cost state of one deployment, keys of one hash tag."""

from __future__ import annotations

import pytest

from tests.cluster.suites import store_tests

pytestmark = [pytest.mark.cluster, pytest.mark.redis]

globals().update(store_tests("tests.store.test_cost_store"))
