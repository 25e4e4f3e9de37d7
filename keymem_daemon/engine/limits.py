"""Every clamp and cap of keymem's inputs, each stated once with its reason.

The tool schemas (``mcp/tools.py``) publish these ranges to the agent, the request bodies
(``http/schemas.py``) validate with them, and the engine clamps with them, so a range
changes in one place. ``tests/unit/test_limits.py`` checks that every schema states exactly
these and that no other module spells the numbers again.

Only the standard library here, and no engine imports: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class Bounds:
    """An integer's bounds: values outside are clamped into them (tools, the engine) or
    refused (request bodies, settings)."""

    low: int
    high: int

    def clamp(self, value: int) -> int:
        return min(self.high, max(self.low, value))

    def schema(self) -> dict[str, Any]:
        """The JSON-schema fragment of an integer within these bounds."""
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


@dataclass(frozen=True, slots=True)
class IntRange:
    """An integer argument's bounds and what an omitted one means."""

    low: int
    high: int
    default: int

    def clamp(self, value: int) -> int:
        return min(self.high, max(self.low, value))

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high, "default": self.default}


@dataclass(frozen=True, slots=True)
class FloatRange:
    """A number argument's range (clamped into it); ``default`` when omitted."""

    low: float
    high: float
    default: float

    def clamp(self, value: float) -> float:
        return min(self.high, max(self.low, value))

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": self.low, "maximum": self.high, "default": self.default}


# -- reads --------------------------------------------------------------------------------

RECALL_TOP_K: Final = IntRange(1, 20, 8)
"""Key clusters one ``recall`` returns: past 20 an agent reads a list, not an answer."""
HYBRID_TOP_K: Final = IntRange(1, 50, 5)
"""Memories one ``recall_memories`` returns (the extended surface's direct recall)."""
HOPS: Final = IntRange(1, 5, 2)
"""Expansion steps along narrow keys: each hop widens the pool; past 5 it is the whole store."""
MIN_REL_SCORE: Final = FloatRange(0, 0.9, 0)
"""Floor relative to the best hit's score; below 1, so the floor never keeps the top hit alone."""
MIN_DEPTH: Final = FloatRange(0, 1, 0)
"""Depth is a share of full reinforcement, so 0..1."""
MAX_RECALL_QUERY_CHARS: Final = 2000
"""``recall``'s query is a few noun keywords; past 2,000 characters it is pasted text."""
MAX_QUERY_CHARS: Final = 4000
"""A query (or its context) is planned from at most this much text: more is a pasted
document, whose tail adds cost and noise but no better keys."""
BROWSE_LIMIT: Final = IntRange(1, 100, 20)
"""Keys per ``browse_keys`` page."""
READ_KEY_LIMIT: Final = IntRange(1, 50, 10)
"""Memory handles per ``read_key`` page."""
LIST_LIMIT: Final = IntRange(1, 500, 50)
"""Memories per ``list_memories`` page."""
OFFSET: Final = IntRange(0, 1_000_000, 0)
"""How far a key-level page may start: no key holds a million memories."""
LIST_OFFSET: Final = IntRange(0, 10_000_000, 0)
"""How far a store-wide ``list_memories`` page may start."""
SESSIONS_LIMIT: Final = IntRange(1, 200, 20)
"""Host sessions one ``list_sessions`` lists."""
TURNS_LIMIT: Final = Bounds(1, 500)
"""Turns one ``get_conversation`` page holds (its default is the transcript page size)."""
TURN: Final = Bounds(0, 10_000_000)
"""The turn numbers a ``get_conversation`` may name."""

# -- the push path --------------------------------------------------------------------------

INJECT_TOP_K: Final = IntRange(1, 10, 2)
"""Memories one prompt may surface: the block sits in front of every prompt, so a few."""
INJECT_MAX_CHARS: Final = Bounds(256, 20000)
"""Size of the rendered block (``recall``'s shown memory too): below 256 no memory line fits,
past 20,000 the block crowds out the prompt. The default is ``KEYMEM_INJECT_MAX_CHARS``;
``config.py`` (which must not import the engine) validates the setting with the same
numbers, which ``test_limits`` checks."""

MAX_SESSION_ID_CHARS: Final = 200
"""Longest host session id ``/v1/inject`` accepts: hosts send UUIDs (36 characters); the push
path keeps what each session was shown, so the id is bounded."""

# -- writes ---------------------------------------------------------------------------------

MAX_REMEMBER_BATCH: Final = 100
"""Memories one ``remember_batch`` may carry: one transaction, one embedder batch."""
MAX_TTL_SECONDS: Final = 100 * 365 * 86400
"""The longest ttl_seconds accepted: a century. Anything longer means "never expires" (omit
the ttl), and far larger values overflow the date an expiry is shown as."""
MAX_IDEMPOTENCY_KEY: Final = 200
"""Longest Idempotency-Key header: the key is stored with the write it guards, so it is bounded;
the shim's keys are far shorter."""
IDEMPOTENCY_TTL_SECONDS: Final = 7 * 86400
"""How long a write's Idempotency-Key is remembered. The shim retries within one call
(seconds), but a client may retry after a crash or a laptop asleep for days; a week covers
that while the hourly cleanup keeps the table small."""

# -- the embedder ---------------------------------------------------------------------------

EMBED_MAX_CHARS: Final = 2000
"""What an embedder is given of one text. Its cost grows with the text (USE: 0.36 s for 19,000
characters of prose, 1.4 s for 19,000 unbroken letters, on an idle core; a 20-item batch of
those took 74 s on a loaded machine while every other write waited for the embedder), and
a long text's vector is a blur of it all anyway: a 20,000-character memory is found by its
keys and words, its vector only needs its gist. 2,000 characters are 300-400 words of prose
(bge-m3 reads at most 512 tokens of it anyway) and take under 0.15 s however they are made."""
