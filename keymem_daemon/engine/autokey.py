"""Autokey: keys learn the words people actually search with.

When ``recall`` reaches a key only weakly (semantically, or just under the gate), the
query and the key's score go into a short-lived ``RecallBuffer``. If the agent then reads a
memory through that key (``read_memory(via_key_id=...)``), the read confirms the match: the
query gains a count on the key's candidate ledger. After ``promote_n`` confirmations it is
promoted: to an alias when it is close to the key, to a key of its own when it is a
distinct but related concept, or to an alias again when it only cleared the confirm floor.
``dismiss`` takes a pending confirmation back.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from keymem_daemon.engine.text import is_short_concept

BUFFER_CAPACITY: Final = 32
BUFFER_TTL: Final = 300.0

Promotion = Literal["none", "alias", "new_key"]


@dataclass(slots=True)
class _Entry:
    ts: float
    query: str
    scores: dict[str, float]


@dataclass(frozen=True, slots=True)
class WeakMatch:
    query: str
    score: float


class RecallBuffer:
    """Recent weak key matches, newest first; each (query, key) is consumed at most once."""

    def __init__(self, clock: Callable[[], float], *, capacity: int = BUFFER_CAPACITY,
                 ttl: float = BUFFER_TTL) -> None:
        self._clock = clock
        self._ttl = ttl
        self._entries: deque[_Entry] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def push(self, query: str, scores: Mapping[str, float]) -> None:
        if scores:
            with self._lock:
                self._entries.append(_Entry(self._clock(), query, dict(scores)))

    def consume(self, key_id: str) -> WeakMatch | None:
        """The newest fresh match of ``key_id``, removed so one recall confirms once."""
        cutoff = self._clock() - self._ttl
        with self._lock:
            for entry in reversed(self._entries):
                if entry.ts < cutoff:
                    continue
                score = entry.scores.pop(key_id, None)
                if score is not None:
                    return WeakMatch(entry.query, score)
        return None


@dataclass(frozen=True, slots=True)
class PromotionRule:
    promote_n: int
    alias_at: float
    new_key_at: float
    confirm_floor: float
    max_aliases: int


def decide_promotion(count: int, query: str, cosine: float, learned: int, rule: PromotionRule) -> Promotion:
    """What ``count`` confirmations of ``query`` at ``cosine`` earn (boundaries inclusive)."""
    if count < rule.promote_n or not is_short_concept(query):
        return "none"
    under_cap = learned < rule.max_aliases
    if cosine >= rule.alias_at:
        return "alias" if under_cap else "none"
    if cosine >= rule.new_key_at:
        return "new_key"
    if cosine >= rule.confirm_floor:
        return "alias" if under_cap else "none"
    return "none"
