"""Keeping the store sound: the hourly ``cleanup_expired``, and what opening a store repairs
(re-embedding for a new model, merging duplicate keys)."""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping
from typing import Final

from keymem_daemon.engine.indexes import vector_bytes
from keymem_daemon.engine.limits import IDEMPOTENCY_TTL_SECONDS
from keymem_daemon.engine.ports import Writer
from keymem_daemon.engine.records import CleanupResult
from keymem_daemon.engine.writes.versions import Versions
from keymem_daemon.errors import StoreError

logger = logging.getLogger(__name__)

# The fingerprint of a store whose re-embedding for a new model has begun but not ended.
PARTIAL: Final = "partial:"

# The meta rows of a re-embedding in progress (``reembed_keys_done``: the last rowid done).
REEMBED_META: Final = "reembed_"

# Texts embedded per re-embedding transaction: a batch the model runs efficiently, and a chunk
# small enough that a kill loses seconds of work, not minutes.
REEMBED_CHUNK: Final = 256



class Maintenance(Versions):
    """Cleanup and the repairs of opening a store."""

    def cleanup_expired(self) -> CleanupResult:
        """Delete expired memories, prune never-used learned aliases and stale candidates."""

        def write(writer: Writer) -> CleanupResult:
            now = self.clock()
            expired = writer.expired_memories(now)
            keys_before = writer.key_count()
            for memory in expired:
                if writer.memory(memory.id) is not None:
                    self.hard_delete(writer, memory)
            cutoff = now - self.settings.autokey_prune_age
            stale = writer.stale_learned_aliases(cutoff)
            writer.delete_aliases(stale)
            for kid in {kid for kid, _ in stale}:
                if writer.key_concept(kid) is not None:
                    info = writer.key_info(kid)
                    writer.after_commit(functools.partial(self.keys.put_written, info, 0))
                    # The pruned alias was indexed with the key's memories: take it out.
                    self.reindex_keys_of(writer, writer.memories_linked_to([kid]))
            candidates = writer.prune_alias_candidates(cutoff)
            writer.prune_idempotency(now - IDEMPOTENCY_TTL_SECONDS)
            keys_after = writer.key_count()
            return CleanupResult(deleted=len(expired), pruned_aliases=len(stale),
                                 pruned_candidates=candidates, pruned_keys=keys_before - keys_after)

        result = self.store.write(write)
        if result.deleted or result.pruned_aliases or result.pruned_candidates:
            logger.info("cleanup: %d expired memories deleted, %d learned aliases and %d candidates pruned",
                        result.deleted, result.pruned_aliases, result.pruned_candidates)
        return result

    def merge_duplicate_keys(self) -> None:
        """One-time repair: keys with the same normalised text become one. Before
        ``remember_batch`` resolved keys against those its own earlier items created, a batch
        whose items shared a new key made one key per item. The oldest key stays; the others'
        links (the stronger weight wins), aliases and alias candidates move to it."""
        groups = self.store.read(lambda reader: reader.duplicate_key_norms())
        if not groups:
            return

        def merge(writer: Writer) -> tuple[int, int]:
            merged = 0
            memories: set[str] = set()
            for norm in groups:
                removed, relinked = writer.merge_keys_named(norm)
                merged += removed
                memories |= relinked
            self.reindex_keys_of(writer, sorted(memories))
            return merged, len(memories)

        merged, relinked = self.store.write(merge)
        note = (f"merged {merged} duplicate key(s) into {len(groups)} (keys with the same text, as remember_batch "
                f"made them before it shared new keys between its items); {relinked} memories relinked")
        logger.warning("%s", note)
        self.repairs.append(note)

    def ensure_embedding_space(self, progress: Callable[[str, int, int], None] | None) -> None:
        """Stamp a new store with the embedder's fingerprint; re-embed when it changed."""
        stored = self.store.read(lambda reader: reader.meta())
        fingerprint = stored.get("embedder_fingerprint")
        if fingerprint == self.embedder.fingerprint:
            return
        count = self.store.read(lambda reader: reader.key_count())
        if fingerprint is not None and count:
            if self.store.shared:
                # Its key vectors are every daemon's: re-embedding them for one daemon's model
                # would leave the others comparing their queries with another model's vectors.
                raise StoreError(
                    f"the shared store is embedded with {fingerprint.removeprefix(PARTIAL)} but this daemon's "
                    f"embedder is {self.embedder.fingerprint}; every daemon of a team must use the same "
                    "embedder (KEYMEM_EMBED_MODEL): switch this one back"
                )
            if not self.settings.auto_migrate:
                was = (f"half re-embedded for {fingerprint.removeprefix(PARTIAL)}"
                       if fingerprint.startswith(PARTIAL) else f"embedded with {fingerprint}")
                raise StoreError(
                    f"the store was {was} but the embedder is now "
                    f"{self.embedder.fingerprint}; set KEYMEM_AUTO_MIGRATE=true to re-embed its "
                    f"{count} keys once (a backup is taken first), or switch the model back"
                )
            self._reembed(fingerprint, stored, progress)

        def stamp(writer: Writer) -> None:
            writer.set_meta({"embedder_fingerprint": self.embedder.fingerprint,
                             "embedder_dim": str(self.embedder.dim)})
            writer.delete_meta_prefixed(REEMBED_META)

        self.store.write(stamp)

    def _reembed(self, old: str, stored: Mapping[str, str],
                 progress: Callable[[str, int, int], None] | None) -> None:
        """Embed every key and memory body again, a chunk per transaction. Before the first
        chunk the store is marked as half re-embedded (``PARTIAL`` + the new fingerprint), so
        a start that is interrupted -- a kill, a crash -- is never taken for a store in one
        embedding space: the next start with the same model resumes after the last chunk
        written, and one with any other model (the old one too) embeds everything again."""
        fingerprint = self.embedder.fingerprint
        done_at = {kind: int(stored.get(f"{REEMBED_META}{kind}_done", "0")) for kind in ("keys", "memories")}
        if old == PARTIAL + fingerprint:
            logger.info("resuming the re-embedding for %s where it stopped", fingerprint)
        else:
            done_at = dict.fromkeys(done_at, 0)
            tag = re.sub(r"[^A-Za-z0-9._-]", "_", old)
            backup = self.settings.backup_dir / f"keymem-before-reembed-{tag}-{int(self.clock())}.db"
            self.store.backup_to(backup)
            logger.info("embedder changed (%s -> %s): backed up to %s, re-embedding", old, fingerprint, backup)
            self.store.write(lambda writer: writer.set_meta({
                "embedder_fingerprint": PARTIAL + fingerprint, f"{REEMBED_META}keys_done": "0",
                f"{REEMBED_META}memories_done": "0"}))

        work = {
            "keys": self.store.read(lambda reader: reader.keys_after(done_at["keys"])),
            "memories": self.store.read(lambda reader: reader.vectors_after(done_at["memories"])),
        }
        total = sum(len(rows) for rows in work.values())
        done = 0
        for kind, rows in work.items():
            for start in range(0, len(rows), REEMBED_CHUNK):
                chunk = rows[start:start + REEMBED_CHUNK]
                vectors = self.embedder.embed([r[2] for r in chunk])
                pairs = [(vector_bytes(v), r[1]) for r, v in zip(chunk, vectors, strict=True)]

                def update(writer: Writer, pairs: list[tuple[bytes, str]] = pairs, kind: str = kind,
                           last: int = chunk[-1][0]) -> None:
                    if kind == "keys":
                        writer.set_key_vectors(pairs)
                    else:
                        writer.set_memory_vectors(pairs)
                    writer.set_meta({f"{REEMBED_META}{kind}_done": str(last)})

                self.store.write(update)
                done += len(chunk)
                if progress is not None:
                    progress(kind, done, total)
            logger.info("re-embedded %d %s", len(rows), kind)
