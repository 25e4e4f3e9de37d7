"""The memory graph: keys and memories linked N:M, with every write operation.

``MemoryGraph`` is the facade the service calls. It owns the store, the in-memory key index and
body-vector table, and the embedder; each concern lives in its own module, and the class is
assembled from them:

- ``engine/indexes.py``            the shared state, the in-memory tables and how they follow the store
- ``engine/reads/browse.py``       browse_keys, read_key, related, list_memories, stats, inspect_memory
- ``engine/writes/remember.py``    prepare, remember, remember_batch, keys and links, alias learning, hints
- ``engine/writes/feedback.py``    read_memory, confirm_memory, dismiss, forget
- ``engine/writes/versions.py``    correct
- ``engine/writes/maintenance.py`` cleanup_expired, and what opening a store repairs
- ``engine/links.py``              the link-weight policy; ``engine/validate.py`` argument checks

Each write is one ``Store.write`` transaction; the in-memory tables change in its after-commit
step. Embeddings are computed before the transaction starts, so the writer thread never waits
for a model. Retrieval (recall, hybrid recall, the push path) lives in ``engine/reads/`` and
reads through the same graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from keymem_daemon.config import Settings
from keymem_daemon.engine.indexes import Clock
from keymem_daemon.engine.ports import Repository
from keymem_daemon.engine.reads.recall import rank_key_members
from keymem_daemon.engine.records import ReadKeyResult
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.engine.writes.maintenance import Maintenance
from keymem_daemon.errors import InvalidInput
from keymem_daemon.inference.embedders import Embedder

# read_key ranks at least KEY_POOL_MIN members of a key, and KEY_POOL_PAGES times the pages
# asked for: the within-key rank of a page depends on members ranked beyond it.
KEY_POOL_MIN: Final = 100
KEY_POOL_PAGES: Final = 3


class MemoryGraph(Maintenance):
    """The engine. Thread-safe: writes go through the store's writer, reads are snapshots."""

    @classmethod
    def over(
        cls,
        store: Repository,
        embedder: Embedder,
        settings: Settings,
        *,
        clock: Clock = time.time,
        analyzer: Analyzer | None = None,
        reranker: Any = None,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> MemoryGraph:
        """The engine over an opened store (any ``ports.Repository``: ``store/opening.py``
        opens SQLite or PostgreSQL, the fast test tier passes its in-memory one), once its
        embedding space, vocabulary, keys and in-memory indexes are checked and loaded; the
        store is closed if that fails."""
        try:
            graph = cls(store, embedder, settings, clock=clock, analyzer=analyzer, reranker=reranker)
            graph.ensure_embedding_space(progress)
            graph.load_vocabulary()
            graph.merge_duplicate_keys()
            graph.load_indexes()
        except BaseException:
            store.close()
            raise
        return graph

    def close(self) -> None:
        self.store.close()

    def read_key(self, key_id: object, *, query: object = None, namespace: object = None, limit: int = 10,
                 offset: int = 0) -> ReadKeyResult:
        """The memories under one key, ranked, as handles (never content)."""
        kid = self.check_key_id(key_id)
        if query is not None and not isinstance(query, str):
            raise InvalidInput("query must be a string", field="query")
        ns = self.resolve_namespace(namespace)
        # Score enough of a hub to fill the requested page, with room to spare.
        ranked, total = rank_key_members(self, kid, query.strip() if isinstance(query, str) and query.strip()
                                         else None, ns, pool=max(KEY_POOL_MIN, KEY_POOL_PAGES * (offset + limit)))
        return self.key_page(kid, ranked, total, limit=limit, offset=offset)
