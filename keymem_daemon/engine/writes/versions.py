"""Versioning: ``correct`` supersedes a memory with its correction (one step deep)."""
from __future__ import annotations

import functools
import logging
from typing import Final

from keymem_daemon.engine.indexes import vector_bytes
from keymem_daemon.engine.links import inherited_weight
from keymem_daemon.engine.ports import MemoryRow, Writer
from keymem_daemon.engine.records import CorrectResult, IdempotencyKey, NewMemory, Replayed
from keymem_daemon.engine.validate import require_str
from keymem_daemon.engine.writes.feedback import Feedback
from keymem_daemon.engine.writes.remember import Host, dedup_hash, new_id
from keymem_daemon.errors import NotFound

logger = logging.getLogger(__name__)

# A memory this deep was established; superseding it keeps most of its depth (DEEP_KEEP), so
# the history of a well-confirmed fact stays findable; a shallow one keeps little (SHALLOW_KEEP).
DEEP_DEPTH: Final = 0.7

DEEP_KEEP: Final = 0.8

SHALLOW_KEEP: Final = 0.3


def superseded_depth_factor(depth: float) -> float:
    """How much of its depth a memory keeps when a correction supersedes it."""
    return DEEP_KEEP if depth >= DEEP_DEPTH else SHALLOW_KEEP


class Versions(Feedback):
    """The correction of a memory."""

    def correct(self, memory_id: object, request: NewMemory, *, keys_given: bool, related_given: bool,
                ttl_given: bool, decay_given: bool, host: Host | None = None,
                idempotency_key: IdempotencyKey | None = None) -> CorrectResult | Replayed:
        """One-step versioning: the correction supersedes the memory, which stays readable by
        id only; the memory it had itself superseded is deleted."""
        memory_id = require_str(memory_id, "memory_id")
        prepared = self.embed_request(request)
        source = self.stamp("correct", host, request.source)

        def write(writer: Writer) -> CorrectResult | Replayed:
            replay = self.replay(writer, idempotency_key)
            if replay is not None:
                return replay
            now = self.clock()
            old = writer.memory(memory_id)
            # Follow the chain to its live head, so two corrections in a row form one chain.
            while old is not None and old.superseded_by is not None:
                old = writer.memory(old.superseded_by)
            if old is None or old.expired(now):
                raise NotFound(f"Memory {memory_id} not found")
            self.sync_vocabulary(writer)
            if old.supersedes is not None:
                grandparent = writer.memory(old.supersedes)
                if grandparent is not None:
                    self.hard_delete(writer, grandparent)
                writer.clear_supersedes(old.id)
            self.check_related(writer, request.related_to, now)
            new = new_id()
            with self.counting(writer, [old.id, new]):
                expires = (now + request.ttl_seconds if request.ttl_seconds is not None else None) \
                    if ttl_given else old.expires_at
                profile = request.decay_profile if decay_given else old.decay_profile
                writer.insert_memory(MemoryRow(
                    id=new, content=request.content, dedup_hash=dedup_hash(request.content),
                    namespace=old.namespace, at=now, observed_at=request.observed_at, decay_profile=profile,
                    source=source, expires_at=expires, vector=vector_bytes(prepared.body), supersedes=old.id))
                writer.supersede(old.id, new, depth_factor=superseded_depth_factor(old.depth), now=now)
                self.unindex(writer, old)
                related = request.related_to if related_given else writer.related_ids(old.id)
                writer.add_relations(new, related)
                note = None
                if keys_given and request.keys:
                    self.link_keys(writer, new, request.keys, request.key_types, prepared.keys)
                else:
                    inherited = writer.links_of(old.id)
                    writer.add_links([(kid, new, inherited_weight(weight), auto) for kid, weight, auto in inherited])
                    for kid, _, _ in inherited:
                        writer.after_commit(functools.partial(self.keys.add_links, kid, 1))
                    concepts = [writer.key_concept(kid) or kid for kid, _, _ in inherited]
                    if concepts:
                        note = (f"Reused {len(concepts)} prior key(s) [{', '.join(concepts)}] -- pass `keys` to "
                                "retag if the correction changed the topic.")
            self.index_memory(writer, new, prepared.indexable(self.analyzer))
            body, code = prepared.body, self.namespace_code(old.namespace)
            writer.after_commit(lambda: self.bodies.upsert(new, body, code))
            result = CorrectResult(new_id=new, superseded=memory_id, note=note,
                                   redacted=request.redacted or None)
            self.record(writer, idempotency_key, result)
            return result

        return self.store.write(write)
