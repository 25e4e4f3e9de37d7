"""The read path's entry points under their old names, for the tests and scripts that import
them from here; the code lives in ``engine/reads/`` (query, channels, signals, hybrid,
recall, inject). New code imports from there."""

from __future__ import annotations

from keymem_daemon.engine.ports import Scope
from keymem_daemon.engine.reads.channels import lexical
from keymem_daemon.engine.reads.hybrid import HybridResult, hybrid_recall
from keymem_daemon.engine.reads.query import (
    MIN_CORPUS,
    PREDICATE_SHARE,
    QueryPlan,
    namespaces_for_cwd,
    parse_namespaces_file,
    plan_query,
    scope_of,
)
from keymem_daemon.engine.reads.recall import rank_key_members, recall
from keymem_daemon.engine.reads.signals import (
    REDUNDANT_COSINE,
    bounded,
    entity_mentions,
    is_comparison,
    project_task_evidence,
    without_repeats,
)

__all__ = [
    "MIN_CORPUS",
    "PREDICATE_SHARE",
    "REDUNDANT_COSINE",
    "HybridResult",
    "QueryPlan",
    "Scope",
    "bounded",
    "entity_mentions",
    "hybrid_recall",
    "is_comparison",
    "lexical",
    "namespaces_for_cwd",
    "parse_namespaces_file",
    "plan_query",
    "project_task_evidence",
    "rank_key_members",
    "recall",
    "scope_of",
    "without_repeats",
]
