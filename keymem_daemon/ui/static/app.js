/* keymem inspector: plain JavaScript, no build step.
 *
 * Every string from the store reaches the page through textContent (the el() helper), never
 * innerHTML: a memory is untrusted text, and a stored <script> shows as text. Writes go to
 * /ui/api/tools/<tool>, the tools agents use, with the session's CSRF token.
 */
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const ACTIVITY_POLL_MS = 2000;
let activityTimer = null;
let activityStream = null;
let viewSerial = 0;

// -- helpers ------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function say(message, isError) {
  statusLine.textContent = message || "";
  statusLine.classList.toggle("error", Boolean(isError));
}

async function api(path, options) {
  const opts = options || {};
  const init = { method: opts.method || "GET", headers: {}, credentials: "same-origin" };
  if (opts.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.body);
  }
  if (init.method !== "GET") init.headers["X-CSRF-Token"] = CSRF;
  const response = await fetch("/ui/api" + path, init);
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const message = data && data.error ? data.error.message : "HTTP " + response.status;
    if (response.status === 401) throw new Error(message + " -- run `keymemd ui` to log in again");
    throw new Error(message);
  }
  return data;
}

async function tool(name, args) {
  const data = await api("/tools/" + name, { method: "POST", body: { arguments: args } });
  if (data.is_error || (data.result && data.result.error)) throw new Error(data.result.error || "refused");
  return data.result;
}

function when(ts) {
  if (ts === null || ts === undefined) return "—";
  return new Date(ts * 1000).toISOString().slice(0, 16).replace("T", " ");
}

function badge(validity) {
  if (!validity) return null;
  return el("span", { class: "badge " + validity.status, title: "freshness " + validity.freshness },
    validity.status + " " + Math.round(validity.freshness * 100) + "%");
}

function keyChip(key) {
  const label = key.link_weight !== undefined ? key.concept + " · " + key.link_weight : key.concept;
  return key.key_id ? el("a", { class: "chip", href: "#/key/" + key.key_id }, label) : el("span", { class: "chip" }, label);
}

// A file path or a server's address: one long word, broken anywhere in a narrow window.
function path(text) {
  return el("span", { class: "path" }, text);
}

function heading(text) {
  const h = el("h1", { tabindex: "-1" }, text);
  return h;
}

// A view that waits for its data may get it after the user has gone on to another view (a
// slow answer from a busy daemon, a quick click on the next tab): it must not draw over that
// one. route() counts the views it starts; a view draws what it waited for only while it is
// still the latest.
function started() {
  const serial = viewSerial;
  return () => serial === viewSerial;
}

function show(...nodes) {
  main.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined));
  const h = main.querySelector("h1");
  if (h && !main.contains(document.activeElement)) h.focus({ preventScroll: true });
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
}

function params(hash) {
  const q = hash.indexOf("?");
  return new URLSearchParams(q >= 0 ? hash.slice(q + 1) : "");
}

function confirmDialog(text, okLabel) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = okLabel;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

// -- search -------------------------------------------------------------------------------

const FILTERS = ["namespace", "status", "decay_profile", "key", "agent", "session", "since", "until"];

async function viewSearch(hash) {
  const p = params(hash);
  const current = started();
  const select = (name, options) => el("select", { name, id: "f-" + name },
    el("option", { value: "" }, "any"), options.map((o) => el("option", { value: o, selected: p.get(name) === o }, o)));
  let namespaces = [];
  try { namespaces = Object.keys((await api("/health")).stats.namespaces || {}); } catch (e) { say(e.message, true); }
  if (!current()) return;
  const dateValue = (name) => p.get(name) ? new Date(Number(p.get(name)) * 1000).toISOString().slice(0, 10) : "";
  const form = el("form", { class: "filters", role: "search" },
    el("div", { class: "wide" },
      el("input", { type: "search", name: "q", id: "q", value: p.get("q") || "", "aria-label": "Search memories",
        placeholder: "Search memories (empty: newest first)" }),
      el("button", { class: "primary", type: "submit" }, "Search")),
    el("label", {}, "Namespace", select("namespace", namespaces)),
    el("label", {}, "Validity", select("status", ["fresh", "aging", "stale"])),
    el("label", {}, "Decay profile", select("decay_profile", ["transient", "standard", "stable", "permanent"])),
    el("label", {}, "Key", el("input", { name: "key", value: p.get("key") || "" })),
    el("label", {}, "Saved by agent", select("agent", ["claude", "codex"])),
    el("label", {}, "Host session", el("input", { name: "session", value: p.get("session") || "" })),
    el("label", {}, "Saved since", el("input", { type: "date", name: "since", value: dateValue("since") })),
    el("label", {}, "Saved until", el("input", { type: "date", name: "until", value: dateValue("until") })));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    const data = new FormData(form);
    for (const [name, value] of data.entries()) {
      if (!value) continue;
      if (name === "since" || name === "until") {
        const t = Date.parse(value + (name === "until" ? "T23:59:59Z" : "T00:00:00Z")) / 1000;
        next.set(name, String(t));
      } else next.set(name, value);
    }
    location.hash = "#/search?" + next.toString();
  });
  const results = el("section", { id: "results", "aria-label": "Results" }, el("p", { class: "muted" }, "Searching…"));
  show(heading("Search"), form, results);
  const query = new URLSearchParams();
  query.set("q", p.get("q") || "");
  for (const name of FILTERS) if (p.get(name)) query.set(name, p.get(name));
  try {
    const data = await api("/search?" + query.toString());
    // A search submitted meanwhile is a new view: this page's late answer (the newest
    // memories, say) must not fill the page the user is still looking at until it draws.
    if (!current()) return;
    const items = data.results.map(resultCard);
    const note = data.mode === "newest" ? "Newest memories" : data.results.length + " result(s) for “" + data.query + "”";
    results.replaceChildren(el("p", { class: "muted" }, note), ...(items.length ? items : [el("p", {}, "Nothing found.")]));
  } catch (e) {
    if (current()) results.replaceChildren(el("p", { class: "error" }, e.message));
  }
}

function resultCard(r) {
  const why = [];
  if (r.matched_via && r.matched_via.length) why.push("matched via " + r.matched_via.join(", "));
  if (r.terms && r.terms.length) why.push("terms " + r.terms.join(", "));
  if (r.scores) why.push("score " + r.scores.score + " · relevance " + r.scores.relevance + " · rank " + r.scores.rank);
  return el("article", { class: "card result", "data-id": r.id },
    el("div", { class: "row" }, el("a", { href: "#/memory/" + r.id, class: "memory-link" }, r.id), badge(r.validity),
      el("span", { class: "meta" }, r.namespace + " · saved " + when(r.created_at) +
        (r.provenance && r.provenance.host_agent ? " by " + r.provenance.host_agent : "")),
      el("a", { href: "#/graph/memory/" + r.id, class: "meta" }, "graph")),
    el("p", { class: "content" }, r.content),
    el("div", { class: "keys" }, r.keys.map(keyChip)),
    why.length ? el("p", { class: "why" }, why.join(" — ")) : null);
}

// -- memory -------------------------------------------------------------------------------

function plot(points, now) {
  if (!points || points.length < 2) return null;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 360 90");
  svg.setAttribute("class", "plot");
  svg.setAttribute("role", "img");
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const x = (t) => 10 + (340 * (t - t0)) / (t1 - t0 || 1);
  const y = (f) => 75 - 65 * f;
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((pt) => x(pt[0]).toFixed(1) + "," + y(pt[1]).toFixed(1)).join(" "));
  const axis = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({ x1: 10, x2: 350, y1: 75, y2: 75 })) axis.setAttribute(k, v);
  const mark = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({ x1: x(now), x2: x(now), y1: 8, y2: 75, class: "now" })) mark.setAttribute(k, v);
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", Math.min(300, x(now) + 3));
  label.setAttribute("y", 16);
  label.textContent = "now";
  const title = document.createElementNS(ns, "title");
  title.textContent = "Freshness from the last confirmation onwards";
  svg.append(title, axis, line, mark, label);
  return svg;
}

async function viewMemory(id) {
  const current = started();
  show(heading("Memory " + id), el("p", { class: "muted" }, "Loading…"));
  let m;
  try { m = await api("/memory/" + encodeURIComponent(id)); } catch (e) {
    if (current()) show(heading("Memory " + id), el("p", { class: "error" }, e.message));
    return;
  }
  if (!current()) return;
  const mem = m.memory;
  const keyRows = m.keys.map((k) => [
    el("a", { href: "#/key/" + k.key_id }, k.concept), String(k.link_weight), k.is_hub ? "hub" : "",
    el("div", { class: "row" },
      el("button", { type: "button", class: "dismiss", "data-key": k.key_id, onclick: () => act(() =>
        tool("dismiss", { memory_id: mem.id, key_id: k.key_id }), "Dismissed " + k.concept, mem.id) }, "Dismiss"),
      el("button", { type: "button", class: "remove-key", "data-key": k.key_id, onclick: () => act(() =>
        tool("correct", { memory_id: mem.id, content: mem.content, keys: m.keys.filter((o) => o.key_id !== k.key_id).map((o) => o.concept) }),
      "Removed key " + k.concept)}, "Remove")),
  ]);
  const editor = el("textarea", { id: "edit-content", "aria-label": "Memory text" }, mem.content);
  const keysInput = el("input", { id: "edit-keys", value: m.keys.map((k) => k.concept).join(", "), "aria-label": "Keys, comma separated" });
  const addKey = el("input", { id: "add-key", placeholder: "new key", "aria-label": "Key to add" });
  const evidence = el("select", { id: "evidence", "aria-label": "Evidence" },
    ["user", "authoritative_source", "observation"].map((e) => el("option", { value: e }, e)));
  const decay = el("select", { id: "decay", "aria-label": "Decay profile" },
    ["transient", "standard", "stable", "permanent"].map((d) => el("option", { value: d, selected: d === m.decay_profile }, d)));
  const ttl = el("input", { id: "ttl-days", type: "number", min: "0", step: "any", placeholder: "days (empty: never)",
    "aria-label": "Expire after days" });
  const splitKeys = (text) => text.split(",").map((k) => k.trim()).filter(Boolean);
  const inactive = mem.superseded_by ? el("p", { class: "card" }, "Superseded by ",
    el("a", { href: "#/memory/" + mem.superseded_by }, mem.superseded_by)) : null;
  const prov = m.provenance || {};
  show(
    heading("Memory " + mem.id),
    inactive,
    el("div", { class: "grid2" },
      el("section", {},
        el("article", { class: "card" }, el("p", { class: "content", id: "memory-content" }, mem.content)),
        el("h2", {}, "Keys"),
        table(["key", "link weight", "", ""], keyRows),
        el("div", { class: "row" }, addKey, el("button", { type: "button", id: "add-key-btn", onclick: () => {
          const extra = addKey.value.trim();
          if (extra) act(() => tool("correct", { memory_id: mem.id, content: mem.content, keys: m.keys.map((k) => k.concept).concat([extra]) }), "Added key " + extra);
        } }, "Add key")),
        el("h2", {}, "Correct"),
        editor,
        el("label", {}, "Keys (comma separated)", keysInput),
        el("div", { class: "row" }, el("button", { type: "button", class: "primary", id: "save", onclick: () => act(() =>
          tool("correct", { memory_id: mem.id, content: editor.value, keys: splitKeys(keysInput.value) }), "Corrected") }, "Save correction")),
        el("h2", {}, "Confirm, expire, decay"),
        el("div", { class: "row" }, evidence, el("button", { type: "button", id: "confirm-btn", onclick: () => act(() =>
          tool("confirm_memory", { memory_id: mem.id, evidence: evidence.value }), "Confirmed", mem.id) }, "Confirm with evidence")),
        el("div", { class: "row" }, decay, ttl, el("button", { type: "button", id: "ttl-btn", onclick: () => {
          const args = { memory_id: mem.id, content: mem.content, decay_profile: decay.value,
            ttl_seconds: ttl.value === "" ? null : Number(ttl.value) * 86400 };
          act(() => tool("correct", args), "Saved expiry and decay");
        } }, "Set TTL and decay")),
        el("h2", {}, "Forget"),
        el("button", { type: "button", class: "danger", id: "forget", onclick: async () => {
          if (!(await confirmDialog("Permanently delete memory " + mem.id + "? This cannot be undone.", "Forget"))) return;
          try {
            await tool("forget", { memory_id: mem.id });
            say("Forgot " + mem.id);
            location.hash = "#/search";
          } catch (e) { say(e.message, true); }
        } }, "Forget this memory…")),
      el("aside", {},
        el("h2", {}, "Validity"),
        el("p", {}, badge(mem.validity), " ", m.decay_profile + ", confirmed " + m.confirmation_count + "×" +
          (m.last_confirmation_evidence ? " (last: " + m.last_confirmation_evidence + ")" : "")),
        plot(m.freshness_plot, Date.now() / 1000),
        el("h2", {}, "Provenance"),
        table(["", ""], [
          ["namespace", mem.namespace], ["saved", when(mem.created_at)], ["observed", when(mem.observed_at)],
          ["agent", prov.host_agent || "—"], ["host session", prov.host_session || "—"],
          ["turn", prov.host_turn !== undefined ? String(prov.host_turn) : "—"], ["tool", prov.tool || "—"],
          ["expires", when(mem.expires_at)], ["accessed", mem.access_count + "×"]]),
        el("h2", {}, "History"),
        m.history.length ? el("ul", {}, m.history.map((h) => el("li", {}, el("a", { href: "#/memory/" + h.id }, h.id), " ", h.content)))
          : el("p", { class: "muted" }, "No earlier version."),
        el("h2", {}, "Relations"),
        m.relations.length ? el("ul", {}, m.relations.map((r) => el("li", {}, el("a", { href: "#/memory/" + r.id }, r.id), " ", r.content)))
          : el("p", { class: "muted" }, "None."),
        el("h2", {}, "Neighbours through shared keys"),
        m.neighbours.length ? el("ul", {}, m.neighbours.map((n) => el("li", {}, el("a", { href: "#/memory/" + n.id }, n.id), " ",
          n.content, el("span", { class: "meta" }, " via " + n.shared_keys.join(", ")))))
          : el("p", { class: "muted" }, "None."),
        el("p", {}, el("a", { href: "#/graph/memory/" + mem.id }, "Show in the graph")))));

  async function act(fn, message, stay) {
    try {
      const result = await fn();
      say(message);
      const next = result && result.new_id ? result.new_id : stay || mem.id;
      if (location.hash === "#/memory/" + next) viewMemory(next); else location.hash = "#/memory/" + next;
    } catch (e) { say(e.message, true); }
  }
}

// -- key ----------------------------------------------------------------------------------

async function viewKey(id) {
  const current = started();
  show(heading("Key"), el("p", { class: "muted" }, "Loading…"));
  let k;
  try { k = await api("/key/" + encodeURIComponent(id)); } catch (e) {
    if (current()) show(heading("Key " + id), el("p", { class: "error" }, e.message));
    return;
  }
  if (!current()) return;
  const key = k.key;
  show(
    heading("Key: " + key.concept),
    el("p", { class: "meta" }, key.key_type + " · " + key.memory_count + " active memories" + (key.is_hub ? " · hub (≥ " + k.hub_min_links + ")" : "") +
      " · specificity " + key.specificity + " · idf " + k.idf + " · " + k.links_all_namespaces + " links in all namespaces"),
    k.stores ? el("p", { class: "meta path", id: "key-stores" }, "Kept in " +
      k.stores.map((s) => s.store + " (key " + s.key_id + ")").join(" and ")) : null,
    el("p", {}, el("a", { href: "#/graph/key/" + key.key_id }, "Show in the graph")),
    el("div", { class: "grid2" },
      el("section", {}, el("h2", {}, "Members, ranked as read_key ranks them"),
        table(["memory", "score", "link", "validity", "content"], k.members.map((h) => [
          el("a", { href: "#/memory/" + h.memory_id }, h.memory_id), String(h.score), String(h.link_weight),
          badge(h.validity), h.content]))),
      el("aside", {},
        el("h2", {}, "Aliases"),
        el("div", { id: "aliases" }, k.aliases.length ? table(["alias", "kind", "hits"], k.aliases.map((a) => [a.alias, a.learned ? "learned" : "given", String(a.hits)]))
          : el("p", { class: "muted" }, "No aliases.")),
        el("h2", {}, "Co-occurring keys"),
        el("div", { id: "co-keys" }, k.co_keys.map((c) => el("a", { class: "chip", href: "#/key/" + c.key_id }, c.concept + " · " + c.count))))));
}

// -- graph --------------------------------------------------------------------------------

function graphColors() {
  const dark = window.matchMedia("(prefers-color-scheme: dark)").matches;
  return dark ? { key: "#8ab4f8", memory: "#5f6368", text: "#e6e7e9", edge: "#555b63", done: "#fdd663" }
    : { key: "#1a5fb4", memory: "#9aa0a6", text: "#1d1f21", edge: "#c4c7cc", done: "#f9ab00" };
}

async function viewGraph(hash) {
  const parts = hash.split("?")[0].split("/");   // #/graph/key/<id> or #/graph/memory/<id>
  const kind = parts[2], ref = parts[3];
  const start = el("input", { id: "graph-start", placeholder: "key name, e.g. Newton", "aria-label": "Start from key" });
  const startForm = el("form", { class: "row", onsubmit: async (event) => {
    event.preventDefault();
    try {
      const found = await api("/key-by-name?concept=" + encodeURIComponent(start.value.trim()));
      location.hash = "#/graph/key/" + found.key_id;
    } catch (e) { say(e.message, true); }
  } }, start, el("button", { type: "submit" }, "Start here"));
  const container = el("div", { id: "cy", role: "img", "aria-label": "Graph of keys and memories; use the list beside it with the keyboard" });
  const list = el("ul", { id: "node-list" });
  show(heading("Graph"), el("p", { class: "muted" },
    "Click a key to bring in its memories and their keys; click a memory for its keys. With the keyboard: Tab to the list, Enter expands, arrows move, o opens the page."),
    startForm, el("div", { class: "graph-wrap" }, container, el("nav", { class: "nodes", "aria-label": "Graph nodes" }, list)));
  if (!kind || !ref) return;
  const colors = graphColors();
  const cy = window.cytoscape({
    container, boxSelectionEnabled: false, maxZoom: 1.6, minZoom: 0.2,
    style: [
      { selector: "node", style: { label: "data(label)", color: colors.text, "font-size": 11, "text-wrap": "ellipsis",
        "text-max-width": 140, "text-valign": "bottom", "text-margin-y": 4 } },
      { selector: "node[kind = 'key']", style: { "background-color": colors.key, shape: "round-rectangle", width: 22, height: 22 } },
      { selector: "node[kind = 'memory']", style: { "background-color": colors.memory, shape: "ellipse", width: 14, height: 14 } },
      { selector: "node.expanded", style: { "border-width": 3, "border-color": colors.done } },
      { selector: "node:selected", style: { "border-width": 3, "border-color": colors.done } },
      { selector: "edge", style: { width: "mapData(weight, 0, 2, 1, 4)", "line-color": colors.edge, "curve-style": "haystack" } },
    ],
  });
  window.keymemGraph = cy;
  const expanded = new Set();

  function rebuildList() {
    const nodes = cy.nodes().sort((a, b) => (a.data("kind") === b.data("kind") ? a.data("label").localeCompare(b.data("label"))
      : a.data("kind") === "key" ? -1 : 1));
    list.replaceChildren(...nodes.map((n) => el("li", {}, el("button", {
      type: "button", class: n.data("kind") + (expanded.has(n.id()) ? " expanded" : ""), "data-node": n.id(),
      "aria-label": (n.data("kind") === "key" ? "key " : "memory ") + n.data("label") + (expanded.has(n.id()) ? " (expanded)" : ""),
      onclick: () => expand(n.id()),
      onfocus: () => { cy.nodes().unselect(); n.select(); },
      onkeydown: (event) => {
        const buttons = [...list.querySelectorAll("button")];
        const at = buttons.indexOf(event.currentTarget);
        if (event.key === "ArrowDown" && at < buttons.length - 1) { buttons[at + 1].focus(); event.preventDefault(); }
        if (event.key === "ArrowUp" && at > 0) { buttons[at - 1].focus(); event.preventDefault(); }
        if (event.key === "o") location.hash = n.data("kind") === "key" ? "#/key/" + n.data("ref") : "#/memory/" + n.data("ref");
      } }, (n.data("kind") === "key" ? "◆ " : "● ") + n.data("label")),
      el("a", { class: "meta open", tabindex: "-1", href: n.data("kind") === "key" ? "#/key/" + n.data("ref") : "#/memory/" + n.data("ref") },
        "open"))));
  }

  async function expand(nodeId) {
    const node = cy.getElementById(nodeId);
    const path = node.data("kind") === "key" ? "/graph/key/" : "/graph/memory/";
    let data;
    try { data = await api(path + node.data("ref")); } catch (e) { say(e.message, true); return; }
    add(data);
    expanded.add(nodeId);
    cy.getElementById(nodeId).addClass("expanded");
    layout();
    rebuildList();
    const focused = list.querySelector('[data-node="' + CSS.escape(nodeId) + '"]');
    if (focused && list.contains(document.activeElement)) focused.focus();
    say("Expanded " + node.data("label"));
  }

  function add(data) {
    const fresh = [];
    for (const n of data.nodes) if (cy.getElementById(n.id).empty()) fresh.push({ group: "nodes", data: n });
    for (const e of data.edges) if (cy.getElementById(e.id).empty()) fresh.push({ group: "edges", data: e });
    cy.add(fresh);
  }

  function layout() {
    cy.layout({ name: "cose", animate: false, randomize: false, nodeRepulsion: () => 9000, idealEdgeLength: () => 70,
      padding: 20 }).run();
  }

  cy.on("tap", "node", (event) => expand(event.target.id()));
  try {
    const data = await api((kind === "key" ? "/graph/key/" : "/graph/memory/") + encodeURIComponent(ref));
    add(data);
    expanded.add(data.center);
    cy.getElementById(data.center).addClass("expanded");
    layout();
    rebuildList();
  } catch (e) { say(e.message, true); }
}

// -- activity -----------------------------------------------------------------------------

function entryRow(e) {
  const d = e.detail || {};
  const extra = [];
  if (e.kind === "inject") {
    if (d.memories && d.memories.length) {
      extra.push(el("ul", { class: "surfaced" }, d.memories.map((m) => el("li", {},
        el("a", { href: "#/memory/" + m.id }, m.id), " relevance " + m.relevance_score +
        (m.matched_key ? " · key " + m.matched_key.concept : "") + (m.reason ? " · " + m.reason : "") + " — ", m.content))));
    } else extra.push(el("p", { class: "muted" }, "silent: " + (d.silent || d.skipped || "nothing relevant")));
  }
  const memoryLink = e.memory_id ? el("a", { href: "#/memory/" + e.memory_id }, e.memory_id) : null;
  return el("article", { class: "card entry", "data-kind": e.kind, "data-id": String(e.id) },
    el("span", { class: "meta" }, when(e.at)), el("span", { class: "kind" }, e.kind),
    el("div", {}, el("div", {}, e.summary, " ", memoryLink,
      d.actor ? el("span", { class: "meta" }, " · by " + d.actor) : null), extra));
}

async function viewActivity(hash) {
  const p = params(hash);
  const current = started();
  const kinds = ["", "inject", "remember", "remember_batch", "correct", "forget", "confirm_memory", "dismiss", "import"];
  const kindSelect = el("select", { id: "kind", "aria-label": "Kind", onchange: () => {
    location.hash = "#/activity" + (kindSelect.value ? "?kind=" + kindSelect.value : "");
  } }, kinds.map((k) => el("option", { value: k, selected: (p.get("kind") || "") === k }, k || "all kinds")));
  const feed = el("section", { class: "feed", id: "feed", "aria-live": "polite", "aria-label": "Activity feed" });
  const state = el("p", { class: "muted", id: "feed-state" }, "Live: new entries appear as they happen.");
  show(heading("Activity"), el("div", { class: "row" }, kindSelect, state), feed);
  let latest = 0;
  const kind = p.get("kind") || "";
  function add(entries) {
    for (const e of entries) {
      if (e.id <= latest || feed.querySelector('[data-id="' + e.id + '"]')) continue;
      feed.prepend(entryRow(e));
    }
    if (!feed.children.length) feed.replaceChildren(el("p", { class: "muted empty" }, "Nothing yet."));
    else feed.querySelector(".empty")?.remove();
  }
  async function poll() {
    try {
      const data = await api("/activity?after=" + latest + "&limit=100" + (kind ? "&kind=" + kind : ""));
      if (!data.enabled) state.textContent = "The activity log is off (KEYMEM_INJECT_LOG=off).";
      add(data.entries.slice().reverse());
      latest = Math.max(latest, data.latest_id);
    } catch (e) { say(e.message, true); }
  }
  await poll();
  if (!current()) return;  // left while the first page loaded: no stream for a feed nobody sees
  // Live: server-sent events; polling if the browser has no EventSource or the stream fails.
  if (typeof EventSource === "undefined") { activityTimer = setInterval(poll, ACTIVITY_POLL_MS); return; }
  const stream = new EventSource("/ui/api/activity/stream?after=" + latest + (kind ? "&kind=" + kind : ""));
  activityStream = stream;
  stream.addEventListener("entry", (event) => {
    const e = JSON.parse(event.data);
    add([e]);
    latest = Math.max(latest, e.id);
  });
  stream.addEventListener("error", () => {
    if (stream.readyState !== EventSource.CLOSED || activityStream !== stream) return;
    activityStream = null;
    activityTimer = setInterval(poll, ACTIVITY_POLL_MS);
  });
}

// -- health -------------------------------------------------------------------------------

async function viewHealth() {
  const current = started();
  let h;
  try { h = await api("/health"); } catch (e) {
    if (current()) show(heading("Health"), el("p", { class: "error" }, e.message));
    return;
  }
  if (!current()) return;
  const s = h.stats;
  const rr = s.reranker || {};
  const fileInput = el("input", { type: "file", id: "import-file", accept: "application/json,.json", "aria-label": "Export file to import" });
  const outcome = el("div", { id: "import-outcome", "aria-live": "polite" });
  const log = h.settings.activity_log;
  const shared = h.shared_store;
  const followed = (cl) => !cl ? "not followed yet (the server has not answered this daemon)"
    : "position " + cl.position + (cl.read_to_end_s_ago !== null ? ", read to its end " + cl.read_to_end_s_ago + " s ago"
      : ", not read to its end yet") + (cl.connected ? "" : " (not connected)");
  show(
    heading("Health"),
    el("div", { class: "grid2" },
      el("section", {},
        el("h2", {}, "Daemon"),
        table(["", ""], [["status", h.health.status], ["version", h.health.version], ["pid", String(h.health.pid)],
          ["uptime", Math.round(s.uptime_s) + " s"], ["data", s.data_dir]]),
        el("h2", {}, "Models"),
        table(["", ""], [["embedder", s.embedder || "—"], ["Korean analyser", s.korean_analyzer || "—"],
          ["reranker", (rr.mode || "—") + " · " + (rr.state || "—") + " · ranking " + (rr.ranking || "—")]]),
        el("h2", {}, "Store"),
        table(["", ""], [["at", path(s.store || "—")],
          ...(s.stores || []).map((part) => [path(part.store), part.counts ? part.counts.memories + " memories, " +
            part.counts.keys + " keys, " + part.counts.links + " links" : "does not answer"]),
          ["memories", String(s.memories)], ["keys", String(s.keys)], ["links", String(s.links)],
          ["superseded", String(s.superseded)], ["expired, pending cleanup", String(s.expired_pending_cleanup)],
          ["namespaces", Object.entries(s.namespaces || {}).map(([n, c]) => n + " " + c).join(", ") || "—"],
          ["activity log", log ? log[0] + " entries, " + log[1] + " days" : "off"]]),
        shared ? el("h2", {}, "Team store (PostgreSQL)") : null,
        shared ? el("div", { id: "shared-store" }, table(["", ""], [["server and role", path(shared.store)],
          ["namespaces there", shared.namespaces ? shared.namespaces.join(", ") : "every namespace"],
          ["state", path(shared.stale || "follows the server")], ["local replica", path(shared.replica || "—")],
          ["change log", followed(shared.change_log)]])) : null,
        el("h2", {}, "Learned words"),
        (s.learned_words || []).length ? el("p", {}, s.learned_words.join(", ")) : el("p", { class: "muted" }, "None yet.")),
      el("aside", {},
        el("h2", {}, "Backups"),
        el("p", { class: "meta path", id: "backups-of" }, h.backups_of
          ? "Of the local store, " + h.backups_of + (shared ? "; the team store's memories are the PostgreSQL server's to back up (pg_dump)." : ".")
          : "The PostgreSQL server keeps the memories: back it up with its own tools (pg_dump); keymem writes no backups of it."),
        h.backups.length ? table(["file", "size", "written"], h.backups.map((b) => [
          el("a", { href: "/ui/api/backups/" + encodeURIComponent(b.name), download: b.name }, b.name),
          Math.round(b.bytes / 1024) + " KiB", when(b.modified)])) : el("p", { class: "muted" }, "No backups yet."),
        el("h2", {}, "Export and import"),
        el("p", {}, el("a", { href: "/ui/api/export", download: "keymem-export.json", id: "export" }, "Download an export (JSON)")),
        el("div", { class: "row" }, fileInput, el("button", { type: "button", id: "import-btn", onclick: () => importFile(fileInput, outcome) }, "Import")),
        outcome)));
}

// An export file, read in the page and sent to /ui/api/import: the engine's import, one
// transaction, so a refused file changes nothing.
async function importFile(fileInput, outcome) {
  const file = fileInput.files[0];
  if (!file) { say("Choose an export file first", true); return; }
  const failed = (message) => {
    outcome.replaceChildren(el("p", { class: "error", id: "import-error", role: "alert" },
      "Import failed, nothing was changed: " + message));
    say("Import failed", true);
  };
  let data;
  try { data = JSON.parse(await file.text()); } catch (e) {
    failed(file.name + " is not a keymem export: it is not JSON (" + e.message + ")");
    return;
  }
  outcome.replaceChildren(el("p", { class: "muted" }, "Importing " + file.name + " … ", el("progress", { "aria-label": "Importing" })));
  try {
    const result = (await api("/import", { method: "POST", body: data })).result;
    const kinds = [...new Set([...Object.keys(result.imported || {}), ...Object.keys(result.skipped || {})])];
    outcome.replaceChildren(el("p", { id: "import-done" }, "Imported " + file.name + ":"),
      table(["", "imported", "skipped (already here)"], kinds.map((k) => [k,
        String((result.imported || {})[k] || 0), String((result.skipped || {})[k] || 0)])));
    say("Import done");
  } catch (e) { failed(e.message); }
}

// -- routing ------------------------------------------------------------------------------

function route() {
  if (activityTimer !== null) { clearInterval(activityTimer); activityTimer = null; }
  if (activityStream !== null) { activityStream.close(); activityStream = null; }
  viewSerial += 1;
  const hash = location.hash || "#/search";
  const view = hash.slice(2).split(/[/?]/)[0] || "search";
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.view === view) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  const parts = hash.split("?")[0].split("/");
  const views = {
    search: () => viewSearch(hash), memory: () => viewMemory(decodeURIComponent(parts[2] || "")),
    key: () => viewKey(decodeURIComponent(parts[2] || "")), graph: () => viewGraph(hash),
    activity: () => viewActivity(hash), health: () => viewHealth(),
  };
  (views[view] || views.search)();
}

window.addEventListener("hashchange", route);
route();
