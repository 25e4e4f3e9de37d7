"""Writing new memories: validating a request (``prepare``), ``remember`` and
``remember_batch``, resolving and linking keys (reuse, merge or create; translation pairs),
autokey's alias learning, the write hints, provenance stamps and idempotent replay."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import secrets
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine import autokey
from keymem_daemon.engine.freshness import parse_decay_profile
from keymem_daemon.engine.indexes import vector_bytes
from keymem_daemon.engine.keys import (
    FEW_KEYS_NOTE,
    KEY_TYPES,
    LANGUAGE_NOTE,
    PHRASE_NOTE,
    PHRASE_TOKENS,
    KeyInfo,
    KeyType,
    MemberState,
    PendingKey,
    conflicting_qualifiers,
    cross_script,
    language_uniform,
    sanitize_keys,
)
from keymem_daemon.engine.limits import MAX_TTL_SECONDS
from keymem_daemon.engine.links import LINK_DEFAULT
from keymem_daemon.engine.ports import KeyRow, MemoryRow, Reader, Writer
from keymem_daemon.engine.reads.browse import Browsing
from keymem_daemon.engine.records import (
    BatchItem,
    BatchResult,
    Hints,
    IdempotencyKey,
    KeyRef,
    NewMemory,
    Redacted,
    RememberResult,
    Replayed,
    dumps,
    render,
)
from keymem_daemon.engine.redact import redact
from keymem_daemon.engine.text import Analyzer, normalize, normalize_namespace, script_of
from keymem_daemon.engine.validate import parse_observed_at, related_arg, require_str
from keymem_daemon.engine.vectors import top_indices
from keymem_daemon.errors import IdempotencyKeyReused, InvalidInput, Refused

logger = logging.getLogger(__name__)

MAX_SOURCE_CHARS: Final = 4000
"""The provenance a caller may attach to a write (``source``), as JSON."""

MAX_STORED_SOURCE_CHARS: Final = MAX_SOURCE_CHARS + 1000
"""A stored ``source``: the caller's plus the stamp keymem adds (session, tool, time, host,
batch id: about 300 characters)."""

# write_hints: the nearest keys looked at for each key a write gave (the first not merged wins).
NEAR_KEY_CANDIDATES: Final = 20
# write_hints: fewer keys than this get FEW_KEYS_NOTE (a memory needs a few ways in).
FEW_KEYS: Final = 3
# The shortest query autokey learns from: a single character says too little.
MIN_ALIAS_CHARS: Final = 2

# A learned alias re-indexes the key's memories; a hub's beyond this many keep the old tokens
# until their next write (the write stays one short transaction).
ALIAS_REINDEX_LIMIT: Final = 5000


def new_id() -> str:
    return secrets.token_hex(6)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def dedup_hash(content: str) -> str:
    return hashlib.sha256(normalize(content).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Host:
    """Who is calling: the host agent, its session, its turn and cwd (from request headers)."""

    agent: str | None = None
    session: str | None = None
    turn: int | None = None
    cwd: str | None = None

    @property
    def confirmation_id(self) -> str | None:
        if self.agent and self.session:
            return f"{self.agent}:{self.session}:{self.turn if self.turn is not None else 0}"
        return None


@dataclass(slots=True)
class BatchKeys:
    """The keys one write transaction has resolved so far: those it created (not in the index
    until COMMIT), every key text it used, normalised, with the key it landed on, and the keys
    whose stored texts may differ from the index's (it changed them, or the index lacks them)."""

    pending: list[PendingKey] = dataclasses.field(default_factory=list)
    by_norm: dict[str, str] = dataclasses.field(default_factory=dict)
    unsure: set[str] = dataclasses.field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Embedded:
    keys: dict[str, npt.NDArray[np.float32]]
    body: npt.NDArray[np.float32]
    content_tokens: str
    # The loanwords the analyzer knew when it cut the text (``indexable``).
    vocabulary: frozenset[str]

    def indexable(self, analyzer: Analyzer) -> str | None:
        """The tokens, unless another request taught the analyzer a word since."""
        return self.content_tokens if self.vocabulary == analyzer.learned else None


class Remembering(Browsing):
    """The writes that create memories and keys."""

    def stamp(self, tool: str, host: Host | None, caller: Mapping[str, Any] | None,
              extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{session, tool, saved_at, [host_*], ...}``; the caller's own fields win."""
        source: dict[str, Any] = {"session": self.instance, "tool": tool, "saved_at": iso(self.clock())}
        if host is not None and host.agent and host.session:
            source.update(host_agent=host.agent, host_session=host.session, host_turn=host.turn or 0)
        if extra:
            source.update(extra)
        if caller:
            source.update(caller)
        return source

    def prepare(
        self,
        *,
        content: object,
        keys: object,
        key_types: object = None,
        namespace: object = None,
        ttl_seconds: object = None,
        decay_profile: object = None,
        related_to: object = None,
        source: object = None,
        observed_at: object = None,
        require_keys: bool = True,
    ) -> NewMemory:
        """Validate one write request; every failure names its field and changes nothing."""
        content = require_str(content, "content")
        if not content.strip():
            raise InvalidInput("content is empty", field="content")
        if len(content) > self.settings.max_content_chars:
            raise InvalidInput(
                f"content is {len(content)} characters; the limit is {self.settings.max_content_chars} "
                "(store the gist, or split it into several memories)", field="content")
        clean, found = redact(content)
        sanitized = sanitize_keys(keys) if keys is not None else None
        clean_keys = [redact(k)[0] for k in sanitized.keys] if sanitized is not None else []
        if require_keys and not clean_keys:
            raise Refused(
                "keys required: no usable key survived sanitizing (need 1+ CJK character, or 2+ "
                "visible characters otherwise). Nothing was saved -- a keyless memory can never be recalled.")
        types: dict[str, KeyType] = {}
        if key_types is not None:
            if isinstance(key_types, str):
                try:
                    key_types = json.loads(key_types)
                except json.JSONDecodeError:
                    raise InvalidInput("key_types is not a JSON object", field="key_types") from None
            if not isinstance(key_types, dict):
                raise InvalidInput("key_types must be an object mapping a key to its type", field="key_types")
            norms = {normalize(k): k for k in clean_keys}
            for name, kind in key_types.items():
                if kind not in KEY_TYPES:
                    raise InvalidInput(f"key_types[{name!r}] must be one of {', '.join(KEY_TYPES)}",
                                       field="key_types")
                target = norms.get(normalize(str(name)))
                if target is not None:
                    types[target] = kind
        ns = normalize_namespace(namespace if isinstance(namespace, str) else None)
        if namespace is not None and not isinstance(namespace, str):
            raise InvalidInput("namespace must be a string", field="namespace")
        ttl = None
        if ttl_seconds is not None:
            if isinstance(ttl_seconds, str):
                try:
                    ttl_seconds = float(ttl_seconds)
                except ValueError:
                    raise InvalidInput("ttl_seconds must be a number of seconds", field="ttl_seconds") from None
            if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float) \
                    or (isinstance(ttl_seconds, float) and not math.isfinite(ttl_seconds)):
                raise InvalidInput("ttl_seconds must be a finite number of seconds", field="ttl_seconds")
            # Compared as given: a huge int never passes through float (which would overflow).
            if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
                raise InvalidInput(
                    f"ttl_seconds must be more than 0 and at most {MAX_TTL_SECONDS} (100 years); omit it "
                    "for a memory that never expires", field="ttl_seconds")
            ttl = float(ttl_seconds)
        profile = parse_decay_profile(decay_profile)
        related = related_arg(related_to)
        if source is not None:
            if isinstance(source, str):
                try:
                    source = json.loads(source)
                except json.JSONDecodeError:
                    raise InvalidInput("source is not a JSON object", field="source") from None
            if not isinstance(source, dict):
                raise InvalidInput("source must be an object", field="source")
            if len(json.dumps(source)) > MAX_SOURCE_CHARS:
                raise InvalidInput(f"source is larger than {MAX_SOURCE_CHARS} characters", field="source")
        return NewMemory(
            content=clean, keys=clean_keys, key_types=types, namespace=ns, ttl_seconds=ttl,
            decay_profile=profile, related_to=related, source=source,
            observed_at=parse_observed_at(observed_at), redacted=[Redacted(r.kind, r.count) for r in found],
            dropped_keys=sanitized.dropped if sanitized is not None else [],
        )

    def remember(self, request: NewMemory, *, host: Host | None = None,
                 idempotency_key: IdempotencyKey | None = None) -> RememberResult | Replayed:
        prepared = self.embed_request(request)
        source = self.stamp("remember", host, request.source)

        def write(writer: Writer) -> RememberResult | Replayed:
            replay = self.replay(writer, idempotency_key)
            if replay is not None:
                return replay
            saved, deduplicated, refs = self._store_memory(writer, request, prepared, source)
            result = RememberResult(
                saved=saved,
                deduplicated=True if deduplicated else None,
                note=(f"Identical memory already existed (id: {saved}) -- linked your keys to it and "
                      "counted it as confirmed instead of storing a duplicate.") if deduplicated else None,
                redacted=request.redacted or None,
                dropped_keys=request.dropped_keys or None,
                keys=refs,
            )
            self.record(writer, idempotency_key, result)
            return result

        result = self.store.write(write)
        saved = result.result.get("saved") if isinstance(result, Replayed) else result.saved
        # Hints are read-only advice computed after the commit, so a replayed write (the shim's
        # retry after a daemon restart) gets them too, from the graph as it is now. A new
        # memory's keys are the ones just linked; a twin's or a replay's are read.
        linked = ({ref.key_id for ref in result.keys or []}
                  if isinstance(result, RememberResult) and not result.deduplicated
                  else None)
        hints = self.write_hints(saved, request.keys, linked) if isinstance(saved, str) else None
        if hints is None:
            return result
        if isinstance(result, Replayed):
            return Replayed({**result.result, "hints": render(hints)})
        return dataclasses.replace(result, hints=hints)

    def remember_batch(self, items: Sequence[NewMemory | InvalidInput], *, host: Host | None = None,
                       idempotency_key: IdempotencyKey | None = None) -> BatchResult | Replayed:
        """Store every valid item in one transaction; an invalid item is reported, not stored."""
        batch_id = str(uuid.uuid4()) if len(items) > 1 else None
        prepared = [None if isinstance(i, InvalidInput) else self.embed_request(i) for i in items]

        def write(writer: Writer) -> BatchResult | Replayed:
            replay = self.replay(writer, idempotency_key)
            if replay is not None:
                return replay
            out: list[BatchItem] = []
            # Keys an earlier item created are not in the index before COMMIT: share them.
            batch_keys = BatchKeys()
            for index, (item, vectors) in enumerate(zip(items, prepared, strict=True)):
                if isinstance(item, InvalidInput) or vectors is None:
                    error = item if isinstance(item, InvalidInput) else InvalidInput("invalid item")
                    out.append(BatchItem(index=index, error=error.message, field=error.field))
                    continue
                source = self.stamp("remember_batch", host, item.source,
                                    {"batch_id": batch_id} if batch_id else None)
                try:
                    saved, dedup, _ = self._store_memory(writer, item, vectors, source, batch_keys)
                except InvalidInput as exc:
                    # Raised before the item wrote anything (its references are checked first).
                    out.append(BatchItem(index=index, error=exc.message, field=exc.field))
                    continue
                out.append(BatchItem(index=index, saved=saved, deduplicated=dedup,
                                     redacted=item.redacted or None))
            ok = sum(1 for i in out if i.saved)
            result = BatchResult(saved=ok, failed=len(out) - ok, items=out, batch_id=batch_id if ok else None)
            self.record(writer, idempotency_key, result)
            return result

        return self.store.write(write)

    def replay(self, reader: Reader, idempotency: IdempotencyKey | None) -> Replayed | None:
        """The stored answer of the request this key first came with; the same key on a
        different request is refused (replaying would drop that request silently)."""
        if idempotency is None:
            return None
        found = reader.idempotent_result(idempotency.key)
        if found is None:
            return None
        answer, fingerprint = found
        # A row recorded before fingerprints were stored (NULL) can only be replayed.
        if fingerprint is not None and fingerprint != idempotency.fingerprint:
            raise IdempotencyKeyReused(
                f"Idempotency-Key {idempotency.key[:80]!r} was already used for a different request "
                "(another tool or other arguments); nothing was done. Send a fresh key with every "
                "new request and reuse a key only to retry exactly the same call.")
        return Replayed(answer)

    def record(self, writer: Writer, idempotency: IdempotencyKey | None, result: object) -> None:
        if idempotency is not None:
            writer.record_idempotent(idempotency.key, dumps(result), self.clock(), idempotency.fingerprint)

    def embed_request(self, request: NewMemory) -> Embedded:
        # Before the text is cut: a loanword its keys teach is read whole from now on.
        self.analyzer.learn(self.analyzer.loanwords(request.keys, request.content))
        vocabulary = self.analyzer.learned
        texts = [*request.keys, request.content]
        vectors = self.embedder.embed(texts)
        tokens = " ".join(self.analyzer.index_tokens(request.content))
        return Embedded(dict(zip(request.keys, vectors[:-1], strict=True)), vectors[-1], tokens,
                                    vocabulary)

    def _store_memory(self, writer: Writer, request: NewMemory, vectors: Embedded,
                      source: dict[str, Any], batch: BatchKeys | None = None) -> tuple[str, bool, list[KeyRef]]:
        """Insert one memory (or fold it into its identical twin) with its keys and links."""
        batch = batch if batch is not None else BatchKeys()
        self.sync_vocabulary(writer)
        now = self.clock()
        self.check_related(writer, request.related_to, now)
        digest = dedup_hash(request.content)
        expires = None if request.ttl_seconds is None else now + request.ttl_seconds
        twin = writer.active_twin(request.namespace, digest, now)
        if twin is not None:
            with self.counting(writer, [twin]):
                writer.fold_into_twin(twin, now=now, source=source, expires_at=expires)
                refs = self.link_keys(writer, twin, request.keys, request.key_types, vectors.keys, batch=batch)
            writer.add_relations(twin, request.related_to)
            self.reindex_keys_of(writer, [twin])
            return twin, True, refs
        memory_id = new_id()
        writer.insert_memory(MemoryRow(
            id=memory_id, content=request.content, dedup_hash=digest, namespace=request.namespace, at=now,
            observed_at=request.observed_at, decay_profile=request.decay_profile, source=source,
            expires_at=expires, vector=vector_bytes(vectors.body)))
        refs = self.link_keys(writer, memory_id, request.keys, request.key_types, vectors.keys, batch=batch,
                              fresh=True)
        # A new memory counts from nothing to what was just written (``counting`` would read
        # both states back: on a shared store, a read of the links every other write conflicts with).
        state = MemberState(request.namespace, tuple(sorted({ref.key_id for ref in refs})), expires)
        writer.after_commit(functools.partial(self.counts.apply, memory_id, None, state))
        writer.add_relations(memory_id, request.related_to)
        self.index_memory(writer, memory_id, vectors.indexable(self.analyzer),
                          self._likely_key_texts([ref.key_id for ref in refs], batch))
        body, code = vectors.body, self.namespace_code(request.namespace)
        writer.after_commit(lambda: self.bodies.upsert(memory_id, body, code))
        return memory_id, False, refs

    def _likely_key_texts(self, key_ids: Sequence[str], batch: BatchKeys) -> list[str] | None:
        """The key texts of a memory linked to ``key_ids`` (``key_texts_of``), as this write
        knows them without reading: a key it created has its text alone, one the index holds
        that the write left unchanged has the index's text and aliases. None when the write
        changed a key's texts, or the index lacks the key."""
        created = {p.id: p.concept for p in batch.pending}
        texts: list[str] = []
        for key_id in sorted(key_ids):  # key order, as SQLite reads them
            info = self.keys.get(key_id)
            if key_id in batch.unsure:
                return None
            if key_id in created:
                texts.append(created[key_id])
            elif info is None:
                return None
            else:
                texts.extend([info.concept, *info.aliases])
        return texts

    def check_related(self, reader: Reader, related: Sequence[str], now: float) -> None:
        if not related:
            return
        found = reader.memories(related)
        missing = [r for r in related if r not in found or not found[r].active(now)]
        if missing:
            raise InvalidInput(f"related_to names unknown or inactive memories: {', '.join(missing[:5])}",
                               field="related_to")

    def link_keys(self, writer: Writer, memory_id: str, keys: Sequence[str], key_types: Mapping[str, KeyType],
                   vectors: Mapping[str, npt.NDArray[np.float32]], weight: float = LINK_DEFAULT,
                   auto: bool = False, batch: BatchKeys | None = None, fresh: bool = False) -> list[KeyRef]:
        """Resolve each key (reuse, merge or create) and link it to the memory. ``batch``:
        the keys earlier writes of the same transaction resolved, which the index does not
        hold before COMMIT; ``fresh``: the memory was inserted in this transaction."""
        batch = batch if batch is not None else BatchKeys()
        pending = batch.pending
        touched: set[str] = set()
        linked: list[str] = []
        pairs = self._translation_pairs(keys, key_types, vectors)
        near = dict(zip(keys, self.keys.neighbours_of(np.stack([vectors[k] for k in keys]), self.profile),
                        strict=True)) if keys else {}
        # A shared store is asked about every key text the index does not hold, in one read:
        # another daemon may have made such a key since this one's index was last in step (and
        # the read makes a concurrent creation of it conflict, so one of the two runs again and
        # finds it). A store this daemon alone writes holds no key its index does not know.
        asked = sorted({normalize(k) for k in keys if self.keys.by_norm(normalize(k)) is None
                        and normalize(k) not in batch.by_norm}) if self.store.shared else []
        stored_ids = writer.keys_named(asked) if asked else {}
        # The keys this call creates, as they will be stored: no read back after the links
        # (dropped when a later key of the call changes one: it is read back then).
        created: dict[str, KeyInfo] = {}
        resolved: dict[str, str] = {}
        for key in keys:
            kind = key_types.get(key, "concept")
            partner = pairs.get(key)
            earlier = batch.by_norm.get(normalize(key))
            if earlier is not None:
                key_id = earlier
                touched.add(key_id)
                created.pop(key_id, None)
            elif partner is not None and partner in resolved and self.keys.by_norm(normalize(key)) is None \
                    and not any(normalize(p.concept) == normalize(key) for p in pending):
                key_id = resolved[partner]
                self._add_alias(writer, key_id, key, learned=False)
                touched.add(key_id)
                created.pop(key_id, None)
            else:
                match = self.keys.resolve(key, kind, vectors[key], self.profile, pending, near[key])
                norm = normalize(key)
                stored = None
                if match.key_id is None and self.store.shared:
                    # (Asked one by one only if the index lost the key's text since ``asked``.)
                    stored = stored_ids.get(norm) if norm in asked else writer.key_named(new_id(), norm)
                if stored is not None:
                    key_id = stored
                elif match.key_id is None:
                    key_id = new_id()
                    compact = self.analyzer.compact(key)
                    writer.insert_key(KeyRow(
                        id=key_id, concept=key, norm=norm, compact=compact,
                        key_type=kind, vector=vector_bytes(vectors[key]), created_at=self.clock()))
                    pending.append(PendingKey(key_id, key, kind, vectors[key]))
                    created[key_id] = KeyInfo(id=key_id, concept=key, key_type=kind, compact=compact, link_count=1)
                else:
                    created.pop(match.key_id, None)
                    key_id = match.key_id
                    if match.promote_to is not None:
                        writer.set_key_type(key_id, match.promote_to)
                    if match.add_alias:
                        self._add_alias(writer, key_id, key, learned=False)
                # A key the index knows, unchanged, is not read back: its link count follows by
                # delta. The read counts all the key's links, so on a shared store every two
                # concurrent writes linking one popular key would conflict, and all but one
                # run again.
                if key_id != match.key_id or match.promote_to is not None or match.add_alias:
                    touched.add(key_id)
            resolved[key] = key_id
            batch.by_norm[normalize(key)] = key_id
            if key_id not in linked:
                linked.append(key_id)
        batch.unsure.update(touched - created.keys())
        if fresh:
            # A memory inserted in this transaction has no links yet: every one is new, and the
            # store is not asked which (on a server the links go out with the next read).
            writer.add_links([(kid, memory_id, weight, auto) for kid in linked])
            new_links = linked
        else:
            new_links = writer.link_all(linked, memory_id, weight, auto)
        read_back = writer.key_rows(sorted(touched - created.keys())) if touched - created.keys() else {}
        infos = {kid: created[kid] if kid in created else read_back[kid][0] for kid in touched}
        vectors_of = {p.id: p.vector for p in pending}

        made = set(new_links)

        def apply() -> None:
            for kid, info in infos.items():
                if kid in created:
                    self.keys.put_created(info, vectors_of[kid])
                else:
                    self.keys.put_written(info, 1 if kid in made else 0, vectors_of.get(kid))

        writer.after_commit(apply)
        # The keys above carry their link counts; the others' move by delta.
        for kid in new_links:
            if kid not in touched:
                writer.after_commit(functools.partial(self.keys.add_links, kid, 1))
        return [KeyRef(concept=infos[k].concept if k in infos else self.concept(k), key_id=k) for k in linked]

    def _translation_pairs(self, keys: Sequence[str], key_types: Mapping[str, KeyType],
                           vectors: Mapping[str, npt.NDArray[np.float32]]) -> dict[str, str]:
        """Hangul and Latin concept keys of one write that are each other's closest
        cross-script key are taken as one concept in two languages (partner -> earlier key)."""
        concepts = [k for k in keys if key_types.get(k, "concept") == "concept"]
        hangul = [k for k in concepts if script_of(k) == "hangul"]
        latin = [k for k in concepts if script_of(k) == "latin"]
        if not hangul or not latin:
            return {}
        sims = np.stack([vectors[h] for h in hangul]) @ np.stack([vectors[w] for w in latin]).T
        pairs: dict[str, str] = {}
        order = {k: i for i, k in enumerate(keys)}
        for i, h in enumerate(hangul):
            j = int(np.argmax(sims[i]))
            if int(np.argmax(sims[:, j])) == i and sims[i, j] >= self.profile.translation_pair \
                    and not conflicting_qualifiers(h, latin[j]):
                first, second = sorted((h, latin[j]), key=order.__getitem__)
                pairs[second] = first
        return pairs

    def _add_alias(self, writer: Writer, key_id: str, alias: str, *, learned: bool) -> bool:
        concept = writer.key_concept(key_id)
        if concept is None or normalize(concept) == normalize(alias) or len(alias.strip()) < 1:
            return False
        return writer.add_alias(key_id, alias, norm=normalize(alias), compact=self.analyzer.compact(alias),
                                learned=learned, added_at=self.clock())

    def learn_alias(self, writer: Writer, key_id: str, memory_id: str, query: str, score: float,
                     query_vector: npt.NDArray[np.float32]) -> None:
        """Autokey: one more confirmation that ``query`` means this key; promote at N."""
        now = self.clock()
        text = query.strip()
        info = self.keys.get(key_id)
        if info is None or len(text) < MIN_ALIAS_CHARS:
            return
        norm = normalize(text)
        if norm == normalize(info.concept) or norm in {normalize(a) for a in info.aliases}:
            return
        count = writer.see_alias_candidate(key_id, norm, text, now)
        learned = writer.learned_alias_count(key_id)
        decision = autokey.decide_promotion(count, text, score, learned, self.promotion)
        if decision == "none":
            return
        writer.drop_alias_candidate(key_id, norm)
        if decision == "alias":
            if self._add_alias(writer, key_id, text, learned=True):
                logger.info("autokey: learned an alias for key %s", key_id)
                fresh = writer.key_info(key_id)
                writer.after_commit(lambda: self.keys.put_written(fresh, 0))
                self.reindex_keys_of(writer, writer.memories_linked_to([key_id], limit=ALIAS_REINDEX_LIMIT))
        else:
            with self.counting(writer, [memory_id]):
                self.link_keys(writer, memory_id, [text], {}, {text: query_vector})
            self.reindex_keys_of(writer, [memory_id])
            logger.info("autokey: promoted a confirmed query to a key on memory %s", memory_id)

    def count_alias_hits(self, key_alias_pairs: Iterable[tuple[str, str]]) -> None:
        """A learned alias that matched a query literally earns a hit (kept from pruning)."""
        pairs = [(kid, normalize(alias)) for kid, alias in key_alias_pairs]
        if pairs:
            self.store.write(lambda writer: writer.count_alias_hits(pairs))

    def write_hints(self, memory_id: str, provided: Sequence[str], linked: set[str] | None = None) -> Hints | None:
        """Near-duplicate keys, missing-language and phrase-key advice (read-only); ``linked``:
        the memory's keys, when the caller knows them."""
        if linked is None:
            linked = set(self.store.read(lambda reader: reader.key_ids_of(memory_id)))
        provided_norms = {normalize(k) for k in provided}
        mine: list[tuple[KeyInfo, npt.NDArray[np.float32]]] = []
        for key_id in linked:
            info, vector = self.keys.get(key_id), self.keys.vectors.get(key_id)
            if info is not None and vector is not None and normalize(info.concept) in provided_norms:
                mine.append((info, vector))
        near: list[dict[str, Any]] = []
        snap = self.keys.snapshot()
        if mine and snap.ids:
            all_sims = snap.similarities(np.stack([vector for _, vector in mine]))
            for (info, _), sims in zip(mine, all_sims, strict=True):
                for row in top_indices(sims, NEAR_KEY_CANDIDATES):
                    other, sim = self.keys.get(snap.ids[row]), float(sims[row])
                    if other is None or other.id in linked or other.is_entity:
                        continue
                    merge_at = (self.profile.cross_script_merge if cross_script(info.concept, other.concept)
                                else self.profile.short_key_merge)
                    if self.profile.key_recall <= sim < merge_at:
                        near.append({"your_key": info.concept, "existing_concept": other.concept,
                                     "key_id": other.id, "similarity": round(sim, 3)})
                        break
        phrases = [k for k in provided if len(k.split()) >= PHRASE_TOKENS]
        language = LANGUAGE_NOTE if provided and language_uniform(provided) else None
        few = FEW_KEYS_NOTE if len(provided) < FEW_KEYS else None
        if not near and language is None and not phrases and few is None:
            return None
        return Hints(near_keys=near, language_note=language, phrase_keys=phrases or None,
                     phrase_note=PHRASE_NOTE if phrases else None, few_keys_note=few)
