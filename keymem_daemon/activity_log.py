"""The activity log: what changed in the store, and what the push path surfaced and why.

Every successful write tool (remember, correct, forget, confirm, dismiss -- from an agent
or the inspector), every import and every ``/v1/inject`` adds one entry: its kind, the
memory it concerns, a one-line summary and a JSON detail (for an injection: the prompt's
preview, each surfaced memory with its relevance and matched key, or why nothing was).

Recording never waits for the store: ``record`` puts the entry on a queue that one thread
writes in batches, so the push path pays microseconds, not a write transaction. The log is
bounded by ``KEYMEM_INJECT_LOG`` (N entries, D days): each batch trims to N; the
scheduler's cleanup drops entries older than D days; ``off`` records nothing and the next
cleanup empties the table.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from keymem_daemon.engine.ports import ActivityEntry, ActivityRow, Reader, Repository, Writer
from keymem_daemon.errors import StoreBusy, StoreUnavailable

logger = logging.getLogger(__name__)

PREVIEW_CHARS: Final = 160
"""How much of a prompt or a memory an entry keeps: enough to recognise it, not a copy."""
MAX_PAGE: Final = 500
_STOP: Final = object()


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[ActivityEntry]
    latest_id: int
    enabled: bool


class ActivityLog:
    """The bounded log of one store; ``close()`` writes what is still queued."""

    def __init__(self, store: Repository, bound: tuple[int, float] | None, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._bound = bound
        self._clock = clock
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watchers: dict[int, Callable[[], object]] = {}
        self._watch_lock = threading.Lock()
        self._watches_ended = False
        if bound is not None:
            self._thread = threading.Thread(target=self._run, name="keymem-activity", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._bound is not None

    def record(self, kind: str, summary: str, detail: Mapping[str, Any], *, memory_id: str | None = None) -> None:
        if self._thread is None:
            return
        self._queue.put(ActivityRow(self._clock(), kind, memory_id, summary,
                                    json.dumps(dict(detail), ensure_ascii=False, default=str)))

    def watch(self, wake: Callable[[], object]) -> Callable[[], None]:
        """Call ``wake`` (from the log's thread) after each batch of entries is stored, and
        once more when ``end_watches`` is called; returns the function that stops watching."""
        token = id(wake)
        with self._watch_lock:
            self._watchers[token] = wake

        def unwatch() -> None:
            with self._watch_lock:
                self._watchers.pop(token, None)

        return unwatch

    @property
    def watches_ended(self) -> bool:
        return self._watches_ended

    def end_watches(self) -> None:
        """The daemon is stopping: watchers (the live feed's streams) wake once and end."""
        self._watches_ended = True
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        with self._watch_lock:
            watchers = list(self._watchers.values())
        for wake in watchers:
            try:
                wake()
            except Exception:
                logger.exception("an activity watcher failed")

    def flush(self) -> None:
        """Return once every entry recorded so far is in the store."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        self.end_watches()
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = [item for item in items if isinstance(item, ActivityRow)]
            if rows:
                try:
                    self._store.write(functools.partial(self._insert, rows=rows))
                except (StoreUnavailable, StoreBusy) as exc:  # a server down, or a busy pool: said once a batch
                    logger.warning("%d activity entries not written: %s", len(rows), exc.message)
                except Exception:
                    logger.exception("could not write %d activity entries", len(rows))
                else:
                    self._wake_watchers()
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()
            if any(item is _STOP for item in items):
                return

    def _insert(self, writer: Writer, *, rows: list[ActivityRow]) -> None:
        assert self._bound is not None
        writer.add_activity(rows, keep=self._bound[0])

    def prune(self) -> int:
        """Drop entries older than the bound's days (all of them when the log is off)."""
        cutoff = self._clock() - self._bound[1] * 86400 if self._bound is not None else float("inf")
        return self._store.write(lambda writer: writer.prune_activity(before=cutoff))

    def page(self, *, after: int = 0, before: int | None = None, limit: int = 100, kind: str | None = None,
             memory_id: str | None = None) -> Page:
        """Entries newest first: newer than ``after``, older than ``before`` (paging back)."""
        def read(reader: Reader) -> Page:
            entries = reader.activity_entries(after=after, before=before, kind=kind, memory_id=memory_id,
                                              limit=max(1, min(MAX_PAGE, limit)))
            return Page(entries, reader.latest_activity_id(), self.enabled)

        return self._store.read(read)


# -- what an entry says ------------------------------------------------------------------

LOGGED_TOOLS: Final = frozenset({"remember", "remember_batch", "correct", "forget", "confirm_memory", "dismiss"})
"""The tools that change the store; reads are not logged."""


def describe_tool_call(name: str, arguments: Mapping[str, Any], result: Any, *, actor: str,
                       forgotten: str | None = None) -> tuple[str, dict[str, Any], str | None] | None:
    """``(summary, detail, memory_id)`` of a successful write tool call; None for a refusal
    (a result with an ``error``) or a write that changed nothing."""
    if not isinstance(result, Mapping) or "error" in result:
        return None
    detail: dict[str, Any] = {"tool": name, "actor": actor,
                              "result": {k: v for k, v in result.items() if k != "hints"}}
    content = arguments.get("content")
    if isinstance(content, str):
        detail["content"] = preview(content)
    keys = arguments.get("keys")
    if isinstance(keys, list):
        detail["keys"] = [str(k) for k in keys][:20]
    target = arguments.get("memory_id")
    memory_id = str(target) if isinstance(target, str) else None
    if name == "remember":
        memory_id = str(result.get("saved"))
        summary = f"remembered {memory_id}: {detail.get('content', '')}"
    elif name == "remember_batch":
        memory_id = None
        summary = f"remembered {result.get('saved', 0)} memories in one batch"
    elif name == "correct":
        memory_id = str(result.get("new_id"))
        summary = f"corrected {target} -> {memory_id}: {detail.get('content', '')}"
    elif name == "forget":
        if not result.get("deleted"):
            return None
        if forgotten is not None:
            detail["content"] = preview(forgotten)
        restored = f" (restored {result['restored']})" if result.get("restored") else ""
        summary = f"forgot {target}{restored}: {detail.get('content', '')}"
    elif name == "confirm_memory":
        if not result.get("confirmed"):
            return None
        summary = f"confirmed {target} ({arguments.get('evidence')})"
    else:
        summary = f"dismissed key {result.get('concept')} on {target}"
    return summary, detail, memory_id


def describe_injection(request: Mapping[str, Any], result: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """An injection: the prompt's preview, what was surfaced and why, or why nothing was.

    ``result`` is the rendered ``InjectResult``; every field it has is kept (but the block
    itself and full contents), so reasons the push path gives per memory show up as they are.
    """
    prompt = preview(str(request.get("prompt") or ""))
    memories = []
    for memory in result.get("memories") or []:
        item = {k: v for k, v in memory.items() if k != "content"}
        item["content"] = preview(str(memory.get("content") or ""))
        memories.append(item)
    detail: dict[str, Any] = {k: v for k, v in result.items() if k not in ("context", "memories")}
    detail.update(prompt=prompt, memories=memories,
                  **{k: request[k] for k in ("cwd", "namespace", "session_id", "agent") if request.get(k)})
    if memories:
        summary = f"surfaced {len(memories)} {'memory' if len(memories) == 1 else 'memories'} for “{prompt}”"
    else:
        why = result.get("skipped") or "nothing cleared the relevance floor"
        detail.setdefault("silent", why)
        summary = f"stayed silent for “{prompt}” ({why})"
    return summary, detail
