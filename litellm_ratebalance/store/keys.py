"""Every Redis key and hash field name the package uses is built here, and only here.

Contract:

* Keys look like ``{prefix}:{<tag>}:<suffix>``. The part in braces is the Redis Cluster hash tag; every key
  that one script touches carries the same tag, so every script runs on one cluster slot.
* User-supplied names (model group, priority, feature, deployment id, team/key id) pass through
  :func:`escape_name` before they reach a key or a field. The escaped form uses only
  ``[A-Za-z0-9_.-]`` plus ``%`` escapes and ``~`` for truncation, so it can contain neither a brace
  (no hash-tag injection) nor the ``:`` separator (no separator confusion), and distinct names give
  distinct escaped forms (up to a 64-bit hash collision for names longer than the length bound).
* The prefix is validated once: it may not contain braces, so the hash tag is always the part we build.
"""

from __future__ import annotations

import hashlib
import re

from litellm_ratebalance.errors import ConfigurationError

__all__ = ["MAX_ESCAPED_NAME_LENGTH", "KeySpace", "escape_name", "validate_prefix"]

MAX_ESCAPED_NAME_LENGTH = 80
_SAFE_CHARS = re.compile(r"[A-Za-z0-9_.\-]")
_PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.\-:]{1,64}$")


def escape_name(name: str) -> str:
    """Return a key-safe, injective encoding of ``name`` of at most ``MAX_ESCAPED_NAME_LENGTH`` chars.

    Characters outside ``[A-Za-z0-9_.-]`` become ``%XX`` per UTF-8 byte (``%`` itself included, which
    keeps the encoding injective). An encoding longer than the bound is cut and suffixed with ``~`` and
    16 hex digits of the SHA-256 of the full name; ``~`` never occurs in an untruncated encoding, so a
    truncated form cannot equal an untruncated one.
    """
    out: list[str] = []
    for char in name:
        if _SAFE_CHARS.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    escaped = "".join(out)
    if len(escaped) <= MAX_ESCAPED_NAME_LENGTH:
        return escaped
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{escaped[: MAX_ESCAPED_NAME_LENGTH - 17]}~{digest}"


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix, else raise :class:`ConfigurationError`."""
    if not _PREFIX_PATTERN.fullmatch(prefix):
        raise ConfigurationError(
            "litellm_settings.ratebalance.key_prefix: must be 1 to 64 characters from "
            f"[A-Za-z0-9_.-:] (no braces, no spaces), got {prefix!r}"
        )
    return prefix


class KeySpace:
    """Builds the keys of one deployment of the package (one prefix)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str = "ratebalance") -> None:
        self.prefix = validate_prefix(prefix)

    # -- admission (priority limiter) -------------------------------------------------------------
    def admission_window(self, model_group: str) -> str:
        """Hash holding the current admission window of one model group (one key, one slot)."""
        return f"{self.prefix}:{{adm:{escape_name(model_group)}}}:window"

    def admission_estimate(self, model_group: str) -> str:
        """Hash holding the learned output estimate of one model group (same slot as its window)."""
        return f"{self.prefix}:{{adm:{escape_name(model_group)}}}:estimate"

    # -- routing statistics -------------------------------------------------------------------------
    def routing_tag(self, model_group: str) -> str:
        """Hash tag shared by every routing-statistics key of one model group."""
        return f"{self.prefix}:{{rt:{escape_name(model_group)}}}"

    # -- traffic contracts --------------------------------------------------------------------------
    def contract_window(self, kind: str, window_start: int) -> str:
        """Contract counters of one fixed window: ``{prefix}:traffic_contract:{kind}:{window_start}``.

        ``kind`` is ``rpm`` or ``tpm``. The window start is the hash tag, so the RPM and TPM hashes of
        one window share a cluster slot and one script can update both.
        """
        if kind not in ("rpm", "tpm"):
            raise ValueError(f"contract counter kind must be 'rpm' or 'tpm', got {kind!r}")
        return f"{self.prefix}:traffic_contract:{kind}:{{{int(window_start)}}}"

    # -- backpressure -------------------------------------------------------------------------------
    def concurrency_tag(self, deployment_id: str) -> str:
        """Hash tag shared by every concurrency/lease key of one deployment."""
        return f"{self.prefix}:{{bp:{escape_name(deployment_id)}}}"

    def signal_report(self, deployment_id: str) -> str:
        """Hash of one deployment's signal report (server answering, problems of its signals)."""
        return f"{self.concurrency_tag(deployment_id)}:signals"

    def waiting_tiers(self, deployment_id: str) -> str:
        """Sorted set of the tiers waiting for one deployment in each replica's queue (its lease hash tag:
        the lease acquire reads it)."""
        return f"{self.concurrency_tag(deployment_id)}:waiting"

    def peer_keys(self, deployment_id: str) -> tuple[str, str]:
        """The sorted set of the replicas exchanging state about one deployment (expiries) and the hash of
        their states."""
        tag = self.concurrency_tag(deployment_id)
        return f"{tag}:peers", f"{tag}:peer_states"

    # -- cost attribution ---------------------------------------------------------------------------
    def cost_state(self, deployment_id: str) -> str:
        """Hash of one deployment's sharing clock and efficiency sums; the same hash tag as its leases,
        which the cost scripts read to count the requests in flight."""
        return f"{self.concurrency_tag(deployment_id)}:cost"

    # -- replica health -----------------------------------------------------------------------------
    def replica_keys(self) -> list[str]:
        """The sorted set of live replicas and the hash of their reports (one hash tag)."""
        tag = f"{self.prefix}:{{replicas}}"
        return [f"{tag}:seen", f"{tag}:reports"]

    @staticmethod
    def field(name: str) -> str:
        """Escape a user-supplied name for use as a hash field (see :func:`escape_name`)."""
        return escape_name(name)
