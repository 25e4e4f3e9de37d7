"""How a browser gets into the inspector, and stays in.

``keymemd ui`` asks the daemon (with the bearer token) for a login link: a random token
valid for one use within ``LOGIN_TTL`` seconds. Opening it exchanges the token for a
session: an HttpOnly, SameSite=Strict cookie scoped to ``/ui`` and this daemon's port, and a
CSRF token the page sends with every state-changing request. Both live in memory only: a
restarted daemon has no sessions, and ``keymemd ui`` logs in again.

The cookie authorises ``/ui`` routes and nothing else: the token API's guard never reads
cookies (``http.guard.Guard``).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

LOGIN_TTL: Final = 60.0
"""Seconds a login link stays valid (the issue's one minute: long enough to switch windows)."""
SESSION_TTL: Final = 12 * 3600.0
"""Seconds a browser session lasts without use (a working day)."""
MAX_PENDING_LINKS: Final = 64
"""Unused links kept at once; minting more forgets the oldest (a loop cannot grow memory)."""
TOKEN_BYTES: Final = 32


@dataclass(slots=True)
class Session:
    id: str
    csrf: str
    expires: float


class UiAuth:
    """The pending login links and live sessions of one daemon."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._links: dict[str, float] = {}
        self._sessions: dict[str, Session] = {}

    def mint_link(self) -> str:
        """A new one-time login token."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now = self._clock()
        with self._lock:
            self._links = {t: exp for t, exp in self._links.items() if exp > now}
            while len(self._links) >= MAX_PENDING_LINKS:
                self._links.pop(next(iter(self._links)))
            self._links[token] = now + LOGIN_TTL
        return token

    def redeem(self, token: str) -> Session | None:
        """The new session for a valid, unused, unexpired token; None otherwise. A token is
        spent by its first use, valid or late."""
        now = self._clock()
        with self._lock:
            expires = self._links.pop(token, None)
            if expires is None or expires <= now:
                return None
            self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
            session = Session(secrets.token_urlsafe(TOKEN_BYTES), secrets.token_urlsafe(TOKEN_BYTES),
                              now + SESSION_TTL)
            self._sessions[session.id] = session
            return session

    def session(self, cookie: str | None) -> Session | None:
        """The live session a cookie names (its lifetime renewed), or None."""
        if not cookie:
            return None
        now = self._clock()
        with self._lock:
            session = self._sessions.get(cookie)
            if session is None or session.expires <= now:
                self._sessions.pop(cookie, None)
                return None
            session.expires = now + SESSION_TTL
            return session

    @staticmethod
    def csrf_ok(session: Session, supplied: str | None) -> bool:
        return bool(supplied) and hmac.compare_digest(session.csrf.encode(), (supplied or "").encode())
