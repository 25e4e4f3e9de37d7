"""Settings: every ``KEYMEM_*`` variable is read here and nowhere else.

``Settings.from_env(os.environ)`` builds one frozen value; tests pass a plain dict.
A malformed value fails at start-up naming the variable and the value. The table
``VARIABLES`` holds each variable's default and meaning; the README documents every
entry (a test checks it). This module imports only the standard library, because the
shim and the CLI's ``status``/``stop`` import it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlsplit

from keymem_daemon.errors import ConfigError

ToolSurface = Literal["default", "full"]
RerankMode = Literal["auto", "true", "false"]

_TRUE: Final = {"1", "true", "yes", "on"}
_FALSE: Final = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use true or false)")


def parse_duration(name: str, raw: str) -> float:
    """Seconds, optionally with a unit suffix: ``90``, ``90s``, ``15m``, ``1h``, ``2d``."""
    text = raw.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    scale = 1.0
    if text and text[-1] in units:
        scale = units[text[-1]]
        text = text[:-1]
    try:
        value = float(text) * scale
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a duration (seconds, or 15m, 1h, 2d)") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={raw!r} must be a finite duration >= 0")
    return value


def _number(kind: Callable[[str], Any], low: float | None = None, high: float | None = None) -> Any:
    def parse(name: str, raw: str) -> Any:
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}={raw!r} must be finite")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
            raise ConfigError(f"{name}={raw!r} must be within {bounds}")
        return value

    return parse


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ConfigError(f"{name}={raw!r} must be one of: {', '.join(options)}")
        return value

    return parse


INJECT_LOG_DEFAULT: Final = (5000, 30.0)
"""The activity log's bound: entries kept, and days (a week of heavy use, a month of light)."""


def parse_activity_log(name: str, raw: str) -> tuple[int, float] | None:
    """``on`` (the default bound), ``off`` (None), ``N`` entries, or ``N,D`` entries and days."""
    text = raw.strip().lower()
    if text in _FALSE:
        return None
    if text in _TRUE:
        return INJECT_LOG_DEFAULT
    entries, _, days = text.partition(",")
    try:
        bound = (int(entries), float(days) if days.strip() else INJECT_LOG_DEFAULT[1])
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be on, off, N (entries) or N,D (entries, days)") from None
    if bound[0] < 1 or not math.isfinite(bound[1]) or bound[1] <= 0:
        raise ConfigError(f"{name}={raw!r}: entries must be >= 1 and days > 0")
    return bound


def _text(name: str, raw: str) -> str:
    return raw.strip()


def _path(name: str, raw: str) -> Path:
    if not raw.strip():
        raise ConfigError(f"{name} is set but empty")
    return Path(raw.strip()).expanduser().resolve()


STORE_URL_SCHEMES: Final = ("postgresql", "postgres")
"""libpq's URI schemes (the only server backend; unset means the embedded SQLite store)."""
_DEFAULT_PG_PORT: Final = 5432
STORE_LOCK_TIMEOUT: Final = 2.0
"""Seconds a statement of the daemon waits for a row lock another session holds on the
PostgreSQL store (its ``lock_timeout``) before the write is run again: a lock another daemon's
write holds lasts one short transaction, and below the connections' silence watch (5 s,
store/postgres/liveness.py), so the server says why instead of the daemon calling it gone."""
STORE_LOCK_TIMEOUT_RANGE: Final = (0.05, 4.5)
"""Above 0 (0 is PostgreSQL's "wait for ever") and below the 5 s silence watch, which would cut
the connection first and report the server as not answering."""
STORE_IDLE_TIMEOUT: Final = 5.0
"""Seconds a session of the daemon may sit idle inside a transaction before the server ends
it (``idle_in_transaction_session_timeout``), releasing its row locks: keymem's transactions
never wait on anything but the server (an embedding is made before its write begins), so an
idle one belongs to a daemon that hangs or whose network froze. Short enough that another
daemon's write to the same rows, run again while it waits (``STORE_LOCK_TIMEOUT``), succeeds
within its 10 s budget."""


def _split_store_url(name: str, raw: str) -> SplitResult:
    try:
        url = urlsplit(raw.strip())
        url.port  # noqa: B018 - parses the port: a bad one raises here, not at connect time
    except ValueError as exc:
        raise ConfigError(f"{name} is not a valid URL ({exc}): {redacted_url(raw)}") from None
    if url.scheme not in STORE_URL_SCHEMES:
        raise ConfigError(f"{name}={redacted_url(raw)!r} must be a postgresql:// URL (unset it for the "
                          "embedded SQLite store)")
    if not url.path.strip("/") and not parse_qs(url.query).get("dbname"):
        raise ConfigError(f"{name}={redacted_url(raw)!r} names no database (postgresql://ROLE@HOST:PORT/DATABASE)")
    return url


def parse_store_url(name: str, raw: str) -> str:
    """A ``postgresql://`` URL naming a database; the password may be in it, in PGPASSFILE
    (``~/.pgpass``) or in PGPASSWORD -- libpq reads those itself."""
    _split_store_url(name, raw)
    return raw.strip()


def redacted_url(url: str) -> str:
    """``url`` with any password (in the userinfo or a ``password=`` parameter) replaced by
    ``***``: the only form of a store URL that may be logged or shown."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    if parts.password is None and "password=" not in parts.query.lower():
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user = quote(unquote(parts.username or ""), safe="")
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = "&".join("password=***" if item.lower().startswith("password=") else item
                     for item in parts.query.split("&"))
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def describe_store_url(url: str) -> str:
    """``postgresql HOST:PORT/DATABASE as ROLE`` for status and /health (never the password).
    What libpq would default (no role: the OS user or PGUSER; no host: the local socket) is
    said as such rather than guessed."""
    parts = _split_store_url("KEYMEM_STORE_URL", url)
    query = parse_qs(parts.query)
    host = parts.hostname or (query.get("host") or ["local socket"])[0]
    port = parts.port or int((query.get("port") or [str(_DEFAULT_PG_PORT)])[0])
    database = parts.path.strip("/") or query["dbname"][0]
    role = unquote(parts.username) if parts.username else (query.get("user") or ["the default role"])[0]
    return f"postgresql {host}:{port}/{unquote(database)} as {role}"


_TEAM_NAMESPACE: Final = re.compile(r"[\w .:/@-]*")
"""What a namespace named in KEYMEM_TEAM_NAMESPACES may hold: a quote or a ! left over from
the shell would map a namespace nobody writes to, silently."""


def parse_team_namespaces(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated namespace names, each optionally ending in ``*`` (a prefix): the
    namespaces that live in the PostgreSQL store while every other stays in the local SQLite
    one. Compared casefolded, as namespaces are (``federation.NamespaceRouter`` applies the
    engine's full normalisation)."""
    patterns: list[str] = []
    for index, part in enumerate(raw.split(",")):
        entry = part.strip()
        if not entry:
            raise ConfigError(f"{name}={raw!r}: entry {index + 1} is empty (names or prefixes like team-*, "
                              "separated by commas)")
        if "*" in entry[:-1]:
            raise ConfigError(f"{name}={raw!r}: {entry!r} may hold '*' only at its end (a prefix such as team-*)")
        if not _TEAM_NAMESPACE.fullmatch(entry.removesuffix("*")):
            raise ConfigError(f"{name}={raw!r}: {entry!r} is not a namespace name (letters, digits, spaces and "
                              "- _ . : / @, with an optional * at the end)")
        if entry == "*":
            raise ConfigError(f"{name}={raw!r}: '*' maps every namespace to PostgreSQL; unset {name} for that "
                              "(KEYMEM_STORE_URL alone puts the whole store there)")
        patterns.append(entry)
    return tuple(dict.fromkeys(patterns))


@dataclass(frozen=True, slots=True)
class Variable:
    """One environment variable: the Settings field it sets, its parser and its meaning."""

    env: str
    field: str
    parse: Callable[[str, str], Any]
    default: str
    help: str


# The one table of variables and defaults. ``default`` is what the README shows.
VARIABLES: Final[tuple[Variable, ...]] = (
    Variable("KEYMEM_DATA_DIR", "data_dir", _path, "~/.keymem",
             "Data directory: keymem.db, daemon.json, logs/, backups/, models/, namespaces.json."),
    Variable("KEYMEM_PORT", "port", _number(int, 0, 65535), "0",
             "Daemon port on 127.0.0.1; 0 picks a free port, published in daemon.json."),
    Variable("KEYMEM_LOG_LEVEL", "log_level", _choice("debug", "info", "warning", "error"), "info",
             "Daemon log level (logs/daemon.log)."),
    Variable("KEYMEM_TOOLS", "tools", _choice("default", "full"), "default",
             "Tool surface: the ten default tools, or full (adds related, list_memories, "
             "memory_stats, cleanup_expired, recall_memories and the transcript tools)."),
    Variable("KEYMEM_TRANSCRIPT_ACCESS", "transcript_access", _choice("auto", "true", "false"), "auto",
             "Host transcript tools (full surface only): auto = for requests from an identified "
             "local host; false always wins."),
    Variable("KEYMEM_HOOK_INSTALLED", "hook_installed", parse_bool, "false",
             "The prompt hook is installed: instructions defer to surfaced memories."),
    Variable("KEYMEM_CLEANUP_INTERVAL", "cleanup_interval", parse_duration, "1h",
             "TTL cleanup and learned-alias pruning period (also run at start)."),
    Variable("KEYMEM_BACKUP_INTERVAL", "backup_interval", parse_duration, "1d",
             "Online SQLite backup period; 0 disables backups."),
    Variable("KEYMEM_BACKUP_KEEP", "backup_keep", _number(int, 1, 1000), "7",
             "How many backups to keep under <data>/backups."),
    Variable("KEYMEM_IDLE_EXIT", "idle_exit", parse_duration, "0",
             "Exit after this long without requests; 0 = never."),
    Variable("KEYMEM_MAX_BODY_BYTES", "max_body_bytes", _number(int, 1024, 1 << 30), "4194304",
             "Largest accepted HTTP request body."),
    Variable("KEYMEM_MAX_CONTENT_CHARS", "max_content_chars", _number(int, 16, 1_000_000), "20000",
             "Longest memory content accepted by remember/correct."),
    Variable("KEYMEM_EMBED_MODEL", "embed_model", _text, "use-multilingual-v3",
             "Embedder: use-multilingual-v3 (embedded, offline), bge-m3 (downloaded once), or a "
             "local ONNX model directory (model.onnx + tokenizer.json)."),
    Variable("KEYMEM_EMBED_MODEL_PATH", "embed_model_path", _path, "<data>/models/<model>",
             "Directory holding the ONNX embedder's files (missing files are fetched)."),
    Variable("KEYMEM_EMBED_THREADS", "embed_threads", _number(int, 1, 64), "min(4, cores)",
             "Threads for embedding inference."),
    Variable("KEYMEM_RERANK", "rerank", _choice("auto", "true", "false"), "auto",
             "Cross-encoder reranker: auto = use it when cached, fetch it in the background; "
             "true = fetch and use it; false = fused ranking only."),
    Variable("KEYMEM_RERANK_MODEL_PATH", "rerank_model_path", _path, "<data>/models/bge-reranker-v2-m3",
             "Directory holding the reranker's files."),
    Variable("KEYMEM_RERANK_POOL", "rerank_pool", _number(int, 2, 200), "30",
             "Candidates rescored by the reranker."),
    Variable("KEYMEM_RERANK_THREADS", "rerank_threads", _number(int, 1, 64), "min(4, cores)",
             "Threads for reranker inference."),
    Variable("KEYMEM_RERANK_BUDGET_MS", "rerank_budget_ms", _number(int, 0, 600_000), "500",
             "Time a tool call may spend in the reranker: it scores the best candidates it can "
             "finish in time (measured speed); 0 = never."),
    Variable("KEYMEM_INJECT_RERANK_BUDGET_MS", "inject_rerank_budget_ms", _number(int, 0, 600_000), "80",
             "The same for the prompt hook's /v1/inject, which runs on every prompt."),
    Variable("KEYMEM_HF_ENDPOINT", "hf_endpoint", _text, "(huggingface-hub default)",
             "Model hub address for downloads (HF_ENDPOINT is honoured too)."),
    Variable("KEYMEM_DOWNLOAD_TIMEOUT", "download_timeout", parse_duration, "10",
             "Seconds to wait for the model hub to answer before giving up."),
    Variable("KEYMEM_AUTO_MIGRATE", "auto_migrate", parse_bool, "true",
             "Re-embed all keys (after a backup) when the embedder changes; false refuses to start."),
    Variable("KEYMEM_KEY_RECALL", "key_recall", _number(float, 0.0, 1.0), "(embedder profile)",
             "Cosine at which a query term reaches a concept key."),
    Variable("KEYMEM_KEY_MERGE", "key_merge", _number(float, 0.0, 1.0), "(embedder profile)",
             "Cosine at which a new long concept key joins an existing key as an alias."),
    Variable("KEYMEM_SHORT_KEY_MERGE", "short_key_merge", _number(float, 0.0, 1.0), "(embedder profile)",
             "Cosine at which a new short (1-2 word) concept key joins an existing key."),
    Variable("KEYMEM_KEY_HUB_MIN_LINKS", "hub_min_links", _number(int, 2, 1_000_000), "3",
             "Memories a key needs (in a namespace) to count as a hub."),
    Variable("KEYMEM_AUTOKEY", "autokey", parse_bool, "true",
             "Learn aliases from queries confirmed by read_memory."),
    Variable("KEYMEM_AUTOKEY_PROMOTE_N", "autokey_promote_n", _number(int, 1, 1000), "3",
             "Confirmations before a query becomes an alias or key."),
    Variable("KEYMEM_AUTOKEY_CONFIRM_FLOOR", "autokey_confirm_floor", _number(float, 0.0, 1.0), "0.45",
             "Lowest query-to-key cosine that alias learning considers."),
    Variable("KEYMEM_AUTOKEY_MAX_ALIASES", "autokey_max_aliases", _number(int, 0, 1000), "8",
             "Learned aliases per key."),
    Variable("KEYMEM_AUTOKEY_PRUNE_AGE", "autokey_prune_age", parse_duration, "30d",
             "A learned alias never hit for this long is pruned."),
    Variable("KEYMEM_DECAY_TRANSIENT_DAYS", "decay_transient_days", _number(float, 1e-6), "7",
             "Freshness half-life of transient memories."),
    Variable("KEYMEM_DECAY_STANDARD_DAYS", "decay_standard_days", _number(float, 1e-6), "90",
             "Freshness half-life of standard memories."),
    Variable("KEYMEM_DECAY_STABLE_DAYS", "decay_stable_days", _number(float, 1e-6), "365",
             "Freshness half-life of stable memories."),
    Variable("KEYMEM_AUTO_CONFIRM", "auto_confirm", parse_bool, "true",
             "recall confirms a memory whose text equals the passed context exactly."),
    Variable("KEYMEM_TASK_EVIDENCE_SELECTION", "task_evidence", parse_bool, "true",
             "Comparison queries pick evidence for each named entity."),
    Variable("KEYMEM_INJECT_MAX_CHARS", "inject_max_chars", _number(int, 256, 20000), "2000",
             "Default size of the block the prompt hook receives."),
    Variable("KEYMEM_INJECT_MIN_REL", "inject_min_rel", _number(float, 0.0, 1.0), "0.5",
             "Floor of the push path's decision (the chance a memory helps with the prompt): 0.5 "
             "keeps the Korean/English set's silence on unanswerable prompts; lower surfaces more "
             "for task prompts, and more noise (see the README's push-path figures)."),
    Variable("KEYMEM_INJECT_SESSION_TTL", "inject_session_ttl", parse_duration, "12h",
             "How long after a host session's last prompt the daemon remembers what it surfaced "
             "there (not repeated in that session); 0 = no session memory."),
    Variable("KEYMEM_INJECT_LOG", "activity_log", parse_activity_log, "5000,30",
             "The activity log the inspector shows (writes, corrections, deletions, and what the "
             "push path surfaced for each prompt, with a prompt preview): at most N entries and D "
             "days (N,D; on = the default); off records nothing."),
    Variable("KEYMEM_RELATED_LIMIT", "related_limit", _number(int, 1, 1000), "20",
             "Most neighbours the related tool returns."),
    Variable("KEYMEM_AUTOSTART", "autostart", parse_bool, "true",
             "The shim and the hook start the daemon when none answers."),
    Variable("KEYMEM_START_TIMEOUT", "start_timeout", parse_duration, "20",
             "How long keymemd start (and the shim) wait for the daemon to listen."),
    Variable("KEYMEM_WARM_SHIM", "warm_shim", parse_bool, "true",
             "keymemd keeps a warm keymem-shim (<data>/shim.sock) that hosts' shims hand their "
             "stdio to: initialize in about 0.1 s instead of the MCP SDK's ~0.5 s import. "
             "false: no warm shim, and shims always serve in-process."),
    Variable("KEYMEM_STORE_URL", "store_url", parse_store_url, "(unset: SQLite in the data dir)",
             "Team memory: a postgresql://ROLE[:PASSWORD]@HOST:PORT/DATABASE URL puts the store on "
             "that PostgreSQL server (the password may instead come from PGPASSFILE or PGPASSWORD; "
             "it is never logged or shown). Unset: the embedded SQLite store <data>/keymem.db."),
    Variable("KEYMEM_TEAM_NAMESPACES", "team_namespaces", parse_team_namespaces,
             "(unset: with KEYMEM_STORE_URL, every namespace in PostgreSQL)",
             "Team memory with a local half: comma-separated namespaces (team-* for a prefix) that "
             "live in the PostgreSQL store at KEYMEM_STORE_URL; every other namespace stays in the "
             "local SQLite store <data>/keymem.db, and recall, the prompt hook and the tools span "
             "both. Needs KEYMEM_STORE_URL."),
    Variable("KEYMEM_STORE_LOCK_TIMEOUT", "store_lock_timeout",
             _number(float, *STORE_LOCK_TIMEOUT_RANGE), f"{STORE_LOCK_TIMEOUT:g}",
             "Team memory: seconds a statement waits for a row lock another session holds on the "
             "PostgreSQL server (lock_timeout) before the write is run again (writes give up, "
             "naming the server, after 10 s); at most 4.5."),
    Variable("KEYMEM_STORE_IDLE_TIMEOUT", "store_idle_timeout", _number(float, 1.0, 3600.0),
             f"{STORE_IDLE_TIMEOUT:g}",
             "Team memory: seconds a daemon's session may sit idle inside a transaction before the "
             "server ends it (idle_in_transaction_session_timeout), so a daemon that hangs or "
             "loses its network mid-write never holds its row locks -- and blocks the others' "
             "writes -- for longer."),
    Variable("KEYMEM_HOST_CWD", "host_cwd", _text, "(the shim's working directory)",
             "The user's project directory as the shim reports it; the plugin launcher sets it "
             "(Codex starts plugin servers inside the plugin). Set but empty: report none."),
)


def _default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class Settings:
    """The daemon's configuration. Build it with ``Settings.from_env``; fields are final."""

    data_dir: Path = field(default_factory=lambda: Path("~/.keymem").expanduser())
    port: int = 0
    log_level: str = "info"
    tools: ToolSurface = "default"
    transcript_access: Literal["auto", "true", "false"] = "auto"
    hook_installed: bool = False
    cleanup_interval: float = 3600.0
    backup_interval: float = 86400.0
    backup_keep: int = 7
    idle_exit: float = 0.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_content_chars: int = 20000
    embed_model: str = "use-multilingual-v3"
    embed_model_path: Path | None = None
    embed_threads: int = field(default_factory=_default_threads)
    rerank: RerankMode = "auto"
    rerank_model_path: Path | None = None
    rerank_pool: int = 30
    rerank_threads: int = field(default_factory=_default_threads)
    rerank_budget_ms: int = 500
    inject_rerank_budget_ms: int = 80
    hf_endpoint: str = ""
    download_timeout: float = 10.0
    auto_migrate: bool = True
    key_recall: float | None = None
    key_merge: float | None = None
    short_key_merge: float | None = None
    hub_min_links: int = 3
    autokey: bool = True
    autokey_promote_n: int = 3
    autokey_confirm_floor: float = 0.45
    autokey_max_aliases: int = 8
    autokey_prune_age: float = 30 * 86400.0
    decay_transient_days: float = 7.0
    decay_standard_days: float = 90.0
    decay_stable_days: float = 365.0
    auto_confirm: bool = True
    task_evidence: bool = True
    inject_max_chars: int = 2000
    inject_min_rel: float = 0.5
    inject_session_ttl: float = 12 * 3600.0
    activity_log: tuple[int, float] | None = INJECT_LOG_DEFAULT
    related_limit: int = 20
    autostart: bool = True
    start_timeout: float = 20.0
    warm_shim: bool = True
    host_cwd: str | None = None
    # Holds the password when the URL carries one: out of repr, so a logged Settings shows none.
    store_url: str | None = field(default=None, repr=False)
    team_namespaces: tuple[str, ...] | None = None
    store_lock_timeout: float = STORE_LOCK_TIMEOUT
    store_idle_timeout: float = STORE_IDLE_TIMEOUT
    # Host transcript roots (CLAUDE_CONFIG_DIR / CODEX_HOME); not KEYMEM_ variables.
    claude_dir: Path = field(default_factory=lambda: Path("~/.claude").expanduser())
    codex_dir: Path = field(default_factory=lambda: Path("~/.codex").expanduser())

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> Settings:
        """Read every variable of ``VARIABLES`` from ``environ``; ``overrides`` win (CLI flags)."""
        values: dict[str, Any] = {}
        for var in VARIABLES:
            raw = environ.get(var.env)
            if raw is not None and raw.strip() != "":
                values[var.field] = var.parse(var.env, raw)
        if environ.get("KEYMEM_HOST_CWD") is not None:
            # Unlike other variables, an empty value means something: report no directory.
            values["host_cwd"] = environ["KEYMEM_HOST_CWD"].strip()
        if not values.get("hf_endpoint") and environ.get("HF_ENDPOINT"):
            values["hf_endpoint"] = environ["HF_ENDPOINT"].strip()
        home = Path(environ.get("HOME") or Path.home())
        values.setdefault("data_dir", (home / ".keymem").resolve())
        values["claude_dir"] = Path(environ.get("CLAUDE_CONFIG_DIR") or home / ".claude")
        values["codex_dir"] = Path(environ.get("CODEX_HOME") or home / ".codex")
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.get("team_namespaces") and values.get("store_url") is None:
            raise ConfigError("KEYMEM_TEAM_NAMESPACES is set but KEYMEM_STORE_URL is not: the team namespaces "
                              "need the PostgreSQL store they live in (set KEYMEM_STORE_URL, or unset "
                              "KEYMEM_TEAM_NAMESPACES to keep every namespace in the local SQLite store)")
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    # Paths derived from the data dir, in one place.
    @property
    def db_path(self) -> Path:
        return self.data_dir / "keymem.db"

    @property
    def store_description(self) -> str:
        """Which store this configuration uses, as status and /health say it."""
        if self.store_url is None:
            return f"sqlite {self.db_path}"
        if self.federated:
            return (f"sqlite {self.db_path}, and {describe_store_url(self.store_url)} for the namespaces "
                    f"{', '.join(self.team_namespaces or ())}")
        return describe_store_url(self.store_url)

    @property
    def federated(self) -> bool:
        """Personal namespaces in the local SQLite store, team ones (``team_namespaces``) in
        PostgreSQL: the daemon serves from both (``federation.py``)."""
        return self.store_url is not None and bool(self.team_namespaces)

    @property
    def info_path(self) -> Path:
        return self.data_dir / "daemon.json"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "daemon.lock"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def log_path(self) -> Path:
        return self.log_dir / "daemon.log"

    @property
    def warm_shim_socket(self) -> Path:
        """Where the daemon's warm shim (``keymem_shim._forkserver``) takes hosts' shims' stdio."""
        return self.data_dir / "shim.sock"

    @property
    def backup_dir(self) -> Path:
        return self.data_dir / "backups"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def namespaces_path(self) -> Path:
        return self.data_dir / "namespaces.json"
