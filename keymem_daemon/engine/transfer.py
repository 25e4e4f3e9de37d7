"""Export and import: the whole store as one lossless JSON document, and upstream
keymem's ``graph.json``.

An export lists keys (with aliases), memories (every field, history included), links,
explicit relations and pending alias candidates, sorted by id, so exporting, wiping and
importing gives the same document back. Vectors are left out unless asked for: they are a
function of the text and the embedder, and importing re-embeds whatever is missing.

An import is validated as a whole before anything is written, then written in one
transaction: a bad record names its place (``memories[12].namespace``) and changes nothing.
Every record meets the limits a tool call meets (content length, key length, provenance
size), and every vector it brings must be one of this embedder's (size, finite, unit
length): a malformed one would make the running daemon answer nonsense and the next start
fail.
Records whose id already exists are skipped (a merge); an imported key whose text equals
an existing key's lands on that key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from keymem_daemon.engine.freshness import DECAY_PROFILES
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.indexes import vector_bytes, vector_problem
from keymem_daemon.engine.keys import KEY_TYPES, MAX_KEY_CHARS
from keymem_daemon.engine.ports import Reader, Writer
from keymem_daemon.engine.text import normalize, normalize_namespace
from keymem_daemon.engine.writes.remember import MAX_STORED_SOURCE_CHARS, dedup_hash
from keymem_daemon.errors import InvalidInput, KeymemError, StoreError

logger = logging.getLogger(__name__)

FORMAT: Final = "keymem-export"
VERSION: Final = 1
EMBED_BATCH: Final = 256
EMBED_BATCH_CHARS: Final = 64_000
"""Characters of text per embedding call as well: the embedder serves one call at a time, so
a chunk of long texts (each capped at ``EMBED_MAX_CHARS``) must not hold up other writes for
long -- 32 capped texts of unbroken letters take about 4 s on a loaded core (measured)."""
MAX_COUNT: Final = 2**53
"""Largest count an import may carry (JSON's exact integers; SQLite's INTEGER holds more)."""
MAX_TIME: Final = 253_402_300_799.0
"""The last second datetime can show (9999-12-31T23:59:59Z): a later timestamp would break
every answer that renders it."""
LISTED_PROBLEMS: Final = 5
"""How many over-limit records one refusal names."""

Progress = Callable[[str, int, int], None]

def _b64(blob: bytes | None) -> str | None:
    return None if blob is None else base64.b64encode(blob).decode()


def export(graph: MemoryGraph, *, include_vectors: bool = False) -> dict[str, Any]:
    def read(reader: Reader) -> tuple[int, dict[str, list[dict[str, Any]]]]:
        return reader.schema_version(), reader.export_rows(include_vectors=include_vectors)

    schema, body = graph.store.read(read)
    if include_vectors:
        for item in (*body["keys"], *body["memories"]):
            item["vector"] = _b64(item["vector"])
    return {"format": FORMAT, "version": VERSION, "schema": schema,
            "embedder": graph.embedder.fingerprint, **body}


# -- validation -------------------------------------------------------------------------


class _Check:
    """Field checks that name the record and field on failure."""

    def __init__(self, where: str, record: object) -> None:
        if not isinstance(record, Mapping):
            raise InvalidInput(f"{where} must be an object", field=where)
        self.where = where
        self.record = record

    def fail(self, name: str, what: str) -> InvalidInput:
        return InvalidInput(f"{self.where}.{name} {what}", field=f"{self.where}.{name}")

    def text(self, name: str, *, optional: bool = False, nonempty: bool = True) -> str | None:
        value = self.record.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, str) or (nonempty and not value.strip()):
            raise self.fail(name, "must be a non-empty string")
        return value

    def number(self, name: str, *, optional: bool = False, default: float | None = None,
               low: float = -math.inf, high: float = math.inf) -> float | None:
        """A finite number within ``[low, high]``."""
        value = self.record.get(name)
        if value is None:
            if optional:
                return default
            raise self.fail(name, "is required")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(name, "must be a finite number")
        if not low <= value <= high:
            raise self.fail(name, f"must be within [{low}, {high}]")
        return float(value)

    def count(self, name: str, *, default: int, low: int = 0) -> int:
        return int(self.number(name, optional=True, default=default, low=low, high=MAX_COUNT) or 0)

    def time(self, name: str, *, optional: bool = True, default: float | None = None) -> float | None:
        return self.number(name, optional=optional, default=default, low=0.0, high=MAX_TIME)

    def obj(self, name: str) -> dict[str, Any] | None:
        value = self.record.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, "must be an object or null")
        return value

    def vector(self) -> str | None:
        value = self.record.get("vector")
        if value is not None and not isinstance(value, str):
            raise self.fail("vector", "must be a base64 string of float32 values, or null")
        return value


class _Limits:
    """The limits of a tool call, applied to every imported record; all the records over
    them are named in one refusal."""

    def __init__(self) -> None:
        self.problems: list[InvalidInput] = []

    def length(self, where: str, name: str, value: str | None, limit: int, setting: str) -> None:
        if value is not None and len(value) > limit:
            self.problems.append(InvalidInput(
                f"{where}.{name} is {len(value)} characters; the limit is {limit} ({setting})",
                field=f"{where}.{name}"))

    def source(self, where: str, name: str, value: dict[str, Any] | None) -> None:
        self.length(where, name, json.dumps(value) if value is not None else None, MAX_STORED_SOURCE_CHARS,
                    "as JSON")

    def check(self) -> None:
        if not self.problems:
            return
        first = self.problems[0]
        shown = "; ".join(p.message for p in self.problems[:LISTED_PROBLEMS])
        more = len(self.problems) - LISTED_PROBLEMS
        raise InvalidInput(f"{len(self.problems)} record(s) are over the limits a tool call has, so nothing was "
                           f"imported: {shown}{f'; and {more} more' if more > 0 else ''}", field=first.field)


@dataclass(slots=True)
class _Plan:
    keys: list[dict[str, Any]]
    memories: list[dict[str, Any]]
    links: list[dict[str, Any]]
    relations: list[tuple[str, str]]
    candidates: list[dict[str, Any]]


def _from_upstream(data: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream keymem ``graph.json`` -> this module's export shape."""
    keys_in = data.get("keys")
    memories_in = data.get("memories")
    if not isinstance(keys_in, Mapping) or not isinstance(memories_in, Mapping):
        raise InvalidInput("graph.json must have objects `keys` and `memories`", field="keys")
    keys = []
    for kid, k in keys_in.items():
        if not isinstance(k, Mapping):
            raise InvalidInput(f"keys.{kid} must be an object", field=f"keys.{kid}")
        learned = {a.get("alias"): a for a in (k.get("learnedAliases") or []) if isinstance(a, Mapping)}
        aliases = []
        for alias in k.get("aliases") or []:
            if isinstance(alias, str):
                info = learned.get(alias)
                aliases.append({"alias": alias, "learned": info is not None,
                                "added_at": (info or {}).get("addedAt"), "hits": (info or {}).get("hits", 0)})
        keys.append({"id": k.get("id", kid), "concept": k.get("concept"), "key_type": k.get("key_type", "concept"),
                     "aliases": aliases})
    memories: list[dict[str, Any]] = []
    relations: list[dict[str, Any]] = []
    superseded_by = {m.get("supersedes"): mid for mid, m in memories_in.items()
                     if isinstance(m, Mapping) and m.get("supersedes")}
    for mid, m in memories_in.items():
        if not isinstance(m, Mapping):
            raise InvalidInput(f"memories.{mid} must be an object", field=f"memories.{mid}")
        memories.append({
            "id": m.get("id", mid), "content": m.get("content"), "namespace": m.get("namespace") or "default",
            "depth": m.get("depth", 0.0), "access_count": m.get("access_count", 0),
            "created_at": m.get("created_at"), "last_accessed": m.get("last_accessed") or None,
            "last_confirmed_at": m.get("last_confirmed_at"), "confirmation_count": m.get("confirmation_count"),
            "decay_profile": m.get("decay_profile"),
            "last_confirmation_evidence": m.get("last_confirmation_evidence"),
            "last_confirmation_source": m.get("last_confirmation_source"),
            "last_confirmation_id": m.get("last_confirmation_id"),
            "expires_at": m.get("ttl"), "supersedes": m.get("supersedes"),
            "superseded_by": superseded_by.get(m.get("id", mid)), "source": m.get("source"),
        })
        relations.extend({"from": m.get("id", mid), "to": t} for t in m.get("links") or [] if isinstance(t, str))
    links = [{"key_id": link.get("key_id"), "memory_id": link.get("memory_id"), "weight": link.get("weight", 1.0),
              "auto": bool(link.get("auto"))} for link in data.get("links") or [] if isinstance(link, Mapping)]
    return {"format": "upstream-graph", "keys": keys, "memories": memories, "links": links,
            "relations": relations, "alias_candidates": []}


def _validate(data: Mapping[str, Any], now: float, *, max_content_chars: int) -> _Plan:
    for name in ("keys", "memories", "links"):
        if not isinstance(data.get(name), list):
            raise InvalidInput(f"`{name}` must be an array", field=name)
    limits = _Limits()
    keys, memories, links = [], [], []
    seen_keys: set[str] = set()
    for i, raw in enumerate(data["keys"]):
        c = _Check(f"keys[{i}]", raw)
        kid = c.text("id")
        assert kid is not None
        if kid in seen_keys:
            raise c.fail("id", f"repeats key id {kid!r}")
        seen_keys.add(kid)
        kind = raw.get("key_type") or "concept"
        if kind not in KEY_TYPES:
            raise c.fail("key_type", f"must be one of {', '.join(KEY_TYPES)}")
        aliases = []
        for j, alias in enumerate(raw.get("aliases") or []):
            a = _Check(f"keys[{i}].aliases[{j}]", alias if isinstance(alias, Mapping) else {"alias": alias})
            alias_text = a.text("alias")
            limits.length(a.where, "alias", alias_text, MAX_KEY_CHARS, "as for a key")
            aliases.append({"alias": alias_text, "learned": bool(a.record.get("learned")),
                            "added_at": a.time("added_at", default=now), "hits": a.count("hits", default=0)})
        concept = c.text("concept")
        limits.length(c.where, "concept", concept, MAX_KEY_CHARS, "as for remember's keys")
        keys.append({"id": kid, "concept": concept, "key_type": kind,
                     "created_at": c.time("created_at", default=now), "aliases": aliases, "vector": c.vector()})
    seen_memories: set[str] = set()
    for i, raw in enumerate(data["memories"]):
        c = _Check(f"memories[{i}]", raw)
        mid = c.text("id")
        assert mid is not None
        if mid in seen_memories:
            raise c.fail("id", f"repeats memory id {mid!r}")
        seen_memories.add(mid)
        created = c.time("created_at", default=now)
        profile = raw.get("decay_profile") or "standard"
        if profile not in DECAY_PROFILES:
            raise c.fail("decay_profile", f"must be one of {', '.join(DECAY_PROFILES)}")
        namespace = raw.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise c.fail("namespace", "must be a string")
        content = c.text("content")
        limits.length(c.where, "content", content, max_content_chars, "KEYMEM_MAX_CONTENT_CHARS, as for remember")
        provenance, confirmation_source = c.obj("source"), c.obj("last_confirmation_source")
        limits.source(c.where, "source", provenance)
        limits.source(c.where, "last_confirmation_source", confirmation_source)
        memories.append({
            "id": mid, "content": content, "namespace": normalize_namespace(namespace),
            "depth": c.number("depth", optional=True, default=0.0, low=0.0, high=1.0),
            "access_count": c.count("access_count", default=0),
            "created_at": created, "updated_at": c.time("updated_at", default=created),
            "last_accessed": c.time("last_accessed"),
            "observed_at": c.time("observed_at"),
            "last_confirmed_at": c.time("last_confirmed_at", default=created),
            "confirmation_count": c.count("confirmation_count", default=1, low=1),
            "decay_profile": profile,
            "last_confirmation_evidence": c.text("last_confirmation_evidence", optional=True),
            "last_confirmation_source": confirmation_source,
            "last_confirmation_id": c.text("last_confirmation_id", optional=True),
            "expires_at": c.time("expires_at"),
            "supersedes": c.text("supersedes", optional=True),
            "superseded_by": c.text("superseded_by", optional=True),
            "source": provenance, "vector": c.vector(),
        })
    for i, raw in enumerate(data["links"]):
        c = _Check(f"links[{i}]", raw)
        kid, mid = c.text("key_id"), c.text("memory_id")
        if kid not in seen_keys:
            raise c.fail("key_id", f"names no key of the import: {kid!r}")
        if mid not in seen_memories:
            raise c.fail("memory_id", f"names no memory of the import: {mid!r}")
        links.append({"key_id": kid, "memory_id": mid,
                      "weight": c.number("weight", optional=True, default=1.0, low=0.0, high=10.0),
                      "auto": bool(raw.get("auto"))})
    relations: list[tuple[str, str]] = []
    for i, raw in enumerate(data.get("relations") or []):
        c = _Check(f"relations[{i}]", raw)
        source, target = c.text("from"), c.text("to")
        if source in seen_memories and target in seen_memories and source != target:
            assert source is not None and target is not None
            relations.append((source, target))
    candidates = []
    for i, raw in enumerate(data.get("alias_candidates") or []):
        c = _Check(f"alias_candidates[{i}]", raw)
        if c.text("key_id") in seen_keys:
            candidates.append({"key_id": raw["key_id"], "query_text": c.text("query_text"),
                               "count": c.count("count", default=1), "last_seen": c.time("last_seen", default=now)})
    limits.check()
    return _Plan(keys, memories, links, relations, candidates)


@dataclass(slots=True)
class _Prepared:
    """An import validated, embedded and cut into index tokens, ready to be written."""

    plan: _Plan
    key_vectors: dict[str, bytes]
    body_vectors: dict[str, bytes]
    tokens: dict[str, str]
    vocabulary: frozenset[str]
    """The analyzer's learned words when ``tokens`` were cut."""

    def fresh_tokens(self, graph: MemoryGraph) -> Mapping[str, str]:
        """``tokens``, unless another request taught the analyzer a word since they were cut
        (then none: each memory is cut again as it is indexed)."""
        return self.tokens if self.vocabulary == graph.analyzer.learned else {}


def as_export(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """An export of this version as it is, an upstream graph.json in the export's shape;
    anything else refused."""
    if data.get("format") == FORMAT:
        if data.get("version") != VERSION:
            raise InvalidInput(f"unsupported export version {data.get('version')!r} (this keymem reads {VERSION})",
                               field="version")
        return data
    if isinstance(data.get("keys"), Mapping):
        return {**_from_upstream(data), "format": FORMAT, "version": VERSION}
    raise InvalidInput("not a keymem export (format 'keymem-export') nor an upstream graph.json", field="format")


def check(graph: MemoryGraph, shape: Mapping[str, Any]) -> None:
    """Validate a whole import in the export's shape without embedding or writing anything
    (a federated import checks the file as it was sent before cutting it by store)."""
    _validate(shape, graph.clock(), max_content_chars=graph.settings.max_content_chars)


def _prepare(graph: MemoryGraph, data: Mapping[str, Any], report: Progress) -> _Prepared:
    """Validate an export (or an upstream graph.json), embed what it lacks, cut its text."""
    shape = as_export(data)
    now = graph.clock()
    plan = _validate(shape, now, max_content_chars=graph.settings.max_content_chars)
    same_space = shape.get("embedder") == graph.embedder.fingerprint

    key_vectors: dict[str, bytes] = {}
    todo = []
    for i, k in enumerate(plan.keys):
        if same_space and k["vector"]:
            key_vectors[k["id"]] = _vector(k["vector"], graph.embedder.dim, f"keys[{i}].vector")
        else:
            todo.append((k["id"], k["concept"]))
    body_vectors: dict[str, bytes] = {}
    for i, m in enumerate(plan.memories):
        if same_space and m["vector"]:
            body_vectors[m["id"]] = _vector(m["vector"], graph.embedder.dim, f"memories[{i}].vector")
        else:
            todo.append((m["id"], m["content"]))
    total = len(todo)
    key_ids = {k["id"] for k in plan.keys}
    embedded = 0
    for chunk in _embedding_chunks(todo):
        for (item_id, _), vector in zip(chunk, graph.embedder.embed([text for _, text in chunk]), strict=True):
            (key_vectors if item_id in key_ids else body_vectors)[item_id] = vector_bytes(vector)
        embedded += len(chunk)
        report("embedding", embedded, total)
    # Loanwords the imported keys teach are learned before any text is cut.
    concept_of = {k["id"]: k["concept"] for k in plan.keys}
    keys_of: dict[str, list[str]] = {}
    for link in plan.links:
        keys_of.setdefault(link["memory_id"], []).append(concept_of[link["key_id"]])
    graph.analyzer.learn({word for m in plan.memories
                          for word in graph.analyzer.loanwords(keys_of.get(m["id"], []), m["content"])})
    vocabulary = graph.analyzer.learned
    tokens: dict[str, str] = {}
    for i, m in enumerate(plan.memories):
        tokens[m["id"]] = " ".join(graph.analyzer.index_tokens(m["content"]))
        if (i + 1) % 500 == 0 or i + 1 == len(plan.memories):
            report("indexing", i + 1, len(plan.memories))
    return _Prepared(plan, key_vectors, body_vectors, tokens, vocabulary)


def _no_progress(phase: str, done: int, total: int) -> None:
    """The progress report of a caller that asked for none."""


def import_data(graph: MemoryGraph, data: Mapping[str, Any], *, progress: Progress | None = None
                ) -> dict[str, Any]:
    """Validate, embed and write an export (or an upstream graph.json) in one transaction."""
    return import_parts([(graph, data)], progress=progress)[0]


Placed = Callable[[int, InvalidInput], InvalidInput]
"""A refusal of part ``i``'s record (``memories[3] cannot be stored``) as the place of that
record in the file as sent, for an import cut into parts."""


def import_parts(parts: Sequence[tuple[MemoryGraph, Mapping[str, Any]]], *, progress: Progress | None = None,
                 placed: Placed | None = None) -> list[dict[str, Any]]:
    """Import each part into its store as one import: every part is validated, embedded and
    cut before any is written; then each part's transaction stays open while the parts after
    it are written and committed, so a part its store refuses (a row-level security policy, a
    server gone, a locked file) rolls back the ones before it. Only the first part's commit can
    fail after a later part committed (a disk error at SQLite's COMMIT): the later parts'
    records are then deleted again (``_undo``) and the error says so. The first part's store
    must run its transaction once (SQLite's writer does; a retrying store goes last)."""
    report = progress or _no_progress
    ready = []
    for index, (graph, data) in enumerate(parts):
        with _in_file(placed, index):  # a vector that is not this embedder's
            ready.append((graph, _prepare(graph, data, report)))
    committed: list[tuple[MemoryGraph, _Written]] = []

    def write_from(index: int) -> list[dict[str, Any]]:
        graph, prepared = ready[index]
        written = _Written()

        def write(tx: Writer) -> list[dict[str, Any]]:
            with _in_file(placed, index):
                result = _write(graph, tx, prepared.plan, prepared.key_vectors, prepared.body_vectors,
                                prepared.fresh_tokens(graph), written)
            return [result, *(write_from(index + 1) if index + 1 < len(ready) else [])]

        results = graph.store.write(write)
        committed.append((graph, written))
        return results

    try:
        results = write_from(0)
    except BaseException as exc:
        if not committed:
            raise
        raise _undone(committed, exc) from exc
    finally:
        for graph, _ in committed:
            graph.reload_indexes()
    report("writing", 1, 1)
    logger.info("import: %s", results)
    return results


@contextlib.contextmanager
def _in_file(placed: Placed | None, part: int) -> Iterator[None]:
    """A refusal of part ``part``'s record named by its place in the file (``placed``)."""
    try:
        yield
    except InvalidInput as exc:
        if placed is None:
            raise
        raise placed(part, exc) from exc


@dataclass(slots=True)
class _Written:
    """What one part of an import added to its store, for ``_undo``."""

    memories: set[str] = field(default_factory=set)
    keys: list[str] = field(default_factory=list)


def _undone(committed: Sequence[tuple[MemoryGraph, _Written]], exc: BaseException) -> KeymemError:
    """The parts of a failed import that committed, deleted again; the error to answer with."""
    said = exc.message if isinstance(exc, KeymemError) else f"{type(exc).__name__}: {exc}"
    for graph, written in committed:
        try:
            graph.store.write(functools.partial(_undo, graph, written))
        except Exception as undo_failed:  # noqa: BLE001 - reported, with the way out
            logger.exception("import: undoing a committed part failed")
            return StoreError(f"the import failed ({said}) after part of it was committed, and deleting that part "
                              f"again failed too ({undo_failed}); import the same file again to finish it (what is "
                              "there already is skipped)")
    logger.warning("import failed after part of it was committed; that part was deleted again: %s", said)
    return StoreError(f"the import failed, so nothing was imported (the part already committed to another store "
                      f"was deleted again): {said}")


def _undo(graph: MemoryGraph, written: _Written, tx: Writer) -> None:
    """Delete what one committed part of an import added: its memories (their links, relations
    and index rows go with them), then the keys it created that no memory links now (another
    writer's memory linked to one since keeps it). Aliases and alias candidates it added to
    keys that were there before stay: they change no answer's memories."""
    for memory_id in written.memories:
        memory = tx.memory(memory_id)
        if memory is not None:
            graph.unindex(tx, memory)
            tx.delete_memory(memory_id)
    for key_id in written.keys:
        if not tx.has_links(key_id):
            tx.delete_key(key_id)


def sum_results(results: Sequence[Mapping[str, Mapping[str, int]]]) -> dict[str, Any]:
    """Several imports' ``{"imported": ..., "skipped": ...}`` counts as one."""
    return {part: {name: sum(r[part][name] for r in results) for name in results[0][part]}
            for part in ("imported", "skipped")}


def copy_into(graph: MemoryGraph, data: Mapping[str, Any], *, batch: int, progress: Progress | None = None
              ) -> dict[str, Any]:
    """Write a whole store's export into ``graph``'s store as it is, ``batch`` records per
    transaction: keys (with their aliases), then memories with their links and index rows,
    then relations and alias candidates (``keymemd migrate-store``).

    What is there already is skipped, as an import skips it, and each batch commits whole,
    so a copy cut short (a kill, a lost connection) and run again continues after the last
    batch it committed, duplicating nothing. Unlike ``import_data`` it keeps every
    supersession as the export has it (one may name a memory of a later batch). The graph's
    in-memory tables are not reloaded: its caller verifies the copy and closes it."""
    report = progress or _no_progress
    ready = _prepare(graph, data, report)
    plan = ready.plan
    imported = {"keys": 0, "memories": 0, "links": 0, "relations": 0}
    skipped = {"keys": 0, "memories": 0}
    key_map: dict[str, str] = {}

    def add(counts: tuple[dict[str, int], dict[str, int]]) -> None:
        for total, part in zip((imported, skipped), counts, strict=True):
            for name, n in part.items():
                total[name] += n

    for start in range(0, len(plan.keys), batch):
        def write_keys(tx: Writer, start: int = start) -> tuple[dict[str, str], tuple[dict[str, int], dict[str, int]]]:
            graph.sync_vocabulary(tx)
            mapped: dict[str, str] = {}
            counts = _counts()
            for i, k in enumerate(plan.keys[start:start + batch], start):
                with _record(f"keys[{i}]"):
                    _write_key(graph, tx, k, ready.key_vectors, mapped, *counts)
            return mapped, counts

        mapped, counts = graph.store.write(write_keys)
        key_map.update(mapped)
        add(counts)
        report("keys", min(start + batch, len(plan.keys)), len(plan.keys))
    links_of: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, link in enumerate(plan.links):
        links_of.setdefault(link["memory_id"], []).append((i, link))
    for start in range(0, len(plan.memories), batch):
        def write_memories(tx: Writer, start: int = start) -> tuple[dict[str, int], dict[str, int]]:
            graph.sync_vocabulary(tx)
            counts = _counts()
            new_memories: set[str] = set()
            chunk = plan.memories[start:start + batch]
            for i, m in enumerate(chunk, start):
                with _record(f"memories[{i}]"):
                    _write_memory(tx, m, ready.body_vectors, new_memories, *counts)
            _write_links(tx, [link for m in chunk for link in links_of.get(m["id"], [])], key_map, new_memories,
                         counts[0])
            _index_new(graph, tx, new_memories, ready.fresh_tokens(graph))
            return counts

        add(graph.store.write(write_memories))
        report("memories", min(start + batch, len(plan.memories)), len(plan.memories))

    def write_rest(tx: Writer) -> int:
        # Every relation, not only those of memories this run wrote: a run cut short after
        # the memories and before this transaction left them out.
        added = sum(tx.import_relation(a, b) for a, b in plan.relations)
        _write_candidates(tx, plan.candidates, key_map)
        return added

    imported["relations"] += graph.store.write(write_rest)
    report("relations", 1, 1)
    result = {"imported": imported, "skipped": skipped}
    logger.info("copy: %s", result)
    return result


def _vector(text: str, dim: int, where: str) -> bytes:
    """An imported vector's bytes, if they are a vector of this embedder."""
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{where} is not valid base64", field=where) from None
    problem = vector_problem(blob, dim)
    if problem is not None:
        raise InvalidInput(f"{where} {problem}; drop the field to have it embedded again", field=where)
    return blob


def _embedding_chunks(todo: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    """``todo`` in chunks of at most ``EMBED_BATCH`` texts and about ``EMBED_BATCH_CHARS``."""
    chunk: list[tuple[str, str]] = []
    chars = 0
    for item in todo:
        if chunk and (len(chunk) == EMBED_BATCH or chars + len(item[1]) > EMBED_BATCH_CHARS):
            yield chunk
            chunk, chars = [], 0
        chunk.append(item)
        chars += len(item[1])
    if chunk:
        yield chunk


@contextlib.contextmanager
def _record(where: str) -> Iterator[None]:
    """Name the record whose write failed (the transaction rolls back)."""
    try:
        yield
    except KeymemError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:  # a store's refusal is a ValueError
        raise InvalidInput(f"{where} cannot be stored: {exc}", field=where) from exc


def _counts() -> tuple[dict[str, int], dict[str, int]]:
    """Fresh ``(imported, skipped)`` tallies."""
    return {"keys": 0, "memories": 0, "links": 0, "relations": 0}, {"keys": 0, "memories": 0}


def _write(graph: MemoryGraph, tx: Writer, plan: _Plan, key_vectors: Mapping[str, bytes],
           body_vectors: Mapping[str, bytes], tokens: Mapping[str, str], written: _Written) -> dict[str, Any]:
    graph.sync_vocabulary(tx)
    key_map: dict[str, str] = {}
    imported, skipped = _counts()
    for i, k in enumerate(plan.keys):
        with _record(f"keys[{i}]"):
            if _write_key(graph, tx, k, key_vectors, key_map, imported, skipped):
                written.keys.append(k["id"])
    new_memories = written.memories
    for i, m in enumerate(plan.memories):
        with _record(f"memories[{i}]"):
            _write_memory(tx, m, body_vectors, new_memories, imported, skipped)
    _write_links(tx, enumerate(plan.links), key_map, new_memories, imported)
    for a, b in plan.relations:
        if a in new_memories:
            imported["relations"] += tx.import_relation(a, b)
    _write_candidates(tx, plan.candidates, key_map)
    # A supersession pointing outside the store would hide a memory forever: drop it.
    tx.drop_dangling_supersessions()
    _index_new(graph, tx, new_memories, tokens)
    return {"imported": imported, "skipped": skipped}


def _write_links(tx: Writer, links: Iterable[tuple[int, dict[str, Any]]], key_map: Mapping[str, str],
                 new_memories: set[str], imported: dict[str, int]) -> None:
    """The links (each with its place in the import) of the memories this transaction added;
    an existing memory keeps its own."""
    for i, link in links:
        if link["memory_id"] not in new_memories:
            continue
        with _record(f"links[{i}]"):
            imported["links"] += tx.import_link(key_map[link["key_id"]], link["memory_id"], link["weight"],
                                                auto=link["auto"])


def _write_candidates(tx: Writer, candidates: list[dict[str, Any]], key_map: Mapping[str, str]) -> None:
    for i, c in enumerate(candidates):
        with _record(f"alias_candidates[{i}]"):
            tx.import_alias_candidate(key_map[c["key_id"]], normalize(c["query_text"]), c["query_text"], c["count"],
                                      c["last_seen"])


def _index_new(graph: MemoryGraph, tx: Writer, new_memories: set[str], tokens: Mapping[str, str]) -> None:
    """Index the added memories that are current (after their links, whose keys it indexes)."""
    for mid in new_memories:
        memory = tx.memory(mid)
        if memory is not None and memory.superseded_by is None:
            graph.index_memory(tx, mid, tokens.get(mid))


def _write_key(graph: MemoryGraph, tx: Writer, k: Mapping[str, Any], key_vectors: Mapping[str, bytes],
               key_map: dict[str, str], imported: dict[str, int], skipped: dict[str, int]) -> bool:
    """Write one imported key, or map it onto the existing key of its id or text; True when it
    is new."""
    existing = tx.key_named(k["id"], normalize(k["concept"]))
    if existing is not None:
        key_map[k["id"]] = existing
        skipped["keys"] += 1
    else:
        key_map[k["id"]] = k["id"]
        tx.import_key(k["id"], k["concept"], normalize(k["concept"]), graph.analyzer.compact(k["concept"]),
                   k["key_type"], key_vectors[k["id"]], k["created_at"])
        imported["keys"] += 1
    for a in k["aliases"]:
        if normalize(a["alias"]) == normalize(k["concept"]):
            continue
        tx.import_alias(key_map[k["id"]], a["alias"], normalize(a["alias"]), graph.analyzer.compact(a["alias"]),
                     learned=a["learned"], added_at=a["added_at"], hits=a["hits"])
    return existing is None


def _write_memory(tx: Writer, m: Mapping[str, Any], body_vectors: Mapping[str, bytes],
                  new_memories: set[str], imported: dict[str, int], skipped: dict[str, int]) -> None:
    if tx.memory(m["id"]) is not None:
        skipped["memories"] += 1
        return
    new_memories.add(m["id"])
    tx.import_memory(m, dedup_hash(m["content"]), body_vectors[m["id"]])
    imported["memories"] += 1
