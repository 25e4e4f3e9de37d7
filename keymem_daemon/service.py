"""The daemon's operations, one method per route or tool, with no HTTP in sight.

``Service`` owns the loading state (``starting`` -> ``ready`` or ``failed``), the memory
graph once it is loaded, and the bits of per-request context the engine needs (who the
host is, which namespaces a cwd may see). ``http/`` maps routes onto these methods;
tests can call them directly.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from keymem_daemon import activity_log, backups, federation, transcripts
from keymem_daemon.config import Settings, describe_store_url
from keymem_daemon.engine import limits, transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads import hybrid, query
from keymem_daemon.engine.reads import inject as push
from keymem_daemon.engine.records import IdempotencyKey, Stats, omit, render
from keymem_daemon.engine.writes.remember import Host
from keymem_daemon.errors import InvalidInput, KeymemError, NotFound, NotReady, StoreError, StoreUnavailable
from keymem_daemon.mcp import instructions, tools
from keymem_daemon.store import opening

logger = logging.getLogger(__name__)

State = Literal["starting", "ready", "failed"]
IMPORT_SUMMARY_CHARS: Final = 200
"""An import's counts in the activity log's one-line summary (the full result is its detail)."""
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class InjectRequest:
    prompt: str
    cwd: str | None = None
    namespace: str | None = None
    top_k: int = limits.INJECT_TOP_K.default
    max_chars: int | None = None
    session_id: str | None = None
    agent: str | None = None


@dataclass(frozen=True, slots=True)
class Health:
    """What ``/health`` says: the loading state, and what is wrong with the store."""

    status: State
    version: str
    pid: int
    error: str | None = omit()
    """Why loading failed (``failed`` only)."""
    detail: str | None = omit()
    """What a long start is doing, with its progress (``starting`` only)."""
    warnings: list[str] | None = omit()


@dataclass(frozen=True, slots=True)
class ChangeLog:
    """Where a daemon on a shared store is in its change log (``store/postgres/changes.py``)."""

    position: int
    """The follower's cursor: every transaction that finished before it has reached this
    daemon's in-memory tables (a restart resumes from here)."""
    connected: bool
    """Whether the follower holds its connection to the server now."""
    read_to_end_s_ago: float | None
    """Seconds since the last read of the log to its end began; None before the first."""


@dataclass(frozen=True, slots=True)
class DaemonStats:
    """What ``/v1/stats`` says: the state, the store's counts once it is loaded, the models."""

    state: State
    uptime_s: float
    data_dir: str
    store: str
    """Where the memories live (``Settings.store_description``: the SQLite file, or a
    PostgreSQL URL without its password)."""
    counts: Stats | None = None
    embedder: str | None = None
    korean_analyzer: str | None = None
    learned_words: list[str] | None = None
    embedder_note: str | None = None
    reranker: dict[str, Any] | None = None
    downloads: dict[str, Any] | None = None
    stale: str | None = None
    """Why the counts and what recall serves may lag a shared store that does not answer."""
    stores: list[federation.StoreStats] | None = None
    """Each store's own counts, when personal and team namespaces live apart (``counts`` is
    their sum)."""
    replica: str | None = None
    """A shared store's local read replica: ``filling`` or ``ready`` (its path follows)."""
    change_log: ChangeLog | None = None
    """Where the daemon is in a shared store's change log (None: it follows none, or not yet)."""

    def as_dict(self) -> dict[str, Any]:
        """One flat JSON object: the store's counts beside the daemon's own fields, and no
        field the daemon has nothing to say about."""
        out: dict[str, Any] = {"state": self.state, "uptime_s": self.uptime_s, "data_dir": self.data_dir,
                               "store": self.store}
        if self.counts is not None:
            out.update(render(self.counts))
        for name in ("embedder", "korean_analyzer", "learned_words", "embedder_note", "reranker", "downloads",
                     "stale", "stores", "replica", "change_log"):
            value = getattr(self, name)
            if value is not None:
                out[name] = render(value)
        return out


@dataclass(frozen=True, slots=True)
class Prompt:
    """One MCP prompt as ``prompts/list`` shows it (keymem's take no arguments)."""

    name: str
    description: str
    arguments: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PromptTurn:
    role: Literal["user", "assistant"]
    content: dict[str, Any]
    """An MCP content block: ``{"type": "text", "text": ...}``."""


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    description: str
    messages: list[PromptTurn]


def _memories_held(graph: MemoryGraph) -> int:
    """Every memory row of the store (superseded and expired ones too)."""
    return int(graph.store.read(lambda reader: reader.memory_rows()))


@dataclass(slots=True)
class _NamespaceMap:
    mtime: float = -1.0
    mapping: dict[str, list[str]] = field(default_factory=dict)


class _ImportCancelled(Exception):
    """Raised from an import's progress report once its client has gone away."""


class Service:
    """Everything the daemon does, behind its HTTP routes."""

    def __init__(self, settings: Settings, *, clock: Clock = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.state: State = "starting"
        self.error: str | None = None
        # What a long load is doing (re-embedding the store for a new embedder), for /health.
        self.detail: str | None = None
        self.started_at = clock()
        self.graph: MemoryGraph | None = None
        # Personal namespaces in SQLite (``graph``), team ones in PostgreSQL (KEYMEM_TEAM_NAMESPACES).
        self.federation: federation.Federation | None = None
        self.embedder_note: str | None = None
        self.reranker: Any = None
        self.progress: Any = None
        self.activity: activity_log.ActivityLog | None = None
        self._namespaces = _NamespaceMap()
        self._lock = threading.Lock()
        # What the start found that the user must know (an empty store next to full backups).
        self._start_warnings: list[str] = []
        # Where the copy of a store deleted under the daemon was saved (``watch_store``).
        self._rescued: str | None = None
        # The shared store's change-log follower and its repository (KEYMEM_STORE_URL only).
        self._follower: Any = None
        self._team: Any = None
        # What looks for a server that did not answer at start (store/postgres/offline.py).
        self._connector: Any = None
        self._roots = transcripts.TranscriptRoots.from_settings(settings)
        # What the push path surfaced in each host session, so it says nothing twice.
        self.sessions = push.SessionMemory(ttl=settings.inject_session_ttl, clock=clock)

    # -- lifecycle ------------------------------------------------------------------------

    def load(self) -> None:
        """Load the embedder and the store (blocking; the daemon runs it in a thread)."""
        from keymem_daemon.engine.text import default_analyzer
        from keymem_daemon.inference.download import DownloadProgress
        from keymem_daemon.inference.embedders import CachedEmbedder, load_embedder_or_default, single_threaded_blas
        from keymem_daemon.inference.reranker import RerankerManager

        started = time.perf_counter()
        single_threaded_blas()
        try:
            self.progress = DownloadProgress()
            embedder, note = load_embedder_or_default(self.settings, progress=self.progress)
            self.embedder_note = note
            if note:
                logger.warning("%s", note)
            self.reranker = RerankerManager(self.settings, progress=self.progress)
            # auto/true: use the cached model, or fetch it in the background (never blocking).
            self.reranker.start()
            reranker = self.reranker if self.settings.rerank != "false" else None
            cached = CachedEmbedder(embedder)
            if self.settings.store_url is not None and not self.settings.federated:
                graph = self._open_team_store(cached, reranker)
            else:
                graph = MemoryGraph.over(
                    opening.open_sqlite(self.settings), cached, self.settings, clock=self.clock,
                    reranker=reranker, progress=self._re_embedding)
                self._compare_with_backups(graph)
                if self.settings.federated:
                    try:
                        self.federation = federation.Federation(graph, self._open_team_store(cached, reranker),
                                                                self.settings)
                    except BaseException:
                        graph.close()
                        raise
            graphs = self.federation.graphs if self.federation is not None else (graph,)
            if any(g.has_hangul_content() for g in graphs):
                default_analyzer().preload_kiwi()
            # One query end to end, so the first real request does not pay for cold caches.
            for each in graphs:
                hybrid.hybrid_recall(each, "warm up", reinforce=False)
            self.activity = activity_log.ActivityLog(graph.store, self.settings.activity_log, clock=self.clock)
            self.graph = graph
            # What the load built lives as long as the daemon: once its garbage is gone, the
            # collector stops walking it. A full collection walked all of it (the key index,
            # the vector tables' id lists and maps): at 10k memories 2 in 120 injects paid
            # 37-98 ms each (load 20), and 1-11 ms after the freeze.
            gc.collect()
            gc.freeze()
            self.detail = None
            self.state = "ready"
            logger.info("ready in %.2f s (embedder %s)", time.perf_counter() - started, embedder.fingerprint)
        except Exception as exc:
            self.state = "failed"
            self.error = str(exc)
            logger.exception("loading failed")

    def _open_team_store(self, embedder: Any, reranker: Any) -> MemoryGraph:
        """The engine over the PostgreSQL store at ``KEYMEM_STORE_URL`` (schema brought up to
        date), following its change log from before the load so that no other daemon's write
        is missed: what it changes reaches this daemon's in-memory tables. A server that does
        not answer does not stop the start: the engine opens on the local replica an earlier
        run kept (or on nothing), possibly stale, and ``Connector`` looks for the server with
        backoff (``_caught_up`` once it answers). A local replica a previous run left current
        (store/postgres/resume.py) is loaded instead of the server's tables, and the change
        log read from its cursor before the daemon serves."""
        from keymem_daemon.store.postgres.offline import REPLICA_FILE, Connector, FailoverRepository, Replica

        url = self.settings.store_url
        assert url is not None
        path = self.settings.data_dir / REPLICA_FILE
        try:
            server = opening.open_postgres(url, self.settings)
        except StoreUnavailable as exc:
            logger.warning("%s; starting on this daemon's local replica, and trying the server again", exc)
            store = FailoverRepository(None, Replica.kept(path, describe_store_url(url)), where=describe_store_url(url))
            with store.on_replica():
                graph = MemoryGraph.over(store, embedder, self.settings, clock=self.clock, reranker=reranker,
                                         progress=self._re_embedding)
            self._team = store
            self._connector = Connector(lambda: opening.open_postgres(url, self.settings),
                                        lambda server: self._caught_up(graph, store, server))
            self._connector.start()
            return graph
        try:
            # Reads while the server does not answer come from a local copy (offline.py); one
            # a previous run left current is resumed (store/postgres/resume.py).
            replica, cursor = Replica.resume(path, server)
            store = FailoverRepository(server, replica)
            store.resumed = cursor is not None
            if cursor is None:
                cursor = server.change_cursor()
        except BaseException:
            server.close()
            raise
        graph = MemoryGraph.over(store, embedder, self.settings, clock=self.clock, reranker=reranker,
                                 progress=self._re_embedding)
        self._team = store
        self._start_following(graph, store, cursor)
        return graph

    def _start_following(self, graph: MemoryGraph, store: Any, cursor: int) -> None:
        from keymem_daemon.store.postgres.changes import ChangeFollower

        url = self.settings.store_url
        assert url is not None
        self._follower = store.follower = ChangeFollower(url, cursor, lambda batch: self._follow(graph, store, batch),
                                                         on_cursor=store.replica.note_position)
        if store.replica.ready:  # resumed: current up to ``cursor``
            try:
                self._follower.catch_up()
            except Exception as exc:  # the thread catches up once the server answers
                logger.warning("could not read the change log since the local replica's position (%s)", exc)
        else:
            # The fill first: the changes the follower reads meanwhile wait for it (not a second fill).
            store.replica.fill_in_background()
        self._follower.start()

    def _caught_up(self, graph: MemoryGraph, store: Any, server: Any) -> None:
        """The server answers after a start without it: what opening the engine does is done
        on it (the embedder's stamp, the vocabulary, duplicate keys), the in-memory tables are
        loaded again from it, and the change log followed from before that load (the connector's
        thread; a ``StoreError`` leaves the daemon as it was, to be tried again)."""
        cursor = server.change_cursor()
        store.attach(server)
        try:
            with store.from_server():
                graph.ensure_embedding_space(self._re_embedding)
                graph.load_vocabulary()
                graph.merge_duplicate_keys()
                graph.reload_indexes()
        except BaseException:
            store.detach()
            raise
        self._start_following(graph, store, cursor)
        logger.info("the store at %s answers: following it again", store.where)

    @staticmethod
    def _follow(graph: MemoryGraph, store: Any, batch: list[Any]) -> None:
        """Apply a batch of the change log (``store.postgres.changes.Change``) to the tables
        (reading the server, whatever ``store`` serves other reads from) and the replica."""
        # A link whose weight changed (recall reinforces the links it used) changes none of them.
        memories = [c.id for c in batch if c.kind in ("memory", "relation") or (c.kind == "link" and c.op != "update")]
        keys = [c.id for c in batch if c.kind in ("key", "alias")]
        if memories or keys:
            removals = any(c.op == "delete" and c.kind in ("memory", "link") for c in batch)
            with store.from_server():
                graph.follow_changes(memories, keys, removals=removals)
        store.replica.apply(batch)

    def stale(self) -> str | None:
        """Why what this daemon serves may lag the shared store (None: it follows it)."""
        team, url = self._team, self.settings.store_url
        why = team.offline() if team is not None else None
        if why is None or url is None:
            return None
        reads = {
            "ready": "reads come from this daemon's local replica",
            "kept": "reads come from the local replica this daemon kept from its last run (filled "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(team.replica.kept_at or 0))}, "
                    "nothing newer)",
            "empty": "this daemon holds no copy of it (no local replica from an earlier run): reads find none "
                     "of its memories",
        }.get(team.replica.state, "reads come from the part of this daemon's local replica filled before it "
                                  "went away (what was not copied yet is not found)")
        refused = self._connector.refused if self._connector is not None else None
        if refused is not None:  # the server answered and refused this daemon: no retry cures it
            return f"possibly stale: {refused}; {reads} and writes fail until it is fixed and keymemd restarted"
        return (f"possibly stale: {team.unavailable(why)}; {reads} and writes fail until it is back (it "
                "reconnects by itself)")

    def _stale_since(self, before: str | None) -> str | None:
        """``stale`` for an answer whose work began when ``stale`` said ``before``: marked when
        either says so. A daemon that caught up while the answer was being made (the change
        log read, the replica and the tables in step) may have read the replica -- which held
        a memory forgotten or superseded meanwhile -- before it did."""
        return self.stale() or before

    def _compare_with_backups(self, graph: MemoryGraph) -> None:
        """A start on a store without memories next to a backup with some says so loudly: the
        store file was probably deleted or emptied, and a new one was made in its place."""
        held = _memories_held(graph)
        if held:
            return
        best = backups.newest_holding_more(self.settings.backup_dir, held)
        if best is None:
            return
        found = {"missing": "did not exist", "empty": "was an empty (zero-length) file"}.get(
            graph.store.found, "holds no memories")
        message = (f"{self.settings.db_path} {found} at start, but the backup {best.path} holds {best.memories} "
                   f"memories. To get them back: keymemd restore {best.path.name} (it stops keymemd, keeps the "
                   "current store aside and starts again on the backup). To start afresh instead, delete the "
                   "backups; until then backup rotation keeps that one.")
        logger.error("%s", message)
        self._start_warnings.append(message)

    def warnings(self) -> list[str]:
        """What is wrong with the store, or was repaired in it at start, for /health."""
        out = list(self._start_warnings)
        stale = self.stale()
        if stale is not None:
            out.append(stale)
        graph = self.graph
        if graph is not None:
            out.extend(graph.repairs)
            lost = graph.store.check_files()
            if lost is not None:
                saved = (f"The daemon still had the old file open and saved a copy of it: {self._rescued}. "
                         if self._rescued else "")
                out.append(f"{lost}. {saved}Restore a backup from {self.settings.backup_dir} with: keymemd restore "
                           "(it stops keymemd, puts the newest good backup in place and starts again)")
        return out

    def watch_store(self) -> None:
        """The scheduler's check that the store file is still the one at its path; once it is
        not, save what the daemon still holds open to ``backups/`` (once)."""
        graph = self.graph
        if graph is None or graph.store.check_files() is None or self._rescued is not None:
            return
        target = self.settings.backup_dir / f"keymem-rescued-{backups.stamp(self.clock())}.db"
        graph.store.backup_to(target)
        self._rescued = str(target)
        logger.error("saved a copy of the store the daemon still had open to %s", target)

    def _re_embedding(self, kind: str, done: int, total: int) -> None:
        self.detail = f"re-embedding the store for a new embedder: {done}/{total} ({kind})"
        logger.info("re-embedding %s: %d/%d", kind, done, total)

    def close(self) -> None:
        connector, self._connector = self._connector, None
        if connector is not None:
            connector.stop()
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()
        if self.reranker is not None:
            self.reranker.close()
        graph, self.graph = self.graph, None
        federated, self.federation = self.federation, None
        log, self.activity = self.activity, None
        if log is not None:
            log.close()
        if federated is not None:
            federated.close()
        if graph is not None:
            graph.close()
        # What load froze may be garbage now (a process that opens services one after another).
        gc.unfreeze()

    def ready_graph(self) -> MemoryGraph:
        if self.graph is None:
            if self.state == "failed":
                raise NotReady(f"keymem failed to load: {self.error}")
            raise NotReady("keymem is still loading its store and models; retry in a moment")
        return self.graph

    def health(self) -> Health:
        from keymem_daemon import __version__

        return Health(self.state, __version__, os.getpid(), error=self.error or None,
                      detail=self.detail if self.detail and self.state == "starting" else None,
                      warnings=self.warnings() or None)

    # -- host identity --------------------------------------------------------------------

    def host(self, agent: str | None, session: str | None, cwd: str | None) -> Host:
        """Who is calling, from request headers; the turn is read from the host's transcript
        only when transcript access is allowed."""
        if agent not in transcripts.AGENTS or not session or not transcripts.is_uuid(session):
            return Host(cwd=cwd)
        turn = 0
        if self.settings.transcript_access != "false":
            try:
                turn = max(0, transcripts.count_turns(self._roots, agent, session) - 1)
            except (OSError, KeymemError):
                turn = 0
        return Host(agent=agent, session=session.lower(), turn=turn, cwd=cwd)

    # -- tools, instructions, prompts -----------------------------------------------------

    def tool_definitions(self, host: Host) -> list[dict[str, Any]]:
        return tools.definitions(self.settings, host)

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None, host: Host,
                  idempotency_key: str | None = None, *, actor: str | None = None) -> tools.Outcome:
        """``actor`` names the caller in the activity log (default: the host agent)."""
        if name not in tools.TOOLS_BY_NAME:
            raise NotFound(f"Unknown tool: {name}")
        idempotency = IdempotencyKey.of_call(idempotency_key, name, arguments) \
            if idempotency_key and name in tools.WRITE_TOOLS else None
        graph = self.ready_graph()
        federated = self.federation
        logged = self.activity is not None and self.activity.enabled and name in activity_log.LOGGED_TOOLS
        args = arguments if isinstance(arguments, Mapping) else {}
        forgotten = None
        stale_before = self.stale()  # the reads may come from the replica: see _stale_since
        if logged and name == "forget" and isinstance(args.get("memory_id"), str):
            owner = federated.for_memory(args["memory_id"]) if federated is not None else graph
            memory = owner.store.read(lambda reader: reader.memory(args["memory_id"]))
            forgotten = memory.content if memory is not None else None
        if federated is not None:
            outcome = federated.call_tool(name, arguments, host, idempotency)
        else:
            outcome = tools.call_tool(tools.Context(graph, self.settings, host, idempotency), name, arguments)
        stale = self._stale_since(stale_before)
        if stale is not None and isinstance(outcome.result, dict):
            outcome = dataclasses.replace(outcome, result={**outcome.result, "stale": stale})
        if logged and not outcome.is_error and self.activity is not None:
            entry = activity_log.describe_tool_call(name, args, outcome.result, forgotten=forgotten,
                                                    actor=actor or host.agent or "agent")
            if entry is not None:
                self.activity.record(name, entry[0], entry[1], memory_id=entry[2])
        return outcome

    def stats_line(self) -> str:
        if self.graph is None:
            return "still loading"
        return (self.federation.stats() if self.federation is not None else self.graph.stats()).summary()

    def instructions(self, *, hook_installed: bool | None = None) -> str:
        """``hook_installed``: what the calling host says (None: the daemon's setting)."""
        hooked = self.settings.hook_installed if hook_installed is None else hook_installed
        return instructions.instructions(self.stats_line(), hook_installed=hooked)

    def prompts(self) -> list[Prompt]:
        return [Prompt(instructions.PROMPT_NAME, instructions.PROMPT_DESCRIPTION)]

    def get_prompt(self, name: str, *, hook_installed: bool | None = None) -> RenderedPrompt:
        if name != instructions.PROMPT_NAME:
            raise NotFound(f"Unknown prompt: {name}")
        hooked = self.settings.hook_installed if hook_installed is None else hook_installed
        text = instructions.prompt_text(self.stats_line(), hook_installed=hooked)
        return RenderedPrompt(instructions.PROMPT_DESCRIPTION,
                              [PromptTurn("user", {"type": "text", "text": text})])

    # -- push path ------------------------------------------------------------------------

    def namespace_map(self) -> dict[str, list[str]]:
        """``namespaces.json``, re-read when it changes; an unreadable file maps nothing."""
        path = self.settings.namespaces_path
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return {}
        with self._lock:
            if mtime != self._namespaces.mtime:
                try:
                    mapping = query.parse_namespaces_file(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    logger.warning("ignoring %s: %s", path, exc)
                    mapping = {}
                self._namespaces = _NamespaceMap(mtime, mapping)
            return self._namespaces.mapping

    def inject(self, request: InjectRequest) -> push.InjectResult:
        """The push path for one prompt; with a session id, what that session was already
        shown is held back, and what this prompt surfaces is remembered for it."""
        graph = self.ready_graph()
        project: frozenset[str] = frozenset()
        if request.namespace is not None and request.namespace.strip():
            scope = query.scope_of(graph.resolve_namespace(request.namespace))
        else:
            scope = query.namespaces_for_cwd(self.namespace_map(), request.cwd)
            project = (scope or frozenset()) - {"default"}
        max_chars = request.max_chars or self.settings.inject_max_chars
        session = self.sessions.view(request.session_id) if request.session_id else None
        stale_before = self.stale()
        top_k, max_chars = limits.INJECT_TOP_K.clamp(request.top_k), limits.INJECT_MAX_CHARS.clamp(max_chars)
        if self.federation is not None:
            result = self.federation.inject(request.prompt, scope=scope, top_k=top_k, max_chars=max_chars,
                                            project=project, session=session)
        else:
            result = push.inject(graph, request.prompt, scope=scope, top_k=top_k, max_chars=max_chars,
                                 project=project, session=session)
        stale = self._stale_since(stale_before)
        if stale is not None:
            result = dataclasses.replace(result, stale=stale)
        if request.session_id and result.skipped is None:
            self.sessions.record(request.session_id, [m.id for m in result.memories])
        if self.activity is not None and self.activity.enabled:
            summary, detail = activity_log.describe_injection(dataclasses.asdict(request), render(result))
            self.activity.record("inject", summary, detail)
        return result

    # -- operations -----------------------------------------------------------------------

    def stats(self) -> DaemonStats:
        loaded: dict[str, Any] = {}
        if self.graph is not None:
            from keymem_daemon.engine.text import default_analyzer

            stores = self._store_stats()
            counts = stores[0].counts if len(stores) == 1 else None
            if len(stores) > 1 and all(s.counts is not None for s in stores):
                counts = federation.sum_stats([s.counts for s in stores if s.counts is not None])
            loaded = {"counts": counts, "stores": stores if len(stores) > 1 else None,
                      "embedder": self.graph.embedder.fingerprint,
                      "korean_analyzer": "loaded" if default_analyzer().kiwi_loaded else "not loaded (no Korean yet)",
                      "learned_words": sorted(self.graph.analyzer.learned)}
        return DaemonStats(
            self.state, round(self.clock() - self.started_at, 1), str(self.settings.data_dir),
            self.settings.store_description, **loaded,
            embedder_note=self.embedder_note or None,
            reranker=self.reranker.status() if self.reranker is not None else None,
            downloads=self.progress.as_dict() if self.progress is not None else None, stale=self.stale(),
            replica=self._team.replica.describe() if self._team is not None else None,
            change_log=self._change_log())

    def _change_log(self) -> ChangeLog | None:
        follower = self._follower
        if follower is None:
            return None
        ago = time.monotonic() - follower.caught_up_at
        return ChangeLog(follower.cursor, follower.connected, round(ago, 1) if ago != float("inf") else None)

    def _store_stats(self) -> list[federation.StoreStats]:
        """Each store's counts (None for a shared store that does not answer: ``stale`` says so)."""
        assert self.graph is not None
        named = [(self.settings.store_description, self.graph)]
        if self.federation is not None:
            named = [(self.federation.describe(graph), graph) for graph in self.federation.graphs]
        out = []
        for where, graph in named:
            try:
                counts: Stats | None = graph.stats()
            except StoreError:
                counts = None
            out.append(federation.StoreStats(where, counts))
        return out

    def export(self, *, include_vectors: bool = False) -> dict[str, Any]:
        """The store's export; with team namespaces apart, the local store's (as importable as
        ever), the team store's under ``team``, each naming its store. Refused while a shared
        store's server is down: the local replica holds no idempotency records nor activity, and
        may lag the server, so an export from it would look whole and not be."""
        graph = self.ready_graph()
        stale = self.stale()
        if stale is not None:
            raise StoreUnavailable(f"an export needs the server: {stale}")
        out = transfer.export(graph, include_vectors=include_vectors)
        if self.federation is not None and self.settings.store_url is not None:
            out["store"] = f"sqlite {self.settings.db_path}"
            out["team"] = {"store": describe_store_url(self.settings.store_url),
                           **transfer.export(self.federation.team, include_vectors=include_vectors)}
        return out

    def import_(self, data: Any, *, progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise InvalidInput("the import must be a JSON object (a keymem export or an upstream graph.json)")
        graph = self.ready_graph()
        cut = self.federation.import_parts(data) if self.federation is not None else None
        parts = cut.parts if cut is not None else [(graph, data)]
        results = transfer.import_parts(parts, progress=progress, placed=cut.placed if cut is not None else None)
        for part, _ in parts:
            part.store.analyze()  # a bulk load changes what the planner should pick
        result = results[0] if len(results) == 1 else transfer.sum_results(results)
        left_out = cut.across.report() if cut is not None else None
        if left_out is not None:
            result["not_imported"] = left_out
        if self.activity is not None:
            self.activity.record("import", f"imported: {json.dumps(result, ensure_ascii=False)[:IMPORT_SUMMARY_CHARS]}",
                                 {"result": result})
        return result

    def import_events(self, data: Any, *, cancelled: threading.Event | None = None) -> Iterator[str]:
        """Run an import in a worker thread, yielding NDJSON lines as it goes: progress
        events, then one ``done`` (with the counts) or ``error`` line.

        ``cancelled`` (set when the client goes away: Ctrl+C, SIGTERM, a closed connection)
        stops the import at its next progress report, before its transaction: nothing is
        written."""
        lines: queue.Queue[str | None] = queue.Queue()
        phase = "validating"

        def progress(step: str, done: int, total: int) -> None:
            nonlocal phase
            if cancelled is not None and cancelled.is_set():
                raise _ImportCancelled
            phase = step
            lines.put(json.dumps({"event": "progress", "phase": step, "done": done, "total": total}))

        def work() -> None:
            try:
                result = self.import_(data, progress=progress)
                lines.put(json.dumps({"event": "done", "result": result}))
            except _ImportCancelled:
                logger.info("import cancelled: the client went away; nothing was imported")
            except KeymemError as exc:
                lines.put(json.dumps({"event": "error", "error": {"code": exc.code, "message": exc.message}}))
            except Exception as exc:
                logger.exception("import failed")
                lines.put(json.dumps({"event": "error", "error": {
                    "code": "internal",
                    "message": f"the import failed after the step {phase!r}: {type(exc).__name__}: {exc} "
                               "(nothing was imported; the log has the traceback)"}}))
            finally:
                lines.put(None)

        threading.Thread(target=work, name="keymem-import", daemon=True).start()
        while (line := lines.get()) is not None:
            yield line

    def cleanup(self) -> dict[str, Any]:
        graph = self.ready_graph()
        result: dict[str, Any] = render(self.federation.cleanup_expired() if self.federation is not None
                                        else graph.cleanup_expired())
        if self.activity is not None:
            result["pruned_activity"] = self.activity.prune()
        self.ready_graph().store.analyze()
        return result

    def checkpoint(self) -> None:
        if self.graph is not None:
            self.graph.store.checkpoint()

    def backup(self) -> str | None:
        """An online backup under <data>/backups, keeping the newest ``backup_keep``."""
        graph = self.graph
        if graph is None or graph.store.check_files() is not None:
            return None  # a store deleted under the daemon is saved once, by watch_store
        if self.settings.store_url is not None and self.federation is None:
            return None  # the PostgreSQL server keeps the data: its own backups (pg_dump) apply
        target = self.settings.backup_dir / f"keymem-{backups.stamp(self.clock())}.db"
        graph.store.backup_to(target)
        backups.rotate(self.settings.backup_dir, self.settings.backup_keep, _memories_held(graph))
        logger.info("backup written to %s", target)
        return str(target)
