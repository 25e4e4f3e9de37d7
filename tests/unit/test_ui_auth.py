"""The inspector's login links and sessions: one use, 60 s, renewed sessions, CSRF compared."""

from __future__ import annotations

from keymem_daemon.ui.auth import LOGIN_TTL, MAX_PENDING_LINKS, SESSION_TTL, UiAuth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_login_link_works_once() -> None:
    auth = UiAuth(Clock())
    token = auth.mint_link()
    session = auth.redeem(token)
    assert session is not None and auth.session(session.id) is session
    assert auth.redeem(token) is None, "a reused link must be refused"


def test_a_login_link_expires_after_a_minute_and_a_late_use_spends_it() -> None:
    clock = Clock()
    auth = UiAuth(clock)
    token = auth.mint_link()
    clock.now += LOGIN_TTL + 0.001
    assert auth.redeem(token) is None
    clock.now -= LOGIN_TTL
    assert auth.redeem(token) is None, "the late attempt spent it"


def test_unknown_links_and_cookies_open_nothing() -> None:
    auth = UiAuth(Clock())
    assert auth.redeem("made-up") is None
    assert auth.session(None) is None and auth.session("") is None and auth.session("made-up") is None


def test_a_session_lasts_while_used_and_ends_when_idle() -> None:
    clock = Clock()
    auth = UiAuth(clock)
    session = auth.redeem(auth.mint_link())
    assert session is not None
    clock.now += SESSION_TTL * 0.9
    assert auth.session(session.id) is session, "use renews it"
    clock.now += SESSION_TTL * 0.9
    assert auth.session(session.id) is session
    clock.now += SESSION_TTL + 1
    assert auth.session(session.id) is None


def test_the_csrf_token_must_match_the_session() -> None:
    auth = UiAuth(Clock())
    session = auth.redeem(auth.mint_link())
    other = auth.redeem(auth.mint_link())
    assert session is not None and other is not None
    assert UiAuth.csrf_ok(session, session.csrf)
    assert not UiAuth.csrf_ok(session, other.csrf)
    assert not UiAuth.csrf_ok(session, None) and not UiAuth.csrf_ok(session, "")


def test_pending_links_are_bounded() -> None:
    auth = UiAuth(Clock())
    first = auth.mint_link()
    for _ in range(MAX_PENDING_LINKS):
        auth.mint_link()
    assert auth.redeem(first) is None, "the oldest unused link was forgotten"
