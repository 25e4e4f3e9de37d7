"""Browsing the store: keys (``browse_keys``, ``read_key``), memories (``inspect_memory``,
``related``, ``list_memories``), ``stats``, and the small reads the rest of the engine shares
(a memory's view and validity, a key's view, namespace and id arguments)."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from keymem_daemon.engine.freshness import Validity, freshness, rank_factor, validity
from keymem_daemon.engine.indexes import GraphIndexes
from keymem_daemon.engine.keys import KeyInfo
from keymem_daemon.engine.ports import Reader
from keymem_daemon.engine.records import (
    BrowseResult,
    Handle,
    KeyView,
    LinkedKey,
    ListedMemory,
    ListResult,
    Memory,
    MemoryView,
    ReadKeyResult,
    ReadMemoryResult,
    RelatedItem,
    Stats,
)
from keymem_daemon.engine.text import normalize
from keymem_daemon.engine.validate import key_id_arg, namespace_arg, require_str
from keymem_daemon.errors import NotFound, Refused

if TYPE_CHECKING:
    from keymem_daemon.engine.reads.recall import Member

logger = logging.getLogger(__name__)

# related(): the members of each shared key looked at (bounds the work on a hub).
RELATED_PER_KEY: Final = 2000

# related(): an explicit relation counts as much as a key the two memories alone share.
EXPLICIT_RELATION_SCORE: Final = 1.0


class Browsing(GraphIndexes):
    """The read-only views of the graph."""

    def validity_of(self, memory: Memory) -> Validity:
        return validity(memory.decay_profile, memory.last_confirmed_at, memory.confirmation_count,
                        self.clock(), self.lives)

    def rank_factor_of(self, memory: Memory, now: float) -> float:
        return rank_factor(freshness(memory.decay_profile, memory.last_confirmed_at, now, self.lives))

    def count_active(self, reader: Reader, namespace: str | None, now: float) -> int:
        """Active memories in a namespace (None: in all of them)."""
        return reader.count_active(namespace, now)

    def key_view(self, info: KeyInfo, count: int, learned: Sequence[str] = ()) -> KeyView:
        return KeyView(
            key_id=info.id, concept=info.concept, aliases=list(info.aliases),
            learned_aliases=list(learned), key_type=info.key_type, memory_count=count,
            is_hub=count >= self.settings.hub_min_links,
            specificity=round(1.0 / count, 3) if count else 0.0,
        )

    def batch_siblings(self, reader: Reader, memory: Memory, now: float) -> list[str] | None:
        batch = memory.batch_id
        if batch is None:
            return None
        return reader.batch_siblings(batch, memory, now) or None

    def related_ids(self, reader: Reader, memory_id: str) -> list[str]:
        return reader.related_ids(memory_id)

    def resolve_namespace(self, namespace: object, *, field: str = "namespace") -> str | None:
        return namespace_arg(namespace, field=field)

    def check_key_id(self, key_id: object) -> str:
        """A key id argument naming a key that exists."""
        key_id = key_id_arg(key_id)
        if self.keys.get(key_id) is None:
            raise NotFound(f"Key {key_id} not found")
        return key_id

    def active_memory(self, reader: Reader, memory_id: str, namespace: str | None,
                      now: float) -> Memory:
        """The memory, if it is active and in ``namespace``; ``NotFound``/``Refused`` otherwise."""
        memory = reader.memory(memory_id) if isinstance(memory_id, str) else None
        if memory is None or memory.expired(now) or (namespace is not None and memory.namespace != namespace):
            raise NotFound(f"Memory {memory_id} not found")
        if memory.superseded_by is not None:
            raise Refused(f"Memory {memory_id} was superseded by {memory.superseded_by}")
        return memory

    def memory_view(self, reader: Reader, memory: Memory) -> MemoryView:
        return MemoryView(
            id=memory.id, content=memory.content, depth=round(memory.depth, 3), access_count=memory.access_count,
            last_accessed=memory.last_accessed, created_at=memory.created_at, observed_at=memory.observed_at,
            source=memory.source, namespace=memory.namespace, expires_at=memory.expires_at,
            supersedes=memory.supersedes, superseded_by=memory.superseded_by,
            related_to=reader.related_ids(memory.id), validity=self.validity_of(memory))

    def read_memory_view(self, reader: Reader, memory_id: str, via: str | None) -> ReadMemoryResult:
        now = self.clock()
        memory = reader.memory(memory_id)
        assert memory is not None
        links = reader.links_of(memory_id)
        counts = self.key_counts([kid for kid, _, _ in links], memory.namespace, now)
        keys: list[LinkedKey] = []
        for kid, weight, auto in links:
            info = self.keys.get(kid)
            if info is None:
                continue
            view = self.key_view(info, counts.get(info.id), reader.learned_aliases(info.id))
            keys.append(LinkedKey(**{f.name: getattr(view, f.name) for f in dataclasses.fields(view)},
                                  link_weight=round(weight, 3), traversed_from=kid == via,
                                  auto=True if auto else None))
        return ReadMemoryResult(memory=self.memory_view(reader, memory), keys=keys, via_key_id=via)

    def inspect_memory(self, memory_id: str) -> ReadMemoryResult:
        """``read_memory``'s view without its effects (no access counted, no edge reinforced),
        for a person inspecting the store; superseded and expired memories show too."""

        def read(reader: Reader) -> ReadMemoryResult:
            if reader.memory(memory_id) is None:
                raise NotFound(f"Memory {memory_id} not found")
            return self.read_memory_view(reader, memory_id, None)

        return self.store.read(read)

    def browse_keys(self, namespace: object = None, *, hubs_only: bool = False, limit: int = 20,
                    offset: int = 0) -> BrowseResult:
        ns = self.resolve_namespace(namespace)
        now = self.clock()

        def read(reader: Reader) -> BrowseResult:
            memory_count = reader.count_active(ns, now)
            entries = []
            for key_id, n in self.key_counts((k.id for k in self.keys.all()), ns, now).counts.items():
                info = self.keys.get(key_id)
                if info is None or n <= 0 or (hubs_only and n < self.settings.hub_min_links):
                    continue
                entries.append((info, n))
            entries.sort(key=lambda e: (e[1] < self.settings.hub_min_links, -e[1], normalize(e[0].concept)))
            page = entries[offset:offset + limit]
            views = [self.key_view(info, n, reader.learned_aliases(info.id)) for info, n in page]
            return BrowseResult(
                status="ok" if memory_count else "empty_namespace", namespace=ns, memory_count=memory_count,
                key_count=len(entries), keys=views,
                next_offset=offset + limit if offset + limit < len(entries) else None)

        return self.store.read(read)

    def key_page(self, kid: str, ranked: Sequence[Member], total: int, *, limit: int, offset: int) -> ReadKeyResult:
        """One page of ``read_key``: the key's ranked members (``retrieval.rank_key_members``)
        as handles (never content)."""
        now = self.clock()

        def read(reader: Reader) -> ReadKeyResult:
            info = self.keys.get(kid)
            assert info is not None
            page = ranked[offset:offset + limit]
            handles = []
            for item in page:
                memory = item.memory
                handles.append(Handle(
                    memory_id=memory.id, depth=round(memory.depth, 3), created_at=memory.created_at,
                    observed_at=memory.observed_at, namespace=memory.namespace,
                    validity=self.validity_of(memory), link_weight=round(item.weight, 3),
                    content_relevance=None if item.relevance is None else round(item.relevance, 3),
                    score_kind="within_key_rank" if item.relevance is not None else "link_rank",
                    score=round(item.score, 4), batch_sibling_ids=self.batch_siblings(reader, memory, now)))
            view = self.key_view(info, total, reader.learned_aliases(kid))
            return ReadKeyResult(key=view, memories=handles, total=total,
                                 next_offset=offset + limit if offset + limit < total else None)

        return self.store.read(read)

    def related(self, memory_id: object) -> list[RelatedItem]:
        """Neighbours through shared keys (rarer keys count more) and explicit links."""
        memory_id = require_str(memory_id, "memory_id")

        def read(reader: Reader) -> list[RelatedItem]:
            if reader.memory(memory_id) is None:
                return []
            return self._neighbours(reader, memory_id, reader.key_ids_of(memory_id), explicit=True)

        return self.store.read(read)

    def related_through(self, concepts: Sequence[str], memory_id: str) -> list[RelatedItem]:
        """This store's neighbours of another store's memory ``memory_id`` whose keys name
        ``concepts``: the memories under this store's keys of those concepts, scored as
        ``related`` scores shared keys (a concept keyed in both stores, ``federation.py``)."""
        key_ids = list(dict.fromkeys(k for c in concepts if (k := self.keys.by_norm(normalize(c))) is not None))
        if not key_ids:
            return []
        return self.store.read(lambda reader: self._neighbours(reader, memory_id, key_ids, explicit=False))

    def _neighbours(self, reader: Reader, memory_id: str, key_ids: Sequence[str], *,
                    explicit: bool) -> list[RelatedItem]:
        """The memories under ``key_ids`` but ``memory_id`` (and, with ``explicit``, those
        related to it), best first, at most ``related_limit``."""
        now = self.clock()
        scores: dict[str, float] = {}
        shared: dict[str, list[str]] = {}
        kinds: dict[str, set[str]] = {}
        for key_id in key_ids:
            info = self.keys.get(key_id)
            if info is None:
                continue
            weight = self.idf(key_id)
            for other in reader.co_members(key_id, memory_id, RELATED_PER_KEY):
                scores[other] = scores.get(other, 0.0) + weight
                shared.setdefault(other, []).append(info.concept)
                kinds.setdefault(other, set()).add("key")
        if explicit:
            for other in reader.explicit_neighbours(memory_id):
                scores[other] = scores.get(other, 0.0) + EXPLICIT_RELATION_SCORE
                kinds.setdefault(other, set()).add("explicit")
        found = reader.memories(scores)
        items = []
        for other, score in scores.items():
            m = found.get(other)
            if m is None or not m.active(now):
                continue
            kind = kinds[other]
            items.append(RelatedItem(
                id=m.id, content=m.content, shared_keys=shared.get(other, []),
                link_type="both" if len(kind) == 2 else ("key" if "key" in kind else "explicit"),
                depth=round(m.depth, 3), validity=self.validity_of(m),
                score=round(score * self.rank_factor_of(m, now), 4)))
        return best_related(items, self.settings.related_limit)

    def list_memories(self, namespace: object = None, *, limit: int = 50, offset: int = 0) -> ListResult:
        ns = self.resolve_namespace(namespace)
        now = self.clock()

        def read(reader: Reader) -> ListResult:
            total, page = reader.active_page(ns, now, limit, offset)
            out = []
            for m in page:
                concepts = [self.concept(kid) for kid in reader.key_ids_of(m.id, manual_only=True)]
                out.append(ListedMemory(
                    id=m.id, content=m.content, keys=concepts, depth=round(m.depth, 3),
                    access_count=m.access_count, supersedes=m.supersedes, created_at=m.created_at,
                    observed_at=m.observed_at, namespace=m.namespace, expires_at=m.expires_at,
                    related_to=reader.related_ids(m.id), validity=self.validity_of(m)))
            return ListResult(memories=out, total=total,
                              next_offset=offset + limit if offset + limit < total else None)

        return self.store.read(read)

    def stats(self) -> Stats:
        now = self.clock()

        def read(reader: Reader) -> Stats:
            counts = reader.counts(now)
            return Stats(keys=counts.keys, memories=sum(counts.namespaces.values()), links=counts.links,
                         namespaces=counts.namespaces, superseded=counts.superseded,
                         expired_pending_cleanup=counts.expired)

        return self.store.read(read)

    def has_hangul_content(self) -> bool:
        """Whether the store holds Korean text (the daemon then loads Kiwi at start)."""
        return bool(self.store.read(lambda reader: reader.has_hangul_keys()))


def best_related(items: Sequence[RelatedItem], limit: int) -> list[RelatedItem]:
    """Related memories best first (score, then freshness), at most ``limit``."""
    return sorted(items, key=lambda i: (-i.score, -i.validity.freshness))[:limit]
