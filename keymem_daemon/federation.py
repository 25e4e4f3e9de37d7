"""Personal namespaces in the local SQLite store, team namespaces in PostgreSQL (issue 22).

With ``KEYMEM_STORE_URL`` and ``KEYMEM_TEAM_NAMESPACES`` both set, the daemon holds two
engines -- the same ``MemoryGraph`` over two repositories -- and ``Federation`` routes
between them; nothing here knows SQL or either store:

- **Writes go to the store owning the namespace.** ``remember`` by its namespace (none means
  ``default``); ``remember_batch`` item by item (a batch spanning both stores is saved as two
  transactions, one per store, and answered as one batch in the items' order).
- **Reads by id find the memory where it is.** Memory and key ids are random text, unique
  across stores: ``read_memory``, ``confirm_memory``, ``correct``, ``forget``, ``dismiss`` and
  ``related`` go to the store holding the memory (the local one is asked first: it answers
  without a round trip, and while the server is down); ``read_key`` to the one holding the key.
- **Reads over one namespace ask its store; reads over every namespace ask both** and merge
  into one answer of the same shape and size: ``recall`` (key clusters by score, the passive
  Top-1 of the best key's store), ``recall_memories`` (hits by score), ``browse_keys`` (hubs
  first, then by memory count), ``list_memories`` (oldest first), ``memory_stats`` and
  ``cleanup_expired`` (summed), and the push path (surfaced memories by their probability,
  rendered once within the same ``top_k`` and ``max_chars``).

A memory written before the mapping existed stays where it is: reads over every namespace
still find it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from keymem_daemon.config import Settings, describe_store_url
from keymem_daemon.engine import limits, transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.keys import KeyInfo
from keymem_daemon.engine.ports import Reader, Scope
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.engine.reads.browse import best_related
from keymem_daemon.engine.reads.recall import NEAREST_KEYS
from keymem_daemon.engine.records import (
    BrowseResult,
    CleanupResult,
    CompactKey,
    Hit,
    IdempotencyKey,
    KeyView,
    ListResult,
    ReadKeyResult,
    RecallResult,
    RelatedItem,
    Replayed,
    Stats,
    render,
)
from keymem_daemon.engine.text import normalize, normalize_namespace
from keymem_daemon.engine.validate import namespace_arg, related_arg
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, StoreError
from keymem_daemon.mcp import tools

logger = logging.getLogger(__name__)

T = TypeVar("T")

Route = Literal["memory", "key", "write", "batch", "spread", "local"]

ROUTES: Final[Mapping[str, Route]] = {
    "recall": "spread", "browse_keys": "spread", "list_memories": "spread", "memory_stats": "spread",
    "cleanup_expired": "spread", "recall_memories": "spread",
    "read_key": "key",
    "read_memory": "memory", "confirm_memory": "memory", "correct": "memory", "dismiss": "memory",
    "forget": "memory", "related": "memory",
    "remember": "write", "remember_batch": "batch",
    "list_sessions": "local", "get_conversation": "local",
}
"""How each tool finds its store (a test checks every tool has a route)."""
PUSH_KEYS: Final = 8
"""Matched keys the push path reports (as ``engine.reads.inject`` does for one store)."""


class NamespaceRouter:
    """Which namespaces live in the team store: ``KEYMEM_TEAM_NAMESPACES``'s names, and its
    prefixes (``team-*``), compared in the engine's normal form."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.exact = frozenset(normalize_namespace(p) for p in patterns if not p.endswith("*"))
        self.prefixes = tuple(normalize(p[:-1]) for p in patterns if p.endswith("*"))

    def is_team(self, namespace: str) -> bool:
        """Whether the (normalised) namespace lives in the team store."""
        return namespace in self.exact or namespace.startswith(self.prefixes)

    def split(self, scope: Scope) -> tuple[Scope, Scope]:
        """``scope`` as (its local part, its team part); every namespace (None) stays every
        namespace on both sides."""
        if scope is None:
            return None, None
        team = frozenset(ns for ns in scope if self.is_team(ns))
        return scope - team, team


@dataclass(frozen=True, slots=True)
class StoreStats:
    """One store's counts, for ``/v1/stats``."""

    store: str
    counts: Stats | None
    """None when the store does not answer."""


@dataclass(slots=True)
class CrossStore:
    """What an import joins across the two stores and so cannot keep (``import_parts``)."""

    relations: int = 0
    """Explicit relations between a memory of one store and one of the other."""
    supersessions: int = 0
    """Pairs of versions (one superseding the other) split between the stores: each store
    keeps its memory, the one superseded becomes current again."""

    def report(self) -> dict[str, Any] | None:
        """The import answer's ``not_imported`` entry; None when nothing was left out."""
        if not self.relations and not self.supersessions:
            return None
        return {"relations": self.relations, "supersessions": self.supersessions,
                "why": "each joins a memory of the local store to one of the team store (their namespaces map to "
                       "different stores), and a store's relations and versions name its own memories only"}


@dataclass(frozen=True, slots=True)
class Cut:
    """An import cut by store (``Federation.import_parts``), for ``transfer.import_parts``."""

    parts: list[tuple[MemoryGraph, dict[str, Any]]]
    places: list[Mapping[str, list[str]]]
    """Per part, per list of records, each record's place in the file as sent."""
    across: CrossStore

    def placed(self, part: int, exc: InvalidInput) -> InvalidInput:
        """A refusal naming a part's record (``memories[0] cannot be stored: ...``) as one
        naming its place in the file (``team.memories[3] cannot be stored: ...``)."""
        found = re.match(r"(\w+)\[(\d+)\]", exc.field or "")
        if found is None:
            return exc
        name, index = found.group(1), int(found.group(2))
        places = self.places[part].get(name) or []
        if index >= len(places):
            return exc
        where = f"{places[index]}{exc.field[found.end():] if exc.field else ''}"
        message = exc.message.replace(found.group(0), places[index], 1)
        return InvalidInput(message, field=where)


class Federation:
    """The local and the team engine behind one daemon, and the routing between them."""

    def __init__(self, local: MemoryGraph, team: MemoryGraph, settings: Settings) -> None:
        self.local = local
        self.team = team
        self.settings = settings
        self.router = NamespaceRouter(settings.team_namespaces or ())

    @property
    def graphs(self) -> tuple[MemoryGraph, MemoryGraph]:
        return self.local, self.team

    def close(self) -> None:
        """Close the team engine (the service closes the local one, its primary graph)."""
        self.team.close()

    def each(self, fn: Callable[[MemoryGraph], T]) -> list[T]:
        """``fn`` over both stores, the local one first, for a read over every namespace. The
        team store answers from the server, or from its local replica once the server is
        known to be down (``store/postgres/offline.py``); when it cannot answer at all (no
        replica yet) the local store's answer stands alone (``stale`` says why), while a
        local store that fails fails the read."""
        out = [fn(self.local)]
        try:
            out.append(fn(self.team))
        except StoreError as exc:
            logger.warning("answering from the local store only: %s", exc.message)
        return out

    # -- finding the store ------------------------------------------------------------------

    def for_write(self, namespace: object) -> MemoryGraph:
        """The store a write into ``namespace`` goes to (none or blank: ``default``); a
        namespace of the wrong type goes to the local one, whose engine refuses it."""
        if namespace is not None and not isinstance(namespace, str):
            return self.local
        return self.team if self.router.is_team(normalize_namespace(namespace)) else self.local

    def for_namespace(self, namespace: object) -> MemoryGraph | None:
        """The store a read over ``namespace`` asks; None for every namespace (both)."""
        ns = namespace_arg(namespace)
        if ns is None:
            return None
        return self.team if self.router.is_team(ns) else self.local

    def for_memory(self, memory_id: object) -> MemoryGraph:
        """The store holding the memory: the local one when it has it, else the team one
        (which says ``not found`` when neither has it)."""
        if isinstance(memory_id, str) and self.local.store.read(lambda reader: reader.memory(memory_id)) is None:
            return self.team
        return self.local

    def for_key(self, key_id: object) -> MemoryGraph:
        if isinstance(key_id, str) and self.local.keys.get(key_id) is None and self.team.keys.get(key_id) is not None:
            return self.team
        return self.local

    # -- import -----------------------------------------------------------------------------

    def import_parts(self, data: Mapping[str, Any]) -> Cut:
        """An import cut by store, the local part first (``transfer.import_parts`` holds its
        SQLite transaction open while the team part is written and committed, so a team part
        the server refuses leaves the local store unchanged too): each memory goes to the store
        owning its namespace, with its links, the keys they name (a key linked from both stores
        goes to both) and the relations within that store. A relation or a supersession joining
        a memory of one store to one of the other cannot be kept (each store's rows name its
        own memories): they are counted, and the answer says so. A federated export's ``team``
        part is cut the same way, so it lands where it came from. The file is checked whole
        first, as it was sent, so a refusal names the record's place in it
        (``team.memories[3].content``)."""
        documents = [(transfer.as_export(data), self.local, "")]
        team_part = data.get("team")
        if team_part is not None:
            if not isinstance(team_part, Mapping):
                raise InvalidInput("team must be an object (the team store's export)", field="team")
            documents.append((_in_part("team", lambda: transfer.as_export(team_part)), self.team, "team"))
        for shape, _home, where in documents:
            _in_part(where, functools.partial(transfer.check, self.local, shape))
        parts: dict[int, tuple[MemoryGraph, dict[str, Any]]] = {}
        places: dict[int, dict[str, list[str]]] = {id(g): {name: [] for name in _RECORDS} for g in self.graphs}
        across = CrossStore()
        for shape, home, where in documents:
            for graph, part in self._cut(shape, home, across, where, places):
                if id(graph) not in parts:
                    parts[id(graph)] = (graph, part)
                    continue
                into = parts[id(graph)][1]
                for name in _RECORDS:
                    into[name] = into[name] + part[name]
                if into["embedder"] != part["embedder"]:
                    into["embedder"] = None  # two embedders' vectors: embed every record again
        full = sorted(((graph, part) for graph, part in parts.values() if any(part[name] for name in _RECORDS)),
                      key=lambda item: item[0] is self.team)
        if not full:
            return Cut([(self.local, {**documents[0][0]})], [{}], across)
        return Cut(full, [places[id(graph)] for graph, _ in full], across)

    def _cut(self, shape: Mapping[str, Any], home: MemoryGraph, across: CrossStore, where: str,
             places: Mapping[int, Mapping[str, list[str]]]) -> list[tuple[MemoryGraph, dict[str, Any]]]:
        """One checked document's records by store; a key no memory links stays at ``home``;
        what joins the two stores counted in ``across``; each record's place in the file (in
        the document ``where``) appended to its store's ``places``."""
        owner = {m["id"]: self.for_write(m.get("namespace")) for m in shape["memories"]}
        parts: dict[int, dict[str, Any]] = {
            id(g): {"format": transfer.FORMAT, "version": transfer.VERSION, "embedder": shape.get("embedder"),
                    **{name: [] for name in _RECORDS}} for g in self.graphs}

        def add(store: int, name: str, index: int, record: Mapping[str, Any]) -> None:
            parts[store][name].append(record)
            places[store][name].append(f"{where}.{name}[{index}]" if where else f"{name}[{index}]")
        key_stores: dict[str, set[int]] = {}
        versions: set[frozenset[str]] = set()
        for i, memory in enumerate(shape["memories"]):
            graph = owner[memory["id"]]
            add(id(graph), "memories", i, memory)
            for name in ("supersedes", "superseded_by"):
                other = owner.get(memory.get(name))
                if other is not None and other is not graph:
                    versions.add(frozenset((memory["id"], memory[name])))
        across.supersessions += len(versions)
        for i, link in enumerate(shape["links"]):
            graph = owner[link["memory_id"]]
            add(id(graph), "links", i, link)
            key_stores.setdefault(link["key_id"], set()).add(id(graph))
        for i, key in enumerate(shape["keys"]):
            for store in key_stores.get(key["id"]) or {id(home)}:
                add(store, "keys", i, key)
        for i, relation in enumerate(shape.get("relations") or []):
            source, target = owner.get(relation["from"]), owner.get(relation["to"])
            if source is not None and source is target:
                add(id(source), "relations", i, relation)
            elif source is not None and target is not None:
                across.relations += 1
        for i, candidate in enumerate(shape.get("alias_candidates") or []):
            for store in key_stores.get(candidate["key_id"]) or {id(home)}:
                add(store, "alias_candidates", i, candidate)
        return [(g, parts[id(g)]) for g in self.graphs]

    # -- tools ------------------------------------------------------------------------------

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None, host: Host,
                  idempotency: IdempotencyKey | None) -> tools.Outcome:
        """``tools.call_tool`` over both stores: the same validation, errors and result shape."""
        tool = tools.visible_tool(self.settings, host, name)

        def on(graph: MemoryGraph, args: tools.Args) -> Any:
            return tool.handler(tools.Context(graph, self.settings, host, idempotency), args)

        return tools.outcome(name, arguments, lambda: self._run(tool, arguments, on))

    def _run(self, tool: tools.Tool, arguments: Mapping[str, Any] | None,
             on: Callable[[MemoryGraph, tools.Args], Any]) -> Any:
        args = tools.Args(tool, arguments)
        route = ROUTES[tool.name]
        if tool.name == "related":
            return self.related(args.raw("memory_id"))
        if route == "memory":
            graph = self.for_memory(args.raw("memory_id"))
            if "related_to" in tool.properties:  # correct: the new version stays in the old one's store
                self._refuse_across(graph, None, args.raw("memory_id"), args.raw("related_to"), "related_to")
            return on(graph, self._keys_in(graph, tool, arguments, args))
        if route == "key":
            return self._read_key(tool, arguments, args, on)
        if route == "write":
            graph = self.for_write(args.raw("namespace"))
            self._refuse_across(graph, args.raw("namespace"), None, args.raw("related_to"), "related_to")
            return on(graph, args)
        if route == "batch":
            return self._batch(tool, arguments or {}, args, on)
        if route == "local":
            return on(self.local, args)
        one = self.for_namespace(args.raw("namespace")) if "namespace" in tool.properties else None
        if one is not None:
            return on(one, args)
        if tool.name == "browse_keys":
            return self.browse_keys(hubs_only=args.boolean("hubs_only"), limit=args.integer("limit"),
                                    offset=args.integer("offset"))
        if tool.name == "list_memories":
            return self._list(args)
        if tool.name == "recall":
            return self._merge_recall(self.each(lambda graph: on(graph, args)), args)
        merge = _MERGES[tool.name]
        return merge(self.each(lambda graph: on(graph, args)), args)

    def _batch(self, tool: tools.Tool, arguments: Mapping[str, Any], args: tools.Args,
               on: Callable[[MemoryGraph, tools.Args], Any]) -> Any:
        """A batch split by store, each part one transaction of its store; one answer, its
        items in the order sent (a malformed batch is the local engine's to refuse)."""
        items = args.array("items")
        if not items or len(items) > limits.MAX_REMEMBER_BATCH:
            return on(self.local, args)
        parts: dict[int, tuple[MemoryGraph, list[int]]] = {}
        for index, item in enumerate(items):
            graph = self.for_write(item.get("namespace") if isinstance(item, Mapping) else None)
            if isinstance(item, Mapping):
                self._refuse_across(graph, item.get("namespace"), None, item.get("related_to"),
                                    f"items[{index}].related_to")
            parts.setdefault(id(graph), (graph, []))[1].append(index)
        if len(parts) == 1:
            return on(next(iter(parts.values()))[0], args)
        saved = failed = 0
        batch_id: str | None = None
        answered: list[dict[str, Any]] = []
        for graph, indexes in parts.values():
            result = on(graph, tools.Args(tool, {**arguments, "items": [items[i] for i in indexes]}))
            body: dict[str, Any] = result.result if isinstance(result, Replayed) else render(result)
            saved, failed = saved + body["saved"], failed + body["failed"]
            batch_id = batch_id or body.get("batch_id")
            answered += [{**item, "index": indexes[item["index"]]} for item in body["items"]]
        merged: dict[str, Any] = {"saved": saved, "failed": failed,
                                  "items": sorted(answered, key=lambda item: item["index"])}
        if batch_id is not None:
            merged["batch_id"] = batch_id
        return Replayed(merged)  # an answer already rendered: forwarded as it is

    def _refuse_across(self, graph: MemoryGraph, namespace: object, corrected: object, related_to: object,
                       field: str) -> None:
        """Refuse (``InvalidInput``, before anything is written) a write into ``graph`` -- a
        memory of ``namespace``, or the new version of memory ``corrected`` -- whose
        ``related_to`` names memories of the other store: each store's relations name its own
        memories, so such a relation cannot be kept. A malformed or unknown id is left to
        the engine, which refuses it as without team memory."""
        try:
            related = related_arg(related_to)
        except InvalidInput:
            return
        if not related:
            return
        other = self.team if graph is self.local else self.local
        try:
            held, old = graph.store.read(lambda reader: (
                reader.memories(related), reader.memory(corrected) if isinstance(corrected, str) else None))
            elsewhere = other.store.read(lambda reader: reader.memories([r for r in related if r not in held]))
        except StoreError:
            return  # a store that does not answer: the engine's own error says so
        if not elsewhere or (corrected is not None and old is None):
            return
        target = old.namespace if old is not None else (
            normalize_namespace(namespace) if namespace is None or isinstance(namespace, str) else None)
        names = sorted({memory.namespace for memory in elsewhere.values()})
        raise InvalidInput(
            f"{field} names {', '.join(list(elsewhere)[:5])} of namespace {', '.join(map(repr, names))}, which "
            f"lives in {self._store_name(other)}, but this memory goes to namespace {target!r} in "
            f"{self._store_name(graph)}: a relation between memories of the two stores is not kept (each store's "
            "relations name its own memories; KEYMEM_TEAM_NAMESPACES says which namespaces live on the server); "
            "nothing was saved", field=field)

    def describe(self, graph: MemoryGraph) -> str:
        """``graph``'s store as ``keymemd status`` names it: ``sqlite PATH`` or
        ``postgresql HOST:PORT/DATABASE as ROLE``."""
        if graph is self.local:
            return f"sqlite {self.settings.db_path}"
        assert self.settings.store_url is not None  # a federation has a team store
        return describe_store_url(self.settings.store_url)

    def _store_name(self, graph: MemoryGraph) -> str:
        return f"the {'local' if graph is self.local else 'team'} store ({self.describe(graph)})"

    # -- one key per concept ----------------------------------------------------------------
    # A concept linked from memories of both stores has a key in each (each store's links name
    # its own keys), under its own id. The tools show it as one key: listed once with the
    # memories of both, its id (either store's) read and followed across both.

    def twin_elsewhere(self, key_id: object) -> str | None:
        """The other store's key for the concept of ``key_id`` (the store not holding it, as
        ``for_key`` says): a concept keyed in both stores, under another id or under the same
        one (an import puts a key linked from both stores' memories in both); else None."""
        home = self.for_key(key_id)
        return self.twin(self.team if home is self.local else self.local, key_id)

    def twin(self, graph: MemoryGraph, key_id: object) -> str | None:
        """``graph``'s key for the concept of key ``key_id`` of either store (``key_id`` itself
        when ``graph`` holds it); None when ``graph`` has no key of that concept."""
        if not isinstance(key_id, str):
            return None
        if graph.keys.get(key_id) is not None:
            return key_id
        info = (self.team if graph is self.local else self.local).keys.get(key_id)
        return graph.keys.by_norm(normalize(info.concept)) if info is not None else None

    def _keys_in(self, graph: MemoryGraph, tool: tools.Tool, arguments: Mapping[str, Any] | None,
                 args: tools.Args) -> tools.Args:
        """A memory tool's key id (``via_key_id``, ``key_id``) as ``graph``'s key of the same
        concept, when it names the other store's (a key recall showed from there)."""
        raw = dict(arguments or {})
        for name in ("via_key_id", "key_id"):
            if name in tool.properties and isinstance(raw.get(name), str):
                raw[name] = self.twin(graph, raw[name]) or raw[name]
        return args if raw == dict(arguments or {}) else tools.Args(tool, raw)

    def _counted(self, key_id: str, count: int) -> KeyView:
        """The view of key ``key_id`` (of either store) with ``count`` memories: whether that
        makes it a hub, its specificity, as a store's own view says them."""
        graph = self.local if self.local.keys.get(key_id) is not None else self.team
        info = graph.keys.get(key_id)
        assert info is not None, key_id  # a key a store just answered with
        return graph.key_view(info, count)

    def _one_key(self, views: Sequence[KeyView]) -> KeyView:
        """One concept's key views from both stores as one: the first's id and type, the
        memories of both, every alias once."""
        count = sum(v.memory_count for v in views)
        counted = self._counted(views[0].key_id, count)
        return dataclasses.replace(views[0], aliases=_once(a for v in views for a in v.aliases),
                                   learned_aliases=_once(a for v in views for a in v.learned_aliases),
                                   memory_count=count, is_hub=counted.is_hub, specificity=counted.specificity)

    def _one_cluster(self, same: Sequence[CompactKey]) -> CompactKey:
        """One concept's recalled key clusters from both stores (best first) as one: the best's
        id, score and match, the memories of both, every alias once."""
        if len(same) == 1:
            return same[0]
        count = sum(k.memory_count for k in same)
        counted = self._counted(same[0].key_id, count)
        return dataclasses.replace(same[0], aliases=_once(a for k in same for a in k.aliases), memory_count=count,
                                   is_hub=counted.is_hub, specificity=counted.specificity)

    def _merge_recall(self, results: list[RecallResult], args: tools.Args) -> RecallResult:
        """One recall over both stores: their key clusters by score, one per concept (``top_k``
        of them), and the passive Top-1 of the store whose key leads; ``no_match`` with the
        nearest keys of both."""
        counted = [r.namespace_memory_count for r in results if r.namespace_memory_count is not None]
        count = sum(counted) if counted else None
        found = [r for r in results if r.status == "found"]
        if not found:
            nearest = sorted(itertools.chain.from_iterable(r.nearest_keys or [] for r in results),
                             key=lambda k: -k.score)[:NEAREST_KEYS]
            status: Literal["no_match", "empty_namespace"] = \
                "no_match" if any(r.status == "no_match" for r in results) else "empty_namespace"
            return dataclasses.replace(results[0], status=status, nearest_keys=nearest, namespace_memory_count=count)
        concepts: dict[str, list[CompactKey]] = {}
        for key in sorted(itertools.chain.from_iterable(r.keys for r in found), key=lambda k: -k.score):
            concepts.setdefault(normalize(key.concept), []).append(key)
        keys = [self._one_cluster(same) for same in concepts.values()]
        keys = keys[:limits.RECALL_TOP_K.clamp(args.integer("top_k"))]
        lead = next(r for r in found if r.keys[0].key_id == keys[0].key_id)
        return dataclasses.replace(lead, keys=keys, namespace_memory_count=count)

    def _read_key(self, tool: tools.Tool, arguments: Mapping[str, Any] | None, args: tools.Args,
                  on: Callable[[MemoryGraph, tools.Args], Any]) -> Any:
        """``read_key`` over the stores holding the key's concept: its memories in both, ranked
        together, paged as one list; over one namespace, that namespace's store's key."""
        key_id = args.raw("key_id")
        one = self.for_namespace(args.raw("namespace")) if isinstance(key_id, str) else None
        if one is not None:
            return on(one, self._keys_in(one, tool, arguments, args))
        twin = self.twin_elsewhere(key_id)
        if twin is None:
            return on(self.for_key(key_id), args)
        return self.read_key_in_both(key_id, twin, query=args.text("query"), limit=args.integer("limit"),
                                     offset=args.integer("offset"))

    def read_key_in_both(self, key_id: str, twin: str, *, query: str | None, limit: int,
                         offset: int) -> ReadKeyResult:
        """A concept keyed in both stores (``key_id`` in one, ``twin`` the other's key of it):
        its memories in both, ranked together, paged as one list (the tool's and the
        inspector's key page)."""
        home = self.for_key(key_id)
        other = self.team if home is self.local else self.local
        ids = {id(home): key_id, id(other): twin}
        pages: list[ReadKeyResult] = self.each(
            lambda g: g.read_key(ids[id(g)], query=query, limit=offset + limit, offset=0))
        pages.sort(key=lambda page: page.key.key_id != key_id)  # the key asked for leads
        handles = sorted(itertools.chain.from_iterable(p.memories for p in pages), key=lambda h: -h.score)
        total = sum(p.total for p in pages)
        return ReadKeyResult(key=self._one_key([p.key for p in pages]), memories=handles[offset:offset + limit],
                             total=total, next_offset=offset + limit if offset + limit < total else None)

    def browse_keys(self, *, hubs_only: bool, limit: int, offset: int) -> BrowseResult:
        """Both stores' keys over every namespace, one per concept (counted from the in-memory
        tables, as a store's browse counts them), in browse order; the page's views read from
        the stores holding each (the tool's, and the inspector's key list)."""
        answered = self.each(lambda g: (g, g.browse_keys(None, limit=0)))
        concepts: dict[str, list[tuple[MemoryGraph, KeyInfo, int]]] = {}
        for graph, _ in answered:
            for key_id, n in graph.key_counts((k.id for k in graph.keys.all()), None, graph.clock()).counts.items():
                info = graph.keys.get(key_id)
                if info is not None and n > 0:
                    concepts.setdefault(normalize(info.concept), []).append((graph, info, n))
        hub = self.settings.hub_min_links
        entries = [(norm, held, sum(n for _, _, n in held)) for norm, held in concepts.items()]
        entries = [e for e in entries if not hubs_only or e[2] >= hub]
        entries.sort(key=lambda e: (e[2] < hub, -e[2], e[0]))

        def view(held: list[tuple[MemoryGraph, KeyInfo, int]]) -> KeyView:
            views = [g.key_view(info, n, g.store.read(functools.partial(_learned_aliases, info.id)))
                     for g, info, n in held]
            return self._one_key(views)

        total = len(entries)
        pages = [page for _, page in answered]
        return BrowseResult(status="ok" if any(p.status == "ok" for p in pages) else "empty_namespace",
                            namespace=None, memory_count=sum(p.memory_count for p in pages), key_count=total,
                            keys=[view(held) for _, held, _ in entries[offset:offset + limit]],
                            next_offset=offset + limit if offset + limit < total else None)

    def related(self, memory_id: object) -> list[RelatedItem]:
        """``related`` over both stores: the memory's neighbours in its own store (shared keys,
        explicit relations) and, through the concepts of its keys, the other store's memories
        under its keys of the same concepts; best first, at most ``related_limit`` (the tool's,
        and the inspector's memory page)."""
        graph = self.for_memory(memory_id)
        if not isinstance(memory_id, str):
            return graph.related(memory_id)  # refused as without team memory
        concepts = graph.store.read(lambda reader: [graph.concept(k) for k in reader.key_ids_of(memory_id)])
        parts = self.each(lambda g: g.related(memory_id) if g is graph else g.related_through(concepts, memory_id))
        return best_related(list(itertools.chain.from_iterable(parts)), self.settings.related_limit)

    def _list(self, args: tools.Args) -> ListResult:
        """Both stores' active memories up to the page asked for, oldest first."""
        limit, offset = args.integer("limit"), args.integer("offset")
        pages = self.each(lambda g: g.list_memories(None, limit=offset + limit, offset=0))
        memories = sorted(itertools.chain.from_iterable(p.memories for p in pages), key=lambda m: m.created_at)
        total = sum(p.total for p in pages)
        return ListResult(memories=memories[offset:offset + limit], total=total,
                          next_offset=offset + limit if offset + limit < total else None)

    # -- the push path and operations ---------------------------------------------------------

    def inject(self, prompt: str, *, scope: Scope, top_k: int, max_chars: int, project: frozenset[str],
               session: push.SessionView | None) -> push.InjectResult:
        """``engine.reads.inject.inject`` over the stores ``scope`` reaches, merged: the
        surfaced memories by probability (each store judges its own against its own
        background), at most ``top_k``, rendered once within ``max_chars``."""
        parts = dict(zip(("local", "team"), self.router.split(scope), strict=True))

        def one(graph: MemoryGraph) -> push.InjectResult | None:
            part = parts["local" if graph is self.local else "team"]
            if part is not None and not part:
                return None  # the cwd maps to no namespace of this store
            return push.inject(graph, prompt, scope=part, top_k=top_k, max_chars=max_chars, project=project,
                               session=session)

        results = [r for r in self.each(one) if r is not None]
        if not results:  # neither store answers for these namespaces (the team one is down)
            return push.InjectResult(None, [], [], 0.0)
        if len(results) == 1 or results[0].skipped is not None:
            return results[0]
        picked = sorted(itertools.chain.from_iterable(r.memories for r in results),
                        key=lambda m: -m.relevance_score)[:top_k]
        keys = list({k.key_id: k for r in results for k in r.keys}.values())[:PUSH_KEYS]
        header = push.SESSION_HEADER if session is not None and session.surfaced else push.INJECT_HEADER
        return push.InjectResult(push.render_inject(picked, max_chars, header=header), picked, keys,
                                 round(sum(r.took_ms for r in results), 2),
                                 held_back=[m for r in results for m in r.held_back])

    def stats(self) -> Stats:
        return sum_stats(self.each(lambda g: g.stats()))

    def cleanup_expired(self) -> CleanupResult:
        return _sum_cleanups(self.each(lambda g: g.cleanup_expired()))


_RECORDS: Final = ("keys", "memories", "links", "relations", "alias_candidates")
"""An export's lists of records, each cut by store."""


def _in_part(where: str, check: Callable[[], T]) -> T:
    """``check``, its refusal naming the part of the file it is about (``team.memories[3]``)."""
    if not where:
        return check()
    try:
        return check()
    except InvalidInput as exc:
        named = exc.field is not None and exc.message.startswith(exc.field)  # "memories[3].content must ..."
        raise InvalidInput(f"{where}.{exc.message}" if named else f"in `{where}`: {exc.message}",
                           field=f"{where}.{exc.field}" if exc.field else where) from exc


def _learned_aliases(key_id: str, reader: Reader) -> list[str]:
    return reader.learned_aliases(key_id)


def _once(items: Iterable[str]) -> list[str]:
    """``items`` in order, each once."""
    return list(dict.fromkeys(items))


def _merge_hits(results: list[list[Hit]], args: tools.Args) -> list[Hit]:
    return sorted(itertools.chain.from_iterable(results), key=lambda h: -h.score)[:args.integer("top_k")]


def sum_stats(parts: Sequence[Stats]) -> Stats:
    namespaces: dict[str, int] = {}
    for part in parts:
        for name, n in part.namespaces.items():
            namespaces[name] = namespaces.get(name, 0) + n
    return Stats(keys=sum(p.keys for p in parts), memories=sum(p.memories for p in parts),
                 links=sum(p.links for p in parts), namespaces=dict(sorted(namespaces.items())),
                 superseded=sum(p.superseded for p in parts),
                 expired_pending_cleanup=sum(p.expired_pending_cleanup for p in parts))


def _sum_cleanups(parts: Sequence[CleanupResult]) -> CleanupResult:
    return CleanupResult(*(sum(getattr(p, f.name) for p in parts) for f in dataclasses.fields(CleanupResult)))


_MERGES: Final[Mapping[str, Callable[[Any, tools.Args], Any]]] = {
    "recall_memories": _merge_hits,
    "memory_stats": lambda results, _args: sum_stats(results),
    "cleanup_expired": lambda results, _args: _sum_cleanups(results),
}
