"""The inspector's doors, over real HTTP against a real daemon: the login link, the session
cookie, the CSRF token, Origin and Host -- and that the cookie opens nothing but ``/ui``.
One daemon serves the module (but the live feed's test, which reads the activity log from its
first entry); each test starts from an empty store and its own login."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from daemon_helpers import DaemonFactory, DaemonProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def daemon(module_store: DaemonProcess) -> DaemonProcess:
    """The module's daemon, its store emptied (each test logs in with its own link and cookie)."""
    return module_store


def _login(daemon: DaemonProcess) -> tuple[httpx.Client, str, str]:
    """A cookie-carrying client logged in through a fresh link: (client, csrf, link)."""
    link = daemon.client().post("/v1/inspect/login-link").json()["url"]
    browser = daemon.client(token="")
    response = browser.get(link, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui/", response.text
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie, cookie
    shell = browser.get("/ui/")
    assert shell.status_code == 200
    assert "script-src 'self'" in shell.headers["content-security-policy"]
    match = re.search(r'name="csrf-token" content="([^"]+)"', shell.text)
    assert match, shell.text[:300]
    return browser, match.group(1), link


def _forget(client: httpx.Client, memory_id: str, **headers: str) -> httpx.Response:
    return client.post("/ui/api/tools/forget", json={"arguments": {"memory_id": memory_id}}, headers=headers)


def _alive(daemon: DaemonProcess, memory_id: str) -> bool:
    return "error" not in daemon.call("read_memory", {"memory_id": memory_id})["result"]


def test_a_login_link_is_spent_by_its_first_use(daemon: DaemonProcess) -> None:
    _, _, link = _login(daemon)
    again = daemon.client(token="").get(link, follow_redirects=False)
    assert again.status_code == 401 and "set-cookie" not in again.headers
    made_up = daemon.client(token="").get("/ui/login?token=guessed", follow_redirects=False)
    assert made_up.status_code == 401


def test_without_the_cookie_no_page_data_and_no_write(daemon: DaemonProcess) -> None:
    memory = daemon.remember("The deploy window is Tuesday 10:00.", ["deploy", "schedule"])
    anonymous = daemon.client(token="")
    assert anonymous.get("/ui/").status_code == 401
    for path in ("/ui/api/search?q=deploy", f"/ui/api/memory/{memory}", "/ui/api/activity", "/ui/api/health",
                 "/ui/api/export"):
        response = anonymous.get(path)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized", path
    assert _forget(anonymous, memory, **{"X-CSRF-Token": "x"}).status_code == 401
    assert _alive(daemon, memory)


def test_a_forged_or_missing_csrf_token_and_a_foreign_origin_are_refused(daemon: DaemonProcess) -> None:
    memory = daemon.remember("The deploy window is Tuesday 10:00.", ["deploy", "schedule"])
    browser, csrf, _ = _login(daemon)
    assert _forget(browser, memory).status_code == 403
    assert _forget(browser, memory, **{"X-CSRF-Token": csrf[:-2] + "xx"}).status_code == 403
    foreign = _forget(browser, memory, **{"X-CSRF-Token": csrf, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden"
    other_port = _forget(browser, memory, **{"X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:1"})
    assert other_port.status_code == 403
    cross_site = _forget(browser, memory, **{"X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403
    host = _forget(browser, memory, **{"X-CSRF-Token": csrf, "Host": "attacker.example"})
    assert host.status_code == 403
    assert _alive(daemon, memory), "a refused request changed the store"
    # The page's own request: same origin, right token.
    own = _forget(browser, memory, **{"X-CSRF-Token": csrf, "Origin": daemon.url})
    assert own.status_code == 200 and own.json()["result"]["deleted"] is True
    assert not _alive(daemon, memory)


def test_the_cookie_never_authorises_the_token_api(daemon: DaemonProcess) -> None:
    memory = daemon.remember("The deploy window is Tuesday 10:00.", ["deploy", "schedule"])
    browser, csrf, _ = _login(daemon)
    for method, path in (("POST", "/v1/tools/forget"), ("POST", "/v1/export"), ("GET", "/v1/stats"),
                         ("GET", "/v1/inspect/search?q=deploy"), ("POST", "/v1/inspect/login-link")):
        response = browser.request(method, path, json={"arguments": {"memory_id": memory}},
                                   headers={"X-CSRF-Token": csrf})
        assert response.status_code == 401, (path, response.status_code)
        from_page = browser.request(method, path, json={}, headers={"Origin": daemon.url, "X-CSRF-Token": csrf})
        assert from_page.status_code == 403, (path, from_page.status_code)
    assert _alive(daemon, memory)


def test_the_page_calls_only_the_curation_tools(daemon: DaemonProcess) -> None:
    browser, csrf, _ = _login(daemon)
    response = browser.post("/ui/api/tools/remember", json={"arguments": {"content": "x", "keys": ["y"]}},
                            headers={"X-CSRF-Token": csrf})
    assert response.status_code == 404
    assert daemon.export()["memories"] == []


def test_the_health_page_lists_backups_and_exports_and_imports(daemon: DaemonProcess, wait_for: Any) -> None:
    memory = daemon.remember("The deploy window is Tuesday 10:00.", ["deploy", "schedule"])
    browser, csrf, _ = _login(daemon)
    backups = wait_for(lambda: browser.get("/ui/api/health").json()["backups"], 60, message="the first backup")
    download = browser.get(f"/ui/api/backups/{backups[0]['name']}")
    assert download.status_code == 200 and download.content.startswith(b"SQLite format 3")
    for bad in ("..%2Fkeymem.db", "keymem.db", "keymem-20990101T000000Z.db"):
        assert browser.get(f"/ui/api/backups/{bad}").status_code in (404, 422), bad
    exported = browser.get("/ui/api/export")
    assert exported.status_code == 200 and "attachment" in exported.headers["content-disposition"]
    data = exported.json()
    assert [m["id"] for m in data["memories"]] == [memory]
    daemon.call("forget", {"memory_id": memory})
    refused = browser.post("/ui/api/import", json=data)
    assert refused.status_code == 403 and not _alive(daemon, memory)
    imported = browser.post("/ui/api/import", json=data, headers={"X-CSRF-Token": csrf})
    assert imported.status_code == 200, imported.text
    assert _alive(daemon, memory)


def test_the_live_feed_is_a_server_sent_event_stream_behind_the_cookie_or_the_token(daemons: DaemonFactory) -> None:
    daemon = daemons.start()  # its own: the feed replays the activity log from the first entry
    anonymous = daemon.client(token="")
    assert anonymous.get("/ui/api/activity/stream").status_code == 401
    assert anonymous.get("/v1/inspect/activity/stream").status_code == 401
    browser, _, _ = _login(daemon)
    with browser.stream("GET", "/ui/api/activity/stream") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        assert next(lines).startswith("retry: ")
        memory = daemon.remember("The standup moved to 09:45.", ["standup", "schedule"])
        event: dict[str, str] = {}
        for line in lines:  # the stream ends by itself after a while: a lost entry fails here
            if line.startswith(("id: ", "event: ", "data: ")):
                name, _, value = line.partition(": ")
                event[name] = value
            elif line == "" and event.get("event") == "entry":
                break
        assert event.get("event") == "entry", event
        entry = json.loads(event["data"])
        assert entry["kind"] == "remember" and entry["memory_id"] == memory and event["id"] == str(entry["id"])
    with daemon.client().stream("GET", "/v1/inspect/activity/stream",
                                headers={"Last-Event-ID": str(entry["id"] - 1)}) as resumed:
        lines = (line for line in resumed.iter_lines() if line)
        assert next(lines).startswith("retry: ")
        assert next(lines) == f"id: {entry['id']}", "Last-Event-ID resumes after the entry it names"
