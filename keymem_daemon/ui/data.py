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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from keymem_daemon.activity_log import preview
from keymem_daemon.engine.freshness import DAY, DECAY_PROFILES, freshness
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.ports import MemoryFilter, Reader
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

    def _holding_key(self, key_id: str) -> MemoryGraph:
        graph = self.service.ready_graph()
        federated = self.service.federation
        return federated.for_key(key_id) if federated is not None else graph

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
        memory_data["neighbours"] = [
            {"id": r.id, "content": preview(r.content, 120), "shared_keys": r.shared_keys, "link_type": r.link_type,
             "score": r.score} for r in graph.related(memory_id)]
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

    def key(self, key_id: str, *, namespace: str | None = None) -> dict[str, Any]:
        graph = self._holding_key(key_id)
        federated = self.service.federation
        twin = federated.twin_elsewhere(key_id) if federated is not None and not namespace else None
        both = twin is not None
        if federated is not None and twin is not None:
            # A concept keyed in both stores: its members in both, as the read_key tool lists them.
            ranked = federated.read_key_in_both(key_id, twin, query=None, limit=KEY_MEMBERS, offset=0)
        else:
            ranked = graph.read_key(key_id, namespace=namespace or None, limit=KEY_MEMBERS)
        kid = ranked.key.key_id
        member_ids = [h.memory_id for h in ranked.memories]

        def contents_in(g: MemoryGraph) -> dict[str, str]:
            found = g.store.read(lambda reader: reader.memories(member_ids))
            return {mid: preview(m.content, 200) for mid, m in found.items()}

        def read(reader: Reader) -> dict[str, Any]:
            aliases = render(reader.aliases_of(kid))
            co = reader.co_occurring_keys(kid, sample=CO_KEY_SAMPLE, limit=CO_KEYS)
            return {"aliases": aliases,
                    "co_keys": [{"key_id": r[0], "concept": info.concept, "count": r[1]} for r in co
                                if (info := graph.keys.get(r[0])) is not None]}

        extra = graph.store.read(read)
        extra["contents"] = {mid: text for _, found in (self._over(None, contents_in) if both
                                                         else [(graph, contents_in(graph))])
                             for mid, text in found.items()}
        members = []
        for handle in render(ranked.memories):
            handle["content"] = extra["contents"].get(handle["memory_id"], "")
            members.append(handle)
        info = graph.keys.get(kid)
        return {"key": render(ranked.key), "aliases": extra["aliases"], "members": members, "total": ranked.total,
                "idf": round(graph.idf(kid), 4), "links_all_namespaces": info.link_count if info else 0,
                "hub_min_links": graph.settings.hub_min_links, "co_keys": extra["co_keys"]}

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
        a hub, and a click must stay quick on a key with thousands."""
        graph = self._holding_key(key_id)
        kid = graph.check_key_id(key_id)
        center = self._key_node(graph, kid)
        assert center is not None  # check_key_id found it
        nodes = {f"k:{kid}": center}
        edges: dict[str, dict[str, Any]] = {}
        now = graph.clock()

        def read(reader: Reader) -> None:
            members = reader.strongest_members(kid, now=now, limit=GRAPH_MEMBERS)
            for m in members:
                nodes[f"m:{m.id}"] = self._memory_node(m)
            self._link_memories(graph, reader, [m.id for m in members], nodes, edges)

        graph.store.read(read)
        return {"center": f"k:{kid}", "nodes": list(nodes.values()), "edges": list(edges.values())}

    def graph_of_memory(self, memory_id: str) -> dict[str, Any]:
        graph = self._holding_memory(memory_id)
        nodes: dict[str, dict[str, Any]] = {}
        edges: dict[str, dict[str, Any]] = {}

        def read(reader: Reader) -> None:
            m = reader.memory(memory_id)
            if m is None:
                raise NotFound(f"Memory {memory_id} not found")
            nodes[f"m:{m.id}"] = self._memory_node(m)
            self._link_memories(graph, reader, [m.id], nodes, edges)

        graph.store.read(read)
        return {"center": f"m:{memory_id}", "nodes": list(nodes.values()), "edges": list(edges.values())}

    def _link_memories(self, graph: MemoryGraph, reader: Reader, memory_ids: Sequence[str],
                       nodes: dict[str, dict[str, Any]], edges: dict[str, dict[str, Any]]) -> None:
        for memory_id, links in reader.strongest_links(memory_ids, per_memory=GRAPH_KEYS_PER_MEMORY).items():
            for kid, weight in links:
                node = self._key_node(graph, kid)
                if node is None:
                    continue
                nodes.setdefault(f"k:{kid}", node)
                edge_id = f"k:{kid}|m:{memory_id}"
                edges[edge_id] = {"id": edge_id, "source": f"k:{kid}", "target": f"m:{memory_id}",
                                  "weight": round(weight, 3)}

    @staticmethod
    def _key_node(graph: MemoryGraph, key_id: str) -> dict[str, Any] | None:
        info = graph.keys.get(key_id)
        if info is None:
            return None
        return {"id": f"k:{key_id}", "kind": "key", "ref": key_id, "label": info.concept,
                "links": info.link_count}

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
        stats = self.service.stats().as_dict()
        return {"health": render(self.service.health()), "stats": stats, "backups": self.backups(),
                "settings": {"backup_interval_s": self.service.settings.backup_interval,
                             "backup_keep": self.service.settings.backup_keep,
                             "activity_log": self.service.settings.activity_log}}

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
