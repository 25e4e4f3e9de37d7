"""What the inspector's pages show, read from the service without side effects.

Each method answers one page (search, memory, key, graph, activity, health) with JSON-ready
data. With team namespaces apart (``federation.py``) the pages span both stores as the tools
do: search and the newest memories merge both stores' results, a memory or key page reads
the store holding it, the key list is the tools' one key per concept. Reads never count an
access, reinforce an edge or confirm anything: a person looking at a memory is not an agent
using it. Writes are not here: the pages call the tools (``Service.call_tool``), the same
operations agents use.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from keymem_daemon.activity_log import preview
from keymem_daemon.config import describe_store_url
from keymem_daemon.engine.freshness import DAY, DECAY_PROFILES, freshness
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.indexes import key_idf
from keymem_daemon.engine.ports import Alias, MemoryFilter, Reader
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.query import scope_of
from keymem_daemon.engine.records import Memory, render
from keymem_daemon.engine.text import normalize
from keymem_daemon.errors import InvalidInput, NotFound
from keymem_daemon.service import Service

T = TypeVar("T")

MAX_RESULTS: Final = 100
FILTER_POOL: Final = 100
FILTER_FACTOR: Final = 2
"""A filtered search looks through 2x the results asked for (at most 100) from the hybrid
recall, since filters other than the namespace apply after ranking; recall's cost grows with
its pool (measured at 10k: 45 ms for 20, 96 ms for 60)."""
RESULT_CHARS: Final = 400
"""Content shown per search result; the memory page shows it all."""
KEY_MEMBERS: Final = 50
CO_KEYS: Final = 15
CO_KEY_SAMPLE: Final = 2000
"""A hub's co-occurring keys are counted over this many of its memories (bounded cost)."""
GRAPH_MEMBERS: Final = 12
GRAPH_KEYS_PER_MEMORY: Final = 8
"""One expansion adds at most this much to the graph: a walkable neighbourhood, not a hairball."""
PLOT_POINTS: Final = 24
STATUSES: Final = ("fresh", "aging", "stale")
BACKUP_NAME: Final = re.compile(r"^keymem-[0-9TZ]+\.db$")


@dataclass(frozen=True, slots=True)
class SearchFilters:
    namespace: str | None = None
    status: str | None = None
    decay_profile: str | None = None
    key: str | None = None
    agent: str | None = None
    session: str | None = None
    since: float | None = None
    until: float | None = None

    def check(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(STATUSES)}", field="status")
        if self.decay_profile is not None and self.decay_profile not in DECAY_PROFILES:
            raise InvalidInput(f"decay_profile must be one of {', '.join(DECAY_PROFILES)}", field="decay_profile")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise InvalidInput("since is after until", field="since")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.status, self.decay_profile, self.key, self.agent, self.session,
                                           self.since, self.until))

    def keep(self, namespace: str, decay: str, status: str, keys: Sequence[str], source: dict[str, Any] | None,
             created_at: float) -> bool:
        src = source or {}
        return ((self.namespace is None or namespace == self.namespace)
                and (self.status is None or status == self.status)
                and (self.decay_profile is None or decay == self.decay_profile)
                and (self.key is None or normalize(self.key) in {normalize(k) for k in keys})
                and (self.agent is None or src.get("host_agent") == self.agent)
                and (self.session is None or src.get("host_session") == self.session)
                and (self.since is None or created_at >= self.since)
                and (self.until is None or created_at <= self.until))


def _provenance(source: dict[str, Any] | None) -> dict[str, Any]:
    src = source or {}
    return {k: src[k] for k in ("host_agent", "host_session", "host_turn", "tool", "saved_at") if k in src}


class Inspector:
    """The inspector's page data, over one service."""

    def __init__(self, service: Service) -> None:
        self.service = service

    # -- which store ------------------------------------------------------------------

    def _over(self, namespace: str | None, fn: Callable[[MemoryGraph], T]) -> list[tuple[MemoryGraph, T]]:
        """``fn`` over the stores a page over ``namespace`` reads: its store, or (every
        namespace, None) each store, the local one first -- as recall reads them."""
        graph = self.service.ready_graph()
        federated = self.service.federation
        if federated is None:
            return [(graph, fn(graph))]
        one = federated.for_namespace(namespace)
        if one is not None:
            return [(one, fn(one))]
        return federated.each(lambda g: (g, fn(g)))

    def _holding_memory(self, memory_id: str) -> MemoryGraph:
        graph = self.service.ready_graph()
        federated = self.service.federation
        return federated.for_memory(memory_id) if federated is not None else graph

    # -- search -----------------------------------------------------------------------

    def search(self, query: str, filters: SearchFilters, *, limit: int = 20) -> dict[str, Any]:
        """Hybrid recall (no reinforcement) with filters; without a query, the newest memories."""
        filters.check()
        graph = self.service.ready_graph()
        limit = max(1, min(MAX_RESULTS, limit))
        namespace = graph.resolve_namespace(filters.namespace) if filters.namespace else None
        filters = dataclasses.replace(filters, namespace=namespace)
        text = query.strip()
        if not text:
            return {"query": "", "results": self._newest(filters, limit), "mode": "newest"}
        answered = self._over(namespace, lambda g: hybrid_recall(
            g, text[:4000], scope=scope_of(namespace), reinforce=False,
            top_k=min(FILTER_POOL, FILTER_FACTOR * limit) if filters.any else limit))
        words = [w for w in re.split(r"\s+", text) if w]
        word_tokens = {w: set(graph.analyzer.index_tokens(w)) for w in words}
        # Both stores' hits by score, as the federation's recall_memories merges them.
        hits = sorted(((g, hit) for g, result in answered for hit in result.hits), key=lambda gh: -gh[1].score)
        out = []
        for held, hit in hits:
            if not filters.keep(hit.namespace, hit.validity.decay_profile, hit.validity.status, hit.keys,
                                hit.source, hit.created_at):
                continue
            tokens = set(graph.analyzer.index_tokens(hit.content))
            out.append({
                "id": hit.id, "content": preview(hit.content, RESULT_CHARS), "namespace": hit.namespace,
                "keys": [{"concept": k, "key_id": held.keys.by_norm(normalize(k)) or ""} for k in hit.keys],
                "matched_via": hit.matched_via,
                "terms": [w for w, toks in word_tokens.items() if toks and toks <= tokens],
                "scores": {"score": round(hit.score, 4), "rank": round(hit.rank_score, 4),
                           "relevance": round(hit.relevance_score, 4)},
                "hop": hit.hop, "validity": render(hit.validity), "created_at": hit.created_at,
                "provenance": _provenance(hit.source),
            })
            if len(out) >= limit:
                break
        matched = [info.concept for g, result in answered for k in result.matched_keys[:12]
                   if (info := g.keys.get(k)) is not None]
        return {"query": text, "results": out, "mode": "recall", "matched_keys": list(dict.fromkeys(matched))[:12]}

    def _newest(self, filters: SearchFilters, limit: int) -> list[dict[str, Any]]:
        """Each store's newest memories, merged newest first."""
        pages = self._over(filters.namespace, lambda g: self._newest_in(g, filters, limit))
        merged = sorted((row for _, rows in pages for row in rows), key=lambda row: -row["created_at"])
        return merged[:limit]

    def _newest_in(self, graph: MemoryGraph, filters: SearchFilters, limit: int) -> list[dict[str, Any]]:
        key_id = None
        if filters.key is not None:
            key_id = graph.keys.by_norm(normalize(filters.key))
            if key_id is None:
                return []
        where = MemoryFilter(namespace=filters.namespace, decay_profile=filters.decay_profile, key_id=key_id,
                             agent=filters.agent, session=filters.session, since=filters.since,
                             until=filters.until)
        # A status filter is computed, not stored: look through more rows for it.
        fetch = limit * 5 if filters.status else limit

        def read(reader: Reader) -> list[dict[str, Any]]:
            memories = reader.newest_memories(where, now=graph.clock(), limit=fetch)
            keys = self._keys_of(graph, reader, [m.id for m in memories])
            out = []
            for m in memories:
                validity = graph.validity_of(m)
                if filters.status is not None and validity.status != filters.status:
                    continue
                out.append({"id": m.id, "content": preview(m.content, RESULT_CHARS), "namespace": m.namespace,
                            "keys": keys.get(m.id, []), "matched_via": [], "terms": [], "scores": None,
                            "validity": render(validity), "created_at": m.created_at,
                            "provenance": _provenance(m.source)})
                if len(out) >= limit:
                    break
            return out

        return graph.store.read(read)

    @staticmethod
    def _keys_of(graph: MemoryGraph, reader: Reader, memory_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for mid, links in reader.strongest_links(memory_ids).items():
            for kid, weight in links:
                info = graph.keys.get(kid)
                if info is not None:
                    out.setdefault(mid, []).append({"concept": info.concept, "key_id": kid,
                                                    "link_weight": round(weight, 3)})
        return out

    # -- one memory -------------------------------------------------------------------

    def memory(self, memory_id: str) -> dict[str, Any]:
        graph = self._holding_memory(memory_id)
        view = graph.inspect_memory(memory_id)
        memory_data: dict[str, Any] = render(view)

        def read(reader: Reader) -> dict[str, Any]:
            memory = reader.memory(memory_id)
            assert memory is not None
            history: list[dict[str, Any]] = []
            older = memory.supersedes
            while older is not None and len(history) < 20:
                previous = reader.memory(older)
                if previous is None:
                    break
                history.append({"id": previous.id, "content": preview(previous.content, RESULT_CHARS),
                                "created_at": previous.created_at})
                older = previous.supersedes
            related = reader.memories(view.memory.related_to)
            return {
                "decay_profile": memory.decay_profile, "confirmation_count": memory.confirmation_count,
                "last_confirmation_evidence": memory.last_confirmation_evidence,
                "active": memory.active(graph.clock()),
                "history": history,
                "relations": [{"id": m.id, "content": preview(m.content, 120)} for m in related.values()],
                "freshness_plot": self._plot(graph, memory),
            }

        memory_data.update(graph.store.read(read))
        memory_data["provenance"] = _provenance(view.memory.source)
        federated = self.service.federation  # neighbours through a concept keyed in both stores too
        neighbours = federated.related(memory_id) if federated is not None else graph.related(memory_id)
        memory_data["neighbours"] = [
            {"id": r.id, "content": preview(r.content, 120), "shared_keys": r.shared_keys, "link_type": r.link_type,
             "score": r.score} for r in neighbours]
        if self.service.activity is not None:
            memory_data["activity"] = [render(e) for e in self.service.activity.page(memory_id=memory_id,
                                                                                     limit=20).entries]
        return memory_data

    @staticmethod
    def _plot(graph: MemoryGraph, memory: Memory) -> list[list[float]]:
        """Freshness from the last confirmation to one half-life (or 90 days) past now: ``[t, f]``."""
        now = graph.clock()
        start = memory.last_confirmed_at
        half = graph.lives.days(memory.decay_profile) or 90.0
        end = max(now, start) + half * DAY
        step = (end - start) / (PLOT_POINTS - 1)
        return [[round(start + i * step, 1),
                 round(freshness(memory.decay_profile, memory.last_confirmed_at, start + i * step, graph.lives), 4)]
                for i in range(PLOT_POINTS)]

    # -- one key ----------------------------------------------------------------------

    def _key_in_stores(self, key_id: str, namespace: str | None = None) -> list[tuple[MemoryGraph, str]]:
        """The stores holding key ``key_id``'s concept, each with its own id of it: the store
        holding ``key_id`` first, then the other store's key of a concept keyed in both; over
        one namespace, that namespace's store's key only -- as the read_key tool reads them."""
        graph = self.service.ready_graph()
        federated = self.service.federation
        if federated is None:
            return [(graph, key_id)]
        one = federated.for_namespace(namespace) if namespace else None
        if one is not None:
            return [(one, federated.twin(one, key_id) or key_id)]
        home = federated.for_key(key_id)
        twin = federated.twin_elsewhere(key_id)
        if twin is None:
            return [(home, key_id)]
        return [(home, key_id), (federated.team if home is federated.local else federated.local, twin)]

    def _each_holding(self, held: Sequence[tuple[MemoryGraph, str]],
                      fn: Callable[[MemoryGraph, str], T]) -> list[tuple[MemoryGraph, str, T]]:
        """``fn`` over each store of ``held`` with its key id, in ``held``'s order; with both
        stores, as ``Federation.each`` asks them (a team store that cannot answer is left out)."""
        federated = self.service.federation
        if federated is None or len(held) == 1:
            return [(g, k, fn(g, k)) for g, k in held]
        ids = {id(g): k for g, k in held}
        answered = federated.each(lambda g: (g, ids[id(g)], fn(g, ids[id(g)])))
        return sorted(answered, key=lambda part: part[0] is not held[0][0])

    def key(self, key_id: str, *, namespace: str | None = None) -> dict[str, Any]:
        """A key's page: its members ranked as read_key ranks them, its aliases, the keys
        sharing its memories. A concept keyed in both stores shows both stores' members,
        aliases and co-occurring keys, one key per concept (as ``browse_keys`` shows it)."""
        held = self._key_in_stores(key_id, namespace)
        graph, kid = held[0]
        federated = self.service.federation
        if federated is not None and len(held) > 1:
            ranked = federated.read_key_in_both(kid, held[1][1], query=None, limit=KEY_MEMBERS, offset=0)
        else:
            ranked = graph.read_key(kid, namespace=namespace or None, limit=KEY_MEMBERS)
        member_ids = [h.memory_id for h in ranked.memories]

        def read(g: MemoryGraph, k: str) -> tuple[list[Alias], list[tuple[str, int]], dict[str, str]]:
            def unit(reader: Reader) -> tuple[list[Alias], list[tuple[str, int]], dict[str, str]]:
                found = reader.memories(member_ids)
                return (reader.aliases_of(k), reader.co_occurring_keys(k, sample=CO_KEY_SAMPLE, limit=CO_KEYS),
                        {mid: preview(m.content, 200) for mid, m in found.items()})
            return g.store.read(unit)

        parts = self._each_holding(held, read)
        contents = {mid: text for _, _, (_, _, found) in parts for mid, text in found.items()}
        members = []
        for handle in render(ranked.memories):
            handle["content"] = contents.get(handle["memory_id"], "")
            members.append(handle)
        infos = [(g, info) for g, k in held if (info := g.keys.get(k)) is not None]
        links = sum(info.link_count for _, info in infos)
        page: dict[str, Any] = {
            "key": render(ranked.key), "aliases": render(_aliases_once(a for _, _, (aliases, _, _) in parts
                                                                       for a in aliases)),
            "members": members, "total": ranked.total,
            "idf": round(key_idf(links, entity=infos[0][1].is_entity), 4) if infos else 0.0,
            "links_all_namespaces": links, "hub_min_links": graph.settings.hub_min_links,
            "co_keys": self._co_keys([(g, co) for g, _, (_, co, _) in parts])}
        if federated is not None:
            page["stores"] = [{"store": federated.describe(g), "key_id": k} for g, k, _ in parts]
        return page

    @staticmethod
    def _co_keys(parts: Sequence[tuple[MemoryGraph, list[tuple[str, int]]]]) -> list[dict[str, Any]]:
        """Each store's co-occurring keys as one list, one entry per concept (the first
        store's id, the counts of both), most shared first."""
        concepts: dict[str, dict[str, Any]] = {}
        for graph, co in parts:
            for other, count in co:
                info = graph.keys.get(other)
                if info is None:
                    continue
                entry = concepts.setdefault(normalize(info.concept),
                                            {"key_id": other, "concept": info.concept, "count": 0})
                entry["count"] += count
        return sorted(concepts.values(), key=lambda e: -e["count"])[:CO_KEYS]

    def keys(self, *, namespace: str | None = None, hubs_only: bool = False, limit: int = 100,
             offset: int = 0) -> dict[str, Any]:
        limit, offset = max(1, min(500, limit)), max(0, offset)
        graph = self.service.ready_graph()
        federated = self.service.federation
        if federated is not None and federated.for_namespace(namespace) is None:
            result: dict[str, Any] = render(federated.browse_keys(hubs_only=hubs_only, limit=limit, offset=offset))
            return result
        one = federated.for_namespace(namespace) if federated is not None else None
        result = render((one or graph).browse_keys(namespace, hubs_only=hubs_only, limit=limit, offset=offset))
        return result

    def find_key(self, concept: str) -> str:
        graph = self.service.ready_graph()
        federated = self.service.federation
        graphs = federated.graphs if federated is not None else (graph,)
        kid = next((k for g in graphs if (k := g.keys.by_norm(normalize(concept))) is not None), None)
        if kid is None:
            raise NotFound(f"no key named {concept!r}")
        return kid

    # -- graph ------------------------------------------------------------------------

    def graph_of_key(self, key_id: str) -> dict[str, Any]:
        """The key, its strongest active members and their keys: one click's worth of
        neighbourhood. By link weight, not read_key's ranking: that reads every member of
        a hub, and a click must stay quick on a key with thousands. A concept keyed in both
        stores brings the strongest members of each, taken in turn."""
        held = self._key_in_stores(key_id)
        graph, kid = held[0]
        graph.check_key_id(kid)
        center = self._key_node(graph, kid)
        assert center is not None  # check_key_id found it
        nodes = {center["id"]: center}
        edges: dict[str, dict[str, Any]] = {}

        def read(g: MemoryGraph, k: str) -> list[tuple[Memory, list[tuple[str, float]]]]:
            def unit(reader: Reader) -> list[tuple[Memory, list[tuple[str, float]]]]:
                members = reader.strongest_members(k, now=g.clock(), limit=GRAPH_MEMBERS)
                links = reader.strongest_links([m.id for m in members], per_memory=GRAPH_KEYS_PER_MEMORY)
                return [(m, links.get(m.id, [])) for m in members]
            return g.store.read(unit)

        parts = self._each_holding(held, read)
        turns = itertools.zip_longest(*([(g, member) for member in members] for g, _, members in parts))
        for g, (m, links) in [pair for turn in turns for pair in turn if pair is not None][:GRAPH_MEMBERS]:
            nodes[f"m:{m.id}"] = self._memory_node(m)
            self._link_memory(g, m.id, links, nodes, edges)
        return {"center": center["id"], "nodes": list(nodes.values()), "edges": list(edges.values())}

    def graph_of_memory(self, memory_id: str) -> dict[str, Any]:
        graph = self._holding_memory(memory_id)
        nodes: dict[str, dict[str, Any]] = {}
        edges: dict[str, dict[str, Any]] = {}

        def read(reader: Reader) -> None:
            m = reader.memory(memory_id)
            if m is None:
                raise NotFound(f"Memory {memory_id} not found")
            nodes[f"m:{m.id}"] = self._memory_node(m)
            links = reader.strongest_links([m.id], per_memory=GRAPH_KEYS_PER_MEMORY)
            self._link_memory(graph, m.id, links.get(m.id, []), nodes, edges)

        graph.store.read(read)
        return {"center": f"m:{memory_id}", "nodes": list(nodes.values()), "edges": list(edges.values())}

    def _link_memory(self, graph: MemoryGraph, memory_id: str, links: Sequence[tuple[str, float]],
                     nodes: dict[str, dict[str, Any]], edges: dict[str, dict[str, Any]]) -> None:
        """The nodes of a memory's keys (its ``(key_id, weight)`` links in ``graph``) and its edges to them."""
        for kid, weight in links:
            node = self._key_node(graph, kid)
            if node is None:
                continue
            nodes.setdefault(node["id"], node)
            edge_id = f"{node['id']}|m:{memory_id}"
            edges[edge_id] = {"id": edge_id, "source": node["id"], "target": f"m:{memory_id}",
                              "weight": round(weight, 3)}

    def _key_node(self, graph: MemoryGraph, key_id: str) -> dict[str, Any] | None:
        """Key ``key_id`` of ``graph`` as a graph node. A concept keyed in both stores is one
        node whichever store's memory brings it in, named by the local store's key (whose
        expansion brings both stores' members), its links those of both."""
        info = graph.keys.get(key_id)
        if info is None:
            return None
        federated = self.service.federation
        node_id, links = key_id, info.link_count
        if federated is not None:
            ids = [(g, federated.twin(g, key_id)) for g in federated.graphs]
            node_id = ids[0][1] or key_id
            links = sum(found.link_count for g, k in ids if k is not None and (found := g.keys.get(k)) is not None)
        return {"id": f"k:{node_id}", "kind": "key", "ref": node_id, "label": info.concept, "links": links}

    @staticmethod
    def _memory_node(m: Memory) -> dict[str, Any]:
        return {"id": f"m:{m.id}", "kind": "memory", "ref": m.id, "label": preview(m.content, 48),
                "namespace": m.namespace}

    # -- activity and health ----------------------------------------------------------

    def activity(self, *, after: int = 0, before: int | None = None, limit: int = 100,
                 kind: str | None = None) -> dict[str, Any]:
        log = self.service.activity
        if log is None:
            self.service.ready_graph()
            return {"entries": [], "latest_id": 0, "enabled": False}
        result: dict[str, Any] = render(log.page(after=after, before=before, limit=limit, kind=kind or None))
        return result

    def health(self) -> dict[str, Any]:
        """The health page: the daemon, its stores and their counts, the backups -- which are
        the local SQLite store's (a PostgreSQL server keeps its own) -- and, on a shared store,
        what this daemon knows of the server: where and as whom, which namespaces live there,
        whether what it serves may be stale, its local replica and its change-log position."""
        settings = self.service.settings
        stats = self.service.stats().as_dict()
        shared = None
        if settings.store_url is not None:
            shared = {"store": describe_store_url(settings.store_url),
                      "namespaces": list(settings.team_namespaces or ()) if settings.federated else None,
                      **{name: stats.get(name) for name in ("stale", "replica", "change_log")}}
        local = settings.store_url is None or settings.federated
        return {"health": render(self.service.health()), "stats": stats, "backups": self.backups(),
                "backups_of": f"sqlite {settings.db_path}" if local else None, "shared_store": shared,
                "settings": {"backup_interval_s": settings.backup_interval,
                             "backup_keep": settings.backup_keep,
                             "activity_log": settings.activity_log}}

    def backups(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.service.settings.backup_dir.glob("keymem-2*.db"), reverse=True):
            try:
                st = path.stat()
            except OSError:
                continue
            out.append({"name": path.name, "bytes": st.st_size, "modified": st.st_mtime})
        return out

    def backup_path(self, name: str) -> Path:
        """A backup's file, by its listed name only (never a path from the request)."""
        if not BACKUP_NAME.match(name):
            raise InvalidInput("not a backup name (keymem-<timestamp>.db)", field="name")
        path = self.service.settings.backup_dir / name
        if not path.is_file():
            raise NotFound(f"no backup {name}")
        return path


def _aliases_once(aliases: Iterable[Alias]) -> list[Alias]:
    """Aliases of one concept's keys in both stores, each once (its hits those of both, learned
    only where no store was given it), the given ones first."""
    merged: dict[str, Alias] = {}
    for alias in aliases:
        norm = normalize(alias.alias)
        seen = merged.get(norm)
        merged[norm] = alias if seen is None else dataclasses.replace(
            seen, hits=seen.hits + alias.hits, learned=seen.learned and alias.learned)
    return sorted(merged.values(), key=lambda a: a.learned)
