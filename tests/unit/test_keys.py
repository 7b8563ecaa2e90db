"""Key safety: hostile names never inject a hash tag, never collide, stay bounded, land in the right slot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litellm_ratebalance.errors import ConfigurationError
from litellm_ratebalance.store.keys import MAX_ESCAPED_NAME_LENGTH, KeySpace, escape_name

hostile = st.text(
    alphabet=st.sampled_from(list("ab{}:%~ _-.\x00\n\u00e9\u4e2d\U0001f600")) | st.characters(), max_size=300
)


def hash_tag(key: str) -> str:
    """The part Redis Cluster hashes: between the first '{' and the next '}' (if non-empty)."""
    start = key.find("{")
    if start == -1:
        return key
    end = key.find("}", start + 1)
    if end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


@given(hostile)
def test_escaped_names_are_safe_and_bounded(name: str) -> None:
    escaped = escape_name(name)
    assert len(escaped) <= MAX_ESCAPED_NAME_LENGTH
    assert not set(escaped) & set("{}: \n\x00")


@settings(max_examples=500)
@given(hostile, hostile)
def test_distinct_names_give_distinct_keys(a: str, b: str) -> None:
    keys = KeySpace("rb")
    if a != b:
        assert keys.admission_window(a) != keys.admission_window(b)
        assert keys.routing_tag(a) != keys.routing_tag(b)


@given(hostile)
def test_each_model_group_key_hashes_on_its_own_escaped_name(name: str) -> None:
    keys = KeySpace("rb")
    assert hash_tag(keys.admission_window(name)) == "adm:" + escape_name(name)
    assert hash_tag(keys.routing_tag(name) + ":x") == "rt:" + escape_name(name)
    assert hash_tag(keys.concurrency_tag(name)) == "bp:" + escape_name(name)


def test_separator_cannot_fake_another_key() -> None:
    keys = KeySpace("rb")
    assert keys.admission_window("a}:window") != keys.admission_window("a")
    assert escape_name("a:b") != escape_name("a") + ":b"


def test_long_names_are_hashed_not_cut_into_collisions() -> None:
    a, b = "x" * 200 + "1", "x" * 200 + "2"
    assert escape_name(a) != escape_name(b)
    assert "~" in escape_name(a)


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "has space", "x" * 65])
def test_bad_prefix_is_refused_with_key_path(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=r"ratebalance\.key_prefix"):
        KeySpace(prefix)


def test_contract_window_keys_share_a_slot_per_window() -> None:
    keys = KeySpace("rb")
    assert hash_tag(keys.contract_window("rpm", 1789057680)) == hash_tag(keys.contract_window("tpm", 1789057680))
    assert keys.contract_window("rpm", 1789057680) == "rb:traffic_contract:rpm:{1789057680}"
