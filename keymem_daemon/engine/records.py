"""The memory model's records and the results its operations return.

Records (``Memory``, ``Link``) mirror rows of the store. Results are what a tool answers;
their field names are the JSON keys the agent sees, and ``render`` turns any of them into
JSON-ready data. A field declared with ``omit()`` disappears from the JSON when it is
``None`` (``batch_sibling_ids``, ``content_truncated`` ...); other ``None`` fields render as
``null`` (``next_offset``, ``via_key_id`` ...).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from keymem_daemon.engine.freshness import DecayProfile, Validity
from keymem_daemon.engine.keys import KeyType


def omit() -> Any:
    """A field that is left out of the rendered JSON while it is ``None``."""
    return field(default=None, metadata={"omit_none": True})


def render(value: Any) -> Any:
    """Dataclasses -> dicts (recursively), honouring ``omit()`` fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = render(item)
        return out
    if isinstance(value, list | tuple):
        return [render(v) for v in value]
    if isinstance(value, dict):
        return {k: render(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 6)
    return value


def dumps(value: Any) -> str:
    return json.dumps(render(value), ensure_ascii=False, separators=(",", ":"))


# -- records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    id: str
    content: str
    namespace: str
    depth: float
    access_count: int
    created_at: float
    updated_at: float
    last_accessed: float | None
    observed_at: float | None
    last_confirmed_at: float
    confirmation_count: int
    decay_profile: DecayProfile
    last_confirmation_evidence: str | None
    last_confirmation_source: dict[str, Any] | None
    last_confirmation_id: str | None
    expires_at: float | None
    supersedes: str | None
    superseded_by: str | None
    source: dict[str, Any] | None
    rowid: int

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now > self.expires_at

    def active(self, now: float) -> bool:
        return self.superseded_by is None and not self.expired(now)

    @property
    def when(self) -> float:
        """When the fact was observed (or saved, when nobody said)."""
        return self.observed_at if self.observed_at is not None else self.created_at

    @property
    def batch_id(self) -> str | None:
        value = (self.source or {}).get("batch_id")
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Link:
    key_id: str
    memory_id: str
    weight: float
    auto: bool


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyView:
    key_id: str
    concept: str
    aliases: list[str]
    learned_aliases: list[str]
    key_type: KeyType
    memory_count: int
    is_hub: bool
    specificity: float


@dataclass(frozen=True, slots=True)
class CompactKey:
    key_id: str
    concept: str
    aliases: list[str]
    key_type: KeyType
    score: float
    match_type: Literal["concept", "alias", "semantic", "content"]
    memory_count: int
    is_hub: bool
    specificity: float


@dataclass(frozen=True, slots=True)
class NearestKey:
    key_id: str
    concept: str
    aliases: list[str]
    key_type: KeyType
    score: float
    memory_count: int


@dataclass(frozen=True, slots=True)
class KeyRef:
    concept: str
    key_id: str


@dataclass(frozen=True, slots=True)
class ConnectedKey:
    concept: str
    key_id: str
    relevance: float


@dataclass(frozen=True, slots=True)
class MatchedKey:
    key_id: str


@dataclass(frozen=True, slots=True)
class Preview:
    """The passive Top-1 memory ``recall`` returns under its best key."""

    id: str
    content: str
    namespace: str
    depth: float
    created_at: float
    observed_at: float | None
    validity: Validity
    content_relevance: float
    connected_keys: list[ConnectedKey]
    matched_key: MatchedKey
    evidence: str = "passive_preview"
    reinforced: bool = False
    batch_sibling_ids: list[str] | None = omit()
    content_truncated: bool | None = omit()
    content_chars: int | None = omit()
    auto_confirmed: bool | None = omit()


@dataclass(frozen=True, slots=True)
class RecallResult:
    status: Literal["found", "no_match", "empty_namespace"]
    query: str
    namespace: str | None
    keys: list[CompactKey]
    memories: list[Preview]
    namespace_memory_count: int | None = omit()
    nearest_keys: list[NearestKey] | None = omit()
    note: str | None = omit()


@dataclass(frozen=True, slots=True)
class BrowseResult:
    status: Literal["ok", "empty_namespace"]
    namespace: str | None
    memory_count: int
    key_count: int
    keys: list[KeyView]
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class Handle:
    memory_id: str
    depth: float
    created_at: float
    observed_at: float | None
    namespace: str
    validity: Validity
    link_weight: float
    content_relevance: float | None
    score_kind: Literal["within_key_rank", "link_rank"]
    score: float
    evidence: str = "unread"
    suggested_tool: str = "read_memory"
    batch_sibling_ids: list[str] | None = omit()


@dataclass(frozen=True, slots=True)
class ReadKeyResult:
    key: KeyView
    memories: list[Handle]
    total: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class MemoryView:
    id: str
    content: str
    depth: float
    access_count: int
    last_accessed: float | None
    created_at: float
    observed_at: float | None
    source: dict[str, Any] | None
    namespace: str
    expires_at: float | None
    supersedes: str | None
    superseded_by: str | None
    related_to: list[str]
    validity: Validity


@dataclass(frozen=True, slots=True)
class LinkedKey(KeyView):
    """A key of a memory as ``read_memory`` shows it: the key, and the link to this memory."""

    link_weight: float
    traversed_from: bool
    auto: bool | None = omit()


@dataclass(frozen=True, slots=True)
class ReadMemoryResult:
    memory: MemoryView
    keys: list[LinkedKey]
    via_key_id: str | None
    evidence: str = "read"
    grounded: bool = True
    suggested_tool: str | None = None


@dataclass(frozen=True, slots=True)
class ConfirmResult:
    memory_id: str
    confirmed: bool
    duplicate: bool
    validity: Validity


@dataclass(frozen=True, slots=True)
class Redacted:
    kind: str
    count: int


@dataclass(frozen=True, slots=True)
class Hints:
    near_keys: list[dict[str, Any]]
    language_note: str | None = omit()
    phrase_keys: list[str] | None = omit()
    phrase_note: str | None = omit()
    few_keys_note: str | None = omit()


@dataclass(frozen=True, slots=True)
class RememberResult:
    saved: str
    deduplicated: bool | None = omit()
    note: str | None = omit()
    hints: Hints | None = omit()
    redacted: list[Redacted] | None = omit()
    dropped_keys: list[str] | None = omit()
    keys: list[KeyRef] | None = omit()


@dataclass(frozen=True, slots=True)
class BatchItem:
    index: int
    saved: str | None = omit()
    deduplicated: bool | None = omit()
    error: str | None = omit()
    field: str | None = omit()
    redacted: list[Redacted] | None = omit()


@dataclass(frozen=True, slots=True)
class BatchResult:
    saved: int
    failed: int
    items: list[BatchItem]
    batch_id: str | None = omit()


@dataclass(frozen=True, slots=True)
class CorrectResult:
    new_id: str
    superseded: str
    note: str | None = omit()
    redacted: list[Redacted] | None = omit()


@dataclass(frozen=True, slots=True)
class DismissResult:
    memory_id: str
    key_id: str
    concept: str
    link_weight: float
    previous_link_weight: float
    floored: bool
    alias_candidate_cleared: str | None
    note: str


@dataclass(frozen=True, slots=True)
class ForgetResult:
    deleted: bool
    restored: str | None = omit()


@dataclass(frozen=True, slots=True)
class RelatedItem:
    id: str
    content: str
    shared_keys: list[str]
    link_type: Literal["key", "explicit", "both"]
    depth: float
    validity: Validity
    score: float


@dataclass(frozen=True, slots=True)
class ListedMemory:
    id: str
    content: str
    keys: list[str]
    depth: float
    access_count: int
    supersedes: str | None
    created_at: float
    observed_at: float | None
    namespace: str
    expires_at: float | None
    related_to: list[str]
    validity: Validity


@dataclass(frozen=True, slots=True)
class ListResult:
    memories: list[ListedMemory]
    total: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class Stats:
    keys: int
    memories: int
    links: int
    namespaces: dict[str, int]
    superseded: int
    expired_pending_cleanup: int

    def summary(self) -> str:
        return f"{self.keys} keys, {self.memories} memories, {self.links} links"


@dataclass(frozen=True, slots=True)
class Hit:
    """One memory of a hybrid recall (``recall_memories`` and the push path)."""

    id: str
    content: str
    keys: list[str]
    matched_via: list[str]
    hop: int
    score: float
    rank_score: float
    relevance_score: float
    depth: float
    access_count: int
    source: dict[str, Any] | None
    supersedes: str | None
    created_at: float
    observed_at: float | None
    namespace: str
    related_to: list[str]
    validity: Validity
    score_kind: str = "evidence_rank"
    batch_sibling_ids: list[str] | None = omit()
    content_truncated: bool | None = omit()
    content_chars: int | None = omit()


@dataclass(frozen=True, slots=True)
class CleanupResult:
    deleted: int
    pruned_aliases: int
    pruned_candidates: int
    pruned_keys: int


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A client's ``Idempotency-Key`` and the fingerprint of the request it came with.

    The fingerprint is a SHA-256 of the tool name and its arguments in canonical JSON (keys
    sorted, no spaces), so a retry of the same call matches and any other call does not.
    """

    key: str
    fingerprint: str

    @classmethod
    def of_call(cls, key: str, tool: str, arguments: Mapping[str, Any] | None) -> IdempotencyKey:
        canonical = json.dumps({"tool": tool, "arguments": dict(arguments or {})}, sort_keys=True,
                               separators=(",", ":"), ensure_ascii=True, default=repr)
        return cls(key, hashlib.sha256(canonical.encode("ascii")).hexdigest())


@dataclass(frozen=True, slots=True)
class Replayed:
    """The stored answer of a write that already ran under the same idempotency key."""

    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A validated write request, ready for the transaction (one remember or batch item)."""

    content: str
    keys: list[str]
    key_types: dict[str, KeyType]
    namespace: str
    ttl_seconds: float | None
    decay_profile: DecayProfile
    related_to: list[str]
    source: dict[str, Any] | None
    observed_at: float | None
    redacted: list[Redacted]
    dropped_keys: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
