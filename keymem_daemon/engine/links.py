"""The link-weight policy: how strongly a key leads to a memory, and how use changes that.

A link starts at ``LINK_DEFAULT`` and stays within ``[LINK_MIN, LINK_MAX]``: never severed
(a dismissed memory stays reachable by its other keys), never so strong that one key's history
drowns the similarity of a new query. Reads move weights a little (the key that led to a memory
that was read grows; members a query passed over fade), explicit feedback more.
"""
from __future__ import annotations

from typing import Final

LINK_DEFAULT: Final = 1.0
LINK_MIN: Final = 0.1
LINK_MAX: Final = 3.0
# read_memory through a key, and the top recall result's links to the matched keys.
REINFORCE: Final = 0.1
# A recall result reached through a hop: its connecting link, half a direct reinforcement.
HOP_REINFORCE: Final = 0.05
# Members of a matched key that a recall did not return: a slow fade, 1/20 of a reinforcement.
EXPLORED_DECAY: Final = 0.005
# dismiss: three reads' worth, so one dismissal outweighs a few accidental traversals.
DISMISS: Final = 0.3
# A correction inheriting its predecessor's links: a little weaker, since the text changed.
CORRECT_PENALTY: Final = 0.15


def clamp_weight(weight: float) -> float:
    """``weight`` within the bounds every link keeps."""
    return min(LINK_MAX, max(LINK_MIN, weight))


def reinforced_weight(weight: float) -> float:
    """A link a reader followed to the memory."""
    return clamp_weight(weight + REINFORCE)


def dismissed_weight(weight: float) -> float:
    """A link the agent dismissed as not leading to the memory (never below the floor)."""
    return max(LINK_MIN, weight - DISMISS)


def inherited_weight(weight: float) -> float:
    """The weight a correction's link starts at, from its predecessor's link to the same key."""
    return max(LINK_MIN, weight - CORRECT_PENALTY)
