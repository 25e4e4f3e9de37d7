"""The web inspector in a real headless Chromium (Debian's ``chromium``, driven by Playwright),
against a real daemon: login through the one-time link, search, curation through the page
seen through the tool API, the graph walk, the activity feed fed by the real prompt hook,
inert HTML, and no console error on any page. The same run takes the README's screenshots
(``INSPECTOR_SCREENSHOTS=docs`` writes them there; otherwise under ``tmp_path``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, scaled
from pg_cluster import start_on
from test_hook_push import claude_payload, run_hook

playwright_api = pytest.importorskip("playwright.sync_api")

ROOT: Final = Path(__file__).resolve().parents[2]
CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMIUM_ARGS: Final = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
UI_TIMEOUT_MS: Final = scaled(30) * 1000
"""Each page wait: a recall and a render take milliseconds, a loaded 2-core machine far more
(scaled like every other deadline: it grows with the load and the xdist workers)."""
WIDE: Final = {"width": 1280, "height": 800}
NARROW: Final = {"width": 420, "height": 820}

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium package (/usr/bin/chromium)"),
]

NEWTON: Final = ("Isaac Newton watched an apple fall in his garden and thought about gravity.",
                 ["Newton", "apple", "gravity"])
APPLE: Final = ("An apple is a crisp fruit that grows on trees in an orchard.", ["apple", "fruit"])
STRAWBERRY: Final = ("A strawberry is a small red fruit, sweetest in early summer.", ["fruit", "strawberry"])
BILLING: Final = ("The billing staging database listens on port 5433 behind the VPN.",
                  ["billing", "staging database", "port"])
HOSTILE: Final = ('<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> '
                  "<b>markup</b> notes are stored as plain text", ["markup", "html"])


def screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get("INSPECTOR_SCREENSHOTS")
    target = (ROOT / chosen) if chosen else tmp_path / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    return target


@dataclass
class Browser:
    """Fresh Chromium profiles, each with the console errors its pages logged."""

    playwright: Any
    tmp_path: Path
    contexts: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def page(self, *, viewport: dict[str, int] = WIDE, color_scheme: str = "light") -> Any:
        profile = self.tmp_path / f"profile-{len(self.contexts)}"
        context = self.playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport=viewport, color_scheme=color_scheme)
        self.contexts.append(context)
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(UI_TIMEOUT_MS)
        page.on("console", lambda m: self.errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        yield p


@pytest.fixture
def browser(playwright: Any, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(playwright, tmp_path)
    try:
        yield b
    finally:
        b.close()


def login_url(daemon: DaemonProcess) -> str:
    response = daemon.client().post("/v1/inspect/login-link")
    assert response.status_code == 200, response.text
    return str(response.json()["url"])


def logged_in(daemon: DaemonProcess, browser: Browser, **options: Any) -> Any:
    page = browser.page(**options)
    page.goto(login_url(daemon))
    page.wait_for_selector("nav a[aria-current=page]")
    return page


def seed(daemon: DaemonProcess, *memories: tuple[str, list[str]]) -> list[str]:
    return [daemon.remember(content, keys) for content, keys in memories]


def answered(query: str) -> str:
    """A selector for the search page's answer to ``query`` (the line above its results). Wait
    for it, not for a bare ``article.result``: the search view asks for /health before it draws,
    so until then the page on screen is the one before -- the newest memories, say -- whose
    result cards that selector would find."""
    return f"#results p.muted >> text=result(s) for “{query}”"


def key_id(daemon: DaemonProcess, concept: str) -> str:
    response = daemon.client().get("/v1/inspect/key-by-name", params={"concept": concept})
    assert response.status_code == 200, response.text
    return str(response.json()["key_id"])


# -- login ---------------------------------------------------------------------------------


def test_the_login_link_opens_the_inspector_once_and_nothing_opens_without_it(
        daemon: DaemonProcess, browser: Browser) -> None:
    url = login_url(daemon)
    page = browser.page()
    page.goto(url)
    page.wait_for_selector("nav a[aria-current=page]")
    assert page.url.endswith("/ui/#/search") or page.url.endswith("/ui/"), page.url
    cookie = next(c for c in page.context.cookies() if c["name"].startswith("keymem_ui"))
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui", cookie
    assert page.evaluate("document.cookie") == "", "the session cookie must be invisible to scripts"

    reused = browser.page()
    response = reused.goto(url)
    assert response is not None and response.status == 401
    assert "not valid" in reused.inner_text("main")

    anonymous = browser.page()
    response = anonymous.goto(daemon.url + "/ui/")
    assert response is not None and response.status == 401
    assert "keymemd ui" in anonymous.inner_text("main")
    api = anonymous.request.get(daemon.url + "/ui/api/search?q=x")
    assert api.status == 401 and api.json()["error"]["code"] == "unauthorized"
    assert browser.errors == [] or all("401" in e for e in browser.errors), browser.errors


# -- search, curation ----------------------------------------------------------------------


def test_search_finds_a_memory_and_shows_its_keys_and_why_it_matched(
        daemon: DaemonProcess, browser: Browser, tmp_path: Path) -> None:
    seed(daemon, NEWTON, APPLE, STRAWBERRY, BILLING)
    page = logged_in(daemon, browser)
    page.fill("#q", "staging database port")
    page.click("button[type=submit]")
    page.wait_for_selector(answered("staging database port"))
    card = page.locator("article.result").first
    assert "5433" in card.inner_text()
    chips = card.locator(".keys .chip").all_inner_texts()
    assert {"billing", "staging database", "port"} <= set(chips), chips
    assert "matched via" in card.locator(".why").inner_text()
    page.screenshot(path=str(screenshot_dir(tmp_path) / "inspector-search.png"))

    page.fill("#q", "")
    page.select_option("#f-status", "stale")
    page.click("button[type=submit]")
    page.wait_for_selector("text=Nothing found.")
    assert browser.errors == [], browser.errors


def test_an_edit_a_new_key_and_a_forget_made_in_the_page_are_what_the_tools_see(
        daemon: DaemonProcess, browser: Browser) -> None:
    apple, billing = seed(daemon, APPLE, BILLING)
    page = logged_in(daemon, browser)

    page.goto(f"{daemon.url}/ui/#/memory/{apple}")
    page.wait_for_selector("#memory-content")
    page.fill("#edit-content", "An apple is a crisp fruit; Gala apples ripen in September.")
    page.click("#save")
    page.wait_for_function("old => !location.hash.endsWith(old) && location.hash.startsWith('#/memory/')", arg=apple)
    page.wait_for_selector("#memory-content")
    corrected = page.evaluate("location.hash.split('/')[2]")
    read = daemon.call("read_memory", {"memory_id": corrected})["result"]
    assert read["memory"]["content"] == "An apple is a crisp fruit; Gala apples ripen in September."
    assert read["memory"]["supersedes"] == apple
    assert "superseded" in daemon.call("read_memory", {"memory_id": apple})["result"]["error"]

    page.fill("#add-key", "orchard")
    page.click("#add-key-btn")
    page.wait_for_function("old => !location.hash.endsWith(old)", arg=corrected)
    page.wait_for_selector("table a:text('orchard')")
    newest = page.evaluate("location.hash.split('/')[2]")
    concepts = {k["concept"] for k in daemon.call("read_memory", {"memory_id": newest})["result"]["keys"]}
    assert {"apple", "fruit", "orchard"} <= concepts, concepts

    page.goto(f"{daemon.url}/ui/#/memory/{billing}")
    page.wait_for_selector("#memory-content")
    page.select_option("#evidence", "observation")
    page.click("#confirm-btn")
    page.wait_for_selector("#status:text('Confirmed')")
    seen = daemon.client().get(f"/v1/inspect/memory/{billing}").json()
    assert seen["confirmation_count"] == 2 and seen["last_confirmation_evidence"] == "observation"
    port = next(k for k in seen["keys"] if k["concept"] == "port")
    page.click(f"button.dismiss[data-key='{port['key_id']}']")
    page.wait_for_selector("#status:text('Dismissed port')")
    weights = {k["concept"]: k["link_weight"] for k in daemon.client().get(
        f"/v1/inspect/memory/{billing}").json()["keys"]}
    assert weights["port"] < port["link_weight"], weights
    page.select_option("#decay", "stable")
    page.fill("#ttl-days", "2")
    page.click("#ttl-btn")
    page.wait_for_function("old => !location.hash.endsWith(old)", arg=billing)
    page.wait_for_selector("#memory-content")
    billing = page.evaluate("location.hash.split('/')[2]")
    timed = daemon.client().get(f"/v1/inspect/memory/{billing}").json()
    assert timed["decay_profile"] == "stable" and timed["memory"]["expires_at"] is not None
    page.click("#forget")
    page.wait_for_selector("dialog[open]")
    page.click("#confirm-cancel")
    assert "error" not in daemon.call("read_memory", {"memory_id": billing})["result"], "cancel must not forget"
    page.click("#forget")
    page.click("#confirm-ok")
    page.wait_for_function("() => location.hash === '#/search'")
    assert "not found" in daemon.call("read_memory", {"memory_id": billing})["result"]["error"]

    feed = daemon.client().get("/v1/inspect/activity", params={"kind": "forget"}).json()["entries"]
    assert feed and feed[0]["memory_id"] == billing and feed[0]["detail"]["actor"] == "inspector"
    assert browser.errors == [], browser.errors


# -- graph ---------------------------------------------------------------------------------


def _node_point(page: Any, label: str) -> tuple[float, float]:
    page.wait_for_function(
        "label => window.keymemGraph && window.keymemGraph.nodes().some(n => n.data('label') === label)", arg=label)
    x, y = page.evaluate(
        """label => {
            const node = window.keymemGraph.nodes().filter(n => n.data('label') === label)[0];
            const p = node.renderedPosition();
            const box = document.getElementById('cy').getBoundingClientRect();
            return [box.left + p.x, box.top + p.y];
        }""", label)
    return float(x), float(y)


def _has_node(page: Any, label: str) -> bool:
    return bool(page.evaluate(
        "label => window.keymemGraph.nodes().some(n => n.data('label') === label)", label))


def test_the_graph_walks_from_newton_to_strawberry_by_clicks_and_by_keyboard(
        daemon: DaemonProcess, browser: Browser, tmp_path: Path) -> None:
    newton, _, _ = seed(daemon, NEWTON, APPLE, STRAWBERRY)
    page = logged_in(daemon, browser)
    page.goto(f"{daemon.url}/ui/#/graph")
    page.fill("#graph-start", "Newton")
    page.click("text=Start here")
    _node_point(page, "apple")
    assert not _has_node(page, "strawberry") and not _has_node(page, "fruit")
    for step, arrives in (("apple", "fruit"), ("fruit", "strawberry")):
        page.mouse.click(*_node_point(page, step))
        page.wait_for_selector(f"#node-list button:text-is('◆ {arrives}')")
    assert _has_node(page, "strawberry")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "inspector-graph.png"))

    # The same walk with the keyboard, from Newton's memory: the node list, arrows and Enter.
    page.goto(f"{daemon.url}/ui/#/graph/memory/{newton}")
    page.wait_for_selector("#node-list button")
    page.wait_for_function("() => !window.keymemGraph.nodes().some(n => n.data('label') === 'strawberry')")
    page.focus("#node-list button")
    for step, arrives in (("apple", "fruit"), ("fruit", "strawberry")):
        for _ in range(20):
            if page.evaluate("document.activeElement.textContent") == f"◆ {step}":
                break
            page.keyboard.press("ArrowDown")
        assert page.evaluate("document.activeElement.textContent") == f"◆ {step}"
        page.keyboard.press("Enter")
        page.wait_for_selector(f"#node-list button:text-is('◆ {arrives}')")
        page.focus("#node-list button")
    assert _has_node(page, "strawberry")
    assert browser.errors == [], browser.errors


# -- activity ------------------------------------------------------------------------------


def test_a_prompt_sent_through_the_real_hook_appears_in_the_live_feed_with_what_was_surfaced(
        daemon: DaemonProcess, browser: Browser, tmp_path: Path) -> None:
    (billing,) = seed(daemon, BILLING)
    page = logged_in(daemon, browser)
    page.goto(f"{daemon.url}/ui/#/activity")
    page.wait_for_selector(".entry[data-kind=remember]")
    env = {**daemon.env, "KEYMEM_HOOK_TIMEOUT_MS": "20000"}
    run = run_hook(env, claude_payload("Which port does the billing staging database listen on?", tmp_path),
                   "user-prompt-submit")
    assert run.returncode == 0 and billing in run.stdout, (run.stdout, run.stderr, daemon.log())
    entry = page.locator(".entry[data-kind=inject]").first
    entry.wait_for()  # the feed is live: no reload
    assert "Which port does the billing staging database" in entry.inner_text()
    assert entry.locator(f".surfaced a[href='#/memory/{billing}']").count() == 1
    assert "relevance" in entry.locator(".surfaced").inner_text()

    silent = run_hook(env, claude_payload("Please write a limerick about pelicans on holiday.", tmp_path),
                      "user-prompt-submit")
    assert silent.returncode == 0 and silent.stdout.strip() == "", silent.stdout
    quiet = page.locator(".entry[data-kind=inject]", has_text="pelicans").first
    quiet.wait_for()
    assert "silent" in quiet.inner_text()
    page.screenshot(path=str(screenshot_dir(tmp_path) / "inspector-activity.png"))
    assert browser.errors == [], browser.errors


def test_a_write_through_the_tool_api_reaches_the_open_activity_page_over_server_sent_events(
        daemon: DaemonProcess, browser: Browser) -> None:
    page = logged_in(daemon, browser)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{daemon.url}/ui/#/activity")
    page.wait_for_selector("#feed .empty")
    stream = next((u for u in requests if "/ui/api/activity/stream" in u), None)
    assert stream is not None, requests
    polls_before = [u for u in requests if "/ui/api/activity?" in u]

    memory = daemon.remember("The release train leaves every second Thursday.", ["release", "schedule"])
    entry = page.locator(f".entry[data-kind=remember]:has(a[href='#/memory/{memory}'])")
    entry.wait_for()  # no reload: the stream delivered it
    assert "release train" in entry.inner_text()
    assert [u for u in requests if "/ui/api/activity?" in u] == polls_before, "the live feed must not poll"
    assert browser.errors == [], browser.errors


def test_a_view_answered_after_the_user_left_it_does_not_draw_over_the_next_one(
        daemon: DaemonProcess, browser: Browser) -> None:
    """The search page draws once /health answers; a user already on the activity page by then
    (a busy daemon, a quick click) must keep it. /health is held until the activity page shows:
    the order two xdist workers on a loaded machine produced by chance, which left the test above
    waiting for an activity feed the late search page had replaced."""
    page = browser.page()
    held: list[Any] = []
    page.route("**/ui/api/health", lambda route: held.append(route))
    page.goto(login_url(daemon))
    page.wait_for_selector("nav a[aria-current=page]")
    page.goto(f"{daemon.url}/ui/#/activity")
    page.wait_for_selector("#feed .empty")
    assert len(held) == 1, "the search page asks for /health before it draws"
    with page.expect_response("**/ui/api/health"):
        held[0].continue_()

    memory = daemon.remember("The release train leaves every second Thursday.", ["release", "schedule"])
    page.locator(f"#feed .entry:has(a[href='#/memory/{memory}'])").wait_for()
    assert page.inner_text("main h1") == "Activity"
    assert browser.errors == [], browser.errors


# Counts, in the page, the answers its fetch() calls have read. The count goes up in a task of
# its own, queued once an answer's JSON is read: the view that awaited that answer has run to
# its end (drawn, or given up) in the microtasks before it, so a test that waits for the count
# knows the view is done with the answer without waiting for a sign that may never come.
ANSWERS_READ: Final = """
window.__answersRead = [];
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const response = await realFetch(...args);
  const readJson = response.json.bind(response);
  response.json = async () => {
    try { return await readJson(); }
    finally { setTimeout(() => window.__answersRead.push(String(args[0])), 0); }
  };
  return response;
};
"""


def test_a_search_answered_after_the_next_search_was_submitted_does_not_fill_the_page(
        daemon: DaemonProcess, browser: Browser) -> None:
    """The first search page (the newest memories) draws its form, then waits for /search; a
    user who submits a search meanwhile has started a new view, which waits for /health before
    it draws. The first page's answer, arriving in between, must not fill the page still on
    screen: the clean-clone run saw those newest memories where the test above expected its
    search's result (fixed in 988c209). Its /search and the next view's /health are held to
    make that order, which two xdist workers on a loaded machine produced by chance."""
    seed(daemon, NEWTON, APPLE, BILLING)
    page = browser.page()
    page.add_init_script(ANSWERS_READ)
    searches: list[Any] = []
    page.route(lambda url: "/ui/api/search?" in url,
               lambda route: searches.append(route) if not searches else route.continue_())
    with page.expect_request(lambda request: "/ui/api/search?" in request.url):
        page.goto(login_url(daemon))
    page.wait_for_selector("#results")
    healths: list[Any] = []
    page.route("**/ui/api/health", lambda route: healths.append(route))
    page.fill("#q", "staging database port")
    with page.expect_request("**/ui/api/health"):
        page.click("button[type=submit]")
    assert len(searches) == 1, "the first page asks for /search once its form is drawn"

    with page.expect_response(lambda response: "/ui/api/search?" in response.url):
        searches[0].continue_()
    page.wait_for_function("window.__answersRead.some((url) => url.startsWith('/ui/api/search?'))")
    assert page.locator("article.result").count() == 0, page.inner_text("main")
    assert page.inner_text("#results") == "Searching…"

    assert len(healths) == 1, "the submitted search asks for /health before it draws"
    healths[0].continue_()
    page.wait_for_selector(answered("staging database port"))
    assert "5433" in page.locator("article.result").first.inner_text()
    assert browser.errors == [], browser.errors


def test_an_export_file_imported_from_the_health_page_restores_memories_and_a_bad_file_changes_nothing(
        daemon: DaemonProcess, browser: Browser, tmp_path: Path) -> None:
    ids = seed(daemon, NEWTON, APPLE)
    exported = daemon.export()
    for memory_id in ids:
        daemon.call("forget", {"memory_id": memory_id})
    before = daemon.export()
    assert before["memories"] == []
    page = logged_in(daemon, browser)
    page.goto(f"{daemon.url}/ui/#/health")
    page.wait_for_selector("#import-file")

    garbage = tmp_path / "notes.txt"
    garbage.write_text("these are not the memories you are looking for")
    page.set_input_files("#import-file", str(garbage))
    page.click("#import-btn")
    error = page.locator("#import-error")
    error.wait_for()
    assert "nothing was changed" in error.inner_text() and "notes.txt is not a keymem export" in error.inner_text()

    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"format": "somebody-else", "items": [1, 2]}))
    page.set_input_files("#import-file", str(foreign))
    page.click("#import-btn")
    page.wait_for_selector("#import-error >> text=not a keymem export (format 'keymem-export')")
    assert daemon.export()["memories"] == before["memories"]

    good = tmp_path / "keymem-export.json"
    good.write_text(json.dumps(exported))
    page.set_input_files("#import-file", str(good))
    page.click("#import-btn")
    page.wait_for_selector("#import-done")
    counts = {row.locator("td").nth(0).inner_text(): row.locator("td").nth(1).inner_text()
              for row in page.locator("#import-outcome tbody tr").all()}
    assert counts.get("memories") == "2", counts
    for memory_id in ids:
        assert "error" not in daemon.call("read_memory", {"memory_id": memory_id})["result"], memory_id
    assert browser.errors == [] or all("422" in e for e in browser.errors), browser.errors


# -- team memory: personal namespaces in SQLite, team ones in PostgreSQL --------------------


PERSONAL: Final = ("My own zebrafish-gateway checkout builds with make zebrafish-dev.",
                   ["zebrafish-gateway", "make zebrafish-dev"])
PROJECT: Final = ("The zebrafish-gateway deploys only after zebra-canary-check passes.",
                  ["zebrafish-gateway", "zebra-canary-check"])


def test_with_team_memory_the_key_page_and_graph_span_both_stores_and_health_names_the_server(
        factories: list[DaemonFactory], tmp_path: Path, pg_database: str, browser: Browser) -> None:
    """A daemon keeping ``default`` in SQLite and ``team-*`` in PostgreSQL: a concept keyed in
    both stores has one key page, listing where it is kept and the co-occurring keys of both,
    and one graph node joining both stores' memories and keys; the health page names the
    server and role, the namespaces there, whether it follows the server and its change-log
    position, and says the backups are the local store's."""
    daemon = start_on(factories, tmp_path, "a", pg_database, KEYMEM_TEAM_NAMESPACES="team-*")
    daemon.remember(*PERSONAL)
    daemon.remember(*PROJECT, namespace="team-payments")
    stores = daemon.client().get("/v1/stats").json()["stores"]
    assert [(s["store"].split()[0], s["counts"]["memories"]) for s in stores] == [("sqlite", 1), ("postgresql", 1)]
    page = logged_in(daemon, browser)

    page.goto(f"{daemon.url}/ui/#/key/{key_id(daemon, 'zebrafish-gateway')}")
    page.wait_for_selector("main h1:text('Key: zebrafish-gateway')")
    assert "sqlite" in page.inner_text("#key-stores") and "postgresql" in page.inner_text("#key-stores")
    co = page.locator("#co-keys .chip").all_inner_texts()
    assert sorted(c.split(" · ")[0] for c in co) == ["make zebrafish-dev", "zebra-canary-check"], co
    assert page.locator("main table a[href^='#/memory/']").count() == 2

    page.click("text=Show in the graph")
    page.wait_for_selector("#node-list button.memory")
    keys = page.locator("#node-list button.key").all_inner_texts()
    assert sorted(keys) == ["◆ make zebrafish-dev", "◆ zebra-canary-check", "◆ zebrafish-gateway"], keys
    assert page.locator("#node-list button.memory").count() == 2

    page.goto(f"{daemon.url}/ui/#/health")
    page.wait_for_selector("#shared-store")
    shared = page.inner_text("#shared-store")
    server = pg_database.split("@")[1].split("?")[0]
    assert f"postgresql {server} as keymem_owner" in shared, shared
    assert "team-*" in shared and "follows the server" in shared and "position " in shared, shared
    assert "local store, sqlite" in page.inner_text("#backups-of")
    assert browser.errors == [], browser.errors


# -- safety and every page -----------------------------------------------------------------


def test_a_memory_holding_html_and_script_renders_as_inert_text(daemon: DaemonProcess, browser: Browser) -> None:
    (hostile,) = seed(daemon, HOSTILE)
    page = logged_in(daemon, browser)
    for where in (f"#/search?q={'markup notes'}", f"#/memory/{hostile}", "#/activity"):
        page.goto(f"{daemon.url}/ui/{where}")
        page.wait_for_selector("text=<script>window.__pwned=2</script>")
        assert page.evaluate("window.__pwned") is None
        assert page.locator("main img, main script, main b").count() == 0
    assert browser.errors == [], browser.errors


def test_every_view_renders_without_console_errors_wide_light_and_narrow_dark(
        daemon: DaemonProcess, browser: Browser, tmp_path: Path) -> None:
    ids = seed(daemon, NEWTON, APPLE, STRAWBERRY, BILLING)
    daemon.call("confirm_memory", {"memory_id": ids[1], "evidence": "user"})
    shots = screenshot_dir(tmp_path)
    apple = key_id(daemon, "apple")
    views = {
        "memory": (f"#/memory/{ids[0]}", "#memory-content"),
        "key": (f"#/key/{apple}", "text=Members, ranked as read_key ranks them"),
        "health": ("#/health", "text=Backups"),
    }
    page = logged_in(daemon, browser)
    for name, (where, ready) in views.items():
        page.goto(f"{daemon.url}/ui/{where}")
        page.wait_for_selector(ready)
        page.screenshot(path=str(shots / f"inspector-{name}.png"), full_page=name != "health")
    narrow = logged_in(daemon, browser, viewport=NARROW, color_scheme="dark")
    for where, ready in [("#/search?q=apple", answered("apple")), *views.values(),
                         (f"#/graph/key/{apple}", "#node-list button"), ("#/activity", ".entry")]:
        narrow.goto(f"{daemon.url}/ui/{where}")
        narrow.wait_for_selector(ready)
        width = narrow.evaluate("document.documentElement.scrollWidth")
        assert width <= NARROW["width"], f"{where} scrolls sideways in a narrow window ({width} px)"
        if where.startswith("#/search"):
            narrow.screenshot(path=str(shots / "inspector-search-dark-narrow.png"))
    background = narrow.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background != "rgb(251, 251, 250)", "the dark scheme must change the colours"
    assert browser.errors == [], browser.errors


def _tab_until(page: Any, predicate: Callable[[], bool], *, key: str = "Tab", presses: int = 60) -> bool:
    for _ in range(presses):
        if predicate():
            return True
        page.keyboard.press(key)
    return predicate()


def test_the_views_are_reachable_and_usable_from_the_keyboard(daemon: DaemonProcess, browser: Browser) -> None:
    seed(daemon, APPLE)
    page = logged_in(daemon, browser)
    assert _tab_until(page, lambda: page.evaluate("document.activeElement.id") == "q")
    page.keyboard.type("apple")
    page.keyboard.press("Enter")
    page.wait_for_selector(answered("apple"))
    assert _tab_until(page, lambda: page.evaluate("document.activeElement.classList.contains('memory-link')"))
    page.keyboard.press("Enter")
    page.wait_for_selector("#memory-content")
    assert _tab_until(page, lambda: page.evaluate("document.activeElement.textContent") == "Activity",
                      key="Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_selector(".entry")
    assert browser.errors == [], browser.errors
