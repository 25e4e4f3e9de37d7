"""Freshness and validity: how current a memory is likely to be.

A memory decays from its last confirmation with the half-life of its decay profile
(``transient`` 7 d, ``standard`` 90 d, ``stable`` 365 d; ``permanent`` never decays).
Freshness >= 0.5 is ``fresh``, >= 0.125 ``aging``, below that ``stale``. Ranking multiplies
scores by ``0.2 + 0.8 * freshness``, so a stale fact still ranks, just behind a fresh one.
These are pure functions of their arguments; the clock is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from keymem_daemon.errors import InvalidInput

DecayProfile = Literal["transient", "standard", "stable", "permanent"]
Status = Literal["fresh", "aging", "stale"]

DECAY_PROFILES: Final[tuple[DecayProfile, ...]] = ("transient", "standard", "stable", "permanent")
FRESH_AT: Final = 0.5
AGING_AT: Final = 0.125
DAY: Final = 86400.0


@dataclass(frozen=True, slots=True)
class HalfLives:
    """Half-life in days of each decaying profile (configurable, see Settings)."""

    transient: float = 7.0
    standard: float = 90.0
    stable: float = 365.0

    def days(self, profile: DecayProfile) -> float | None:
        if profile == "permanent":
            return None
        return float(getattr(self, profile))


def parse_decay_profile(value: object, *, field: str = "decay_profile") -> DecayProfile:
    """``None`` means ``standard``; anything else must name a profile."""
    if value is None:
        return "standard"
    if isinstance(value, str) and value.strip().lower() in DECAY_PROFILES:
        return value.strip().lower()  # type: ignore[return-value]
    raise InvalidInput(
        f"Unknown decay profile: {value!r} (use one of {', '.join(DECAY_PROFILES)})", field=field
    )


def freshness(profile: DecayProfile, last_confirmed_at: float, now: float, lives: HalfLives) -> float:
    days = lives.days(profile)
    if days is None:
        return 1.0
    age = max(0.0, now - last_confirmed_at)
    return float(2.0 ** (-age / (days * DAY)))


def status_of(value: float) -> Status:
    if value >= FRESH_AT:
        return "fresh"
    if value >= AGING_AT:
        return "aging"
    return "stale"


def rank_factor(value: float) -> float:
    """``0.2 + 0.8 * freshness``: 1 -> 1.0, 0.5 -> 0.6, 0 -> 0.2."""
    return round(0.2 + 0.8 * min(1.0, max(0.0, value)), 3)


@dataclass(frozen=True, slots=True)
class Validity:
    """The ``validity`` payload shown on every view of a memory."""

    freshness: float
    status: Status
    age_days: float
    last_confirmed_at: float
    confirmation_count: int
    decay_profile: DecayProfile
    verification_recommended: bool
    verification_required: bool


def validity(
    profile: DecayProfile,
    last_confirmed_at: float,
    confirmation_count: int,
    now: float,
    lives: HalfLives,
) -> Validity:
    value = freshness(profile, last_confirmed_at, now, lives)
    status = status_of(value)
    return Validity(
        freshness=round(value, 3),
        status=status,
        age_days=round(max(0.0, now - last_confirmed_at) / DAY, 3),
        last_confirmed_at=last_confirmed_at,
        confirmation_count=confirmation_count,
        decay_profile=profile,
        verification_recommended=status != "fresh",
        verification_required=status == "stale",
    )
