"""Feedback on memories and links: ``read_memory`` (counts the access, reinforces the traversed
link, lets autokey learn), ``confirm_memory``, ``dismiss``, and ``forget`` (hard delete, which
undoes a correction)."""
from __future__ import annotations

import functools
import logging
from typing import Final

from keymem_daemon.engine.indexes import vector_from, vector_problem
from keymem_daemon.engine.links import LINK_MIN, dismissed_weight, reinforced_weight
from keymem_daemon.engine.ports import Reader, Writer
from keymem_daemon.engine.records import (
    ConfirmResult,
    DismissResult,
    ForgetResult,
    IdempotencyKey,
    Memory,
    ReadMemoryResult,
    Replayed,
)
from keymem_daemon.engine.text import normalize
from keymem_daemon.engine.validate import evidence_arg, require_str
from keymem_daemon.engine.writes.remember import Host, Remembering
from keymem_daemon.errors import InvalidInput, NotFound, StoreBusy, StoreUnavailable

logger = logging.getLogger(__name__)

# How much deeper one confirmation makes a memory: twenty confirmations take it from 0 to 1.
CONFIRM_DEPTH: Final = 0.05


class Feedback(Remembering):
    """The writes that confirm, weaken, read and delete memories."""

    def read_memory(self, memory_id: object, *, via_key_id: object = None,
                    namespace: object = None) -> ReadMemoryResult:
        """Full content and every key of one memory. Counts the access; reinforces only the
        traversed edge (+0.1) and lets autokey learn from it. Never confirms the memory."""
        memory_id = require_str(memory_id, "memory_id")
        if via_key_id is not None and not isinstance(via_key_id, str):
            raise InvalidInput("via_key_id must be a string", field="via_key_id")
        ns = self.resolve_namespace(namespace)
        weak = self.buffer.consume(via_key_id) if via_key_id and self.settings.autokey else None
        query_vector = self.embedder.embed([weak.query])[0] if weak is not None else None

        def check(reader: Reader, now: float) -> tuple[Memory, float | None]:
            memory = self.active_memory(reader, memory_id, ns, now)
            weight = reader.link_weight(via_key_id, memory.id) if via_key_id is not None else None
            if via_key_id is not None and weight is None:
                raise NotFound(f"Key {via_key_id} is not linked to memory {memory.id}")
            return memory, weight

        def write(writer: Writer) -> None:
            now = self.clock()
            memory, weight = check(writer, now)
            if via_key_id is not None and weight is not None:
                writer.set_link_weight(via_key_id, memory.id, reinforced_weight(weight))
                if weak is not None and query_vector is not None:
                    self.learn_alias(writer, via_key_id, memory.id, weak.query, weak.score, query_vector)
            writer.count_access(memory.id, now)

        try:
            self.store.write(write)
        except (StoreUnavailable, StoreBusy):
            # A shared store's server that does not answer (or a daemon whose connections to it
            # are all busy): the memory is read (from the local replica) without the
            # bookkeeping, which is no part of the answer.
            self.store.read(lambda reader: check(reader, self.clock()))
        return self.store.read(lambda reader: self.read_memory_view(reader, memory_id, via_key_id))

    def confirm_memory(self, memory_id: object, evidence: object, *, namespace: object = None,
                       source: object = None, host: Host | None = None) -> ConfirmResult:
        memory_id = require_str(memory_id, "memory_id")
        kind = evidence_arg(evidence)
        if source is not None and not isinstance(source, dict):
            raise InvalidInput("source must be an object", field="source")
        ns = self.resolve_namespace(namespace)
        stamped = self.stamp("confirm_memory", host, source)
        confirmation = host.confirmation_id if host is not None else None

        def write(writer: Writer) -> ConfirmResult:
            now = self.clock()
            memory = self.active_memory(writer, memory_id, ns, now)
            if confirmation is not None and memory.last_confirmation_id == confirmation:
                return ConfirmResult(memory.id, confirmed=False, duplicate=True,
                                     validity=self.validity_of(memory))
            writer.confirm(memory.id, now=now, depth_step=CONFIRM_DEPTH, evidence=kind, source=stamped,
                           confirmation_id=confirmation)
            fresh = writer.memory(memory.id)
            assert fresh is not None
            return ConfirmResult(memory.id, confirmed=True, duplicate=False, validity=self.validity_of(fresh))

        return self.store.write(write)

    def dismiss(self, memory_id: object, key_id: object, *, namespace: object = None) -> DismissResult:
        """Weaken one key->memory link (never below the floor, never severed)."""
        memory_id = require_str(memory_id, "memory_id")
        key_id = require_str(key_id, "key_id")
        ns = self.resolve_namespace(namespace)
        weak = self.buffer.consume(key_id)

        def write(writer: Writer) -> DismissResult:
            now = self.clock()
            memory = writer.memory(memory_id)
            if memory is None or memory.expired(now) or (ns is not None and memory.namespace != ns):
                raise NotFound(f"Memory {memory_id} not found")
            previous = writer.link_weight(key_id, memory_id)
            if previous is None:
                raise NotFound(f"Key {key_id} is not linked to memory {memory_id}")
            weight = dismissed_weight(previous)
            writer.set_link_weight(key_id, memory_id, weight)
            cleared = writer.unsee_alias_candidate(key_id, normalize(weak.query)) if weak is not None else None
            concept = writer.key_concept(key_id)
            assert concept is not None  # the link exists, so does its key
            floored = weight <= LINK_MIN
            note = ("Link is at its floor -- it ranks last under this key but is never severed; the memory "
                    "stays reachable by its other keys." if floored else
                    "Link weakened. The memory is unchanged and still reachable by its other keys.")
            return DismissResult(memory_id=memory_id, key_id=key_id, concept=concept,
                                 link_weight=round(weight, 3), previous_link_weight=round(previous, 3),
                                 floored=floored, alias_candidate_cleared=cleared, note=note)

        return self.store.write(write)

    def hard_delete(self, writer: Writer, memory: Memory) -> str | None:
        """Hard-delete one memory; if it was a correction, its predecessor becomes active
        again (undo). Keys left without any link are deleted too. Returns the restored id."""
        predecessor = writer.predecessor_of(memory.id)
        affected = [memory.id] + ([predecessor] if predecessor is not None else [])
        with self.counting(writer, affected):
            return self._delete_counted(writer, memory)

    def _delete_counted(self, writer: Writer, memory: Memory) -> str | None:
        key_ids = writer.key_ids_of(memory.id)
        writer.unindex(memory.rowid)
        writer.delete_memory(memory.id)
        restored = writer.predecessor_of(memory.id)
        if restored is not None:
            writer.restore(restored)
            self.index_memory(writer, restored)
            blob, namespace = writer.memory_vector(restored)
            if blob is not None and vector_problem(blob, self.embedder.dim) is None:
                vec, code = vector_from(blob), self.namespace_code(namespace)
                writer.after_commit(lambda: self.bodies.upsert(restored, vec, code))
        for kid in key_ids:
            if not writer.has_links(kid):
                writer.delete_key(kid)
                writer.after_commit(functools.partial(self.keys.remove, kid))
            else:
                writer.after_commit(functools.partial(self.keys.add_links, kid, -1))
        memory_id = memory.id
        writer.after_commit(lambda: self.bodies.remove(memory_id))
        return restored

    def forget(self, memory_id: object, *, idempotency_key: IdempotencyKey | None = None) -> ForgetResult | Replayed:
        memory_id = require_str(memory_id, "memory_id")

        def write(writer: Writer) -> ForgetResult | Replayed:
            replay = self.replay(writer, idempotency_key)
            if replay is not None:
                return replay
            memory = writer.memory(memory_id)
            result = ForgetResult(deleted=False)
            if memory is not None:
                result = ForgetResult(deleted=True, restored=self.hard_delete(writer, memory))
            self.record(writer, idempotency_key, result)
            return result

        return self.store.write(write)
