"""The daemon's logging: one ``dictConfig`` dict, shared with uvicorn.

Everything goes to ``<data>/logs/daemon.log`` (rotating), and to stderr too when the
daemon runs in the foreground (``keymemd run``; under systemd that is the journal).
uvicorn gets the same dict as ``log_config``, so its loggers use the same handlers.

What is never logged: the bearer token or any other credential (a filter masks anything
that looks like an ``Authorization`` value, and the value of every query parameter whose
name says it is a secret -- ``?token=``, ``api_key=``, ``password=`` -- as uvicorn's access
log at DEBUG would print them), and prompt or memory text at INFO or above -- modules log
ids and counts, and text only at DEBUG.

A flood of one failure is logged once per ``FLOOD_INTERVAL`` with a count: running out
of file descriptors (a local program holding a thousand connections open) would otherwise
write a traceback per refused ``accept()`` and rotate the real log away.
"""

from __future__ import annotations

import logging
import logging.config
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from keymem_daemon.config import Settings
from keymem_daemon.errors import StoreError

LOG_MAX_BYTES: Final = 5 * 1024 * 1024
LOG_BACKUPS: Final = 3
FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s [%(process)d]: %(message)s"

FLOOD_INTERVAL: Final = 30.0
"""Seconds between two log lines about the same flood (the count of those left out follows)."""

_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:[\w.%-]*?)(?:token|key|pass|pwd|secret|auth|cred|sig|session|cookie)[\w.%-]*=)[^&;#\s\"']+"
)
"""A query parameter whose name says it carries a secret (``access_token``, ``api-key``,
``password``, ``client_secret``, ``auth``, ``signature``), up to the end of its value."""
_FLOODS: Final = ("Too many open files", "out of system resource")
"""Messages (or their exception text) of the failures a flood of connections repeats."""


class RedactTokens(logging.Filter):
    """Masks bearer tokens and secret-named query values in a record's final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = _SECRET_PARAM.sub(r"\1[redacted]", _BEARER.sub(r"\1[redacted]", message))
        if masked != message:
            record.msg = masked
            record.args = None
        return True


class RateLimitFloods(logging.Filter):
    """Lets one record about a descriptor flood through per ``FLOOD_INTERVAL``, with a count.

    Shared by the file and stderr handlers, so the verdict is kept on the record: the
    second handler must not count the same record twice.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._lock = threading.Lock()
        self._last = -FLOOD_INTERVAL
        self._left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        verdict: bool | None = getattr(record, "_keymem_flood_verdict", None)
        if verdict is None:
            verdict = self._judge(record)
            record._keymem_flood_verdict = verdict
        return verdict

    def _judge(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]}"
        if not any(flood in text for flood in _FLOODS):
            return True
        with self._lock:
            now = self._clock()
            if now - self._last < FLOOD_INTERVAL:
                self._left_out += 1
                return False
            self._last, left_out = now, self._left_out
            self._left_out = 0
        summary = f" ({left_out} more like it in the last {FLOOD_INTERVAL:.0f} s not logged)" if left_out else ""
        record.msg = f"{text.strip()}{summary}; the daemon closes idle connections to make room"
        record.args = None
        record.exc_info = None  # one line, not a traceback per refused accept()
        record.exc_text = None
        return True


def logging_config(settings: Settings, *, stderr: bool) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` dict for the daemon (also uvicorn's ``log_config``)."""
    level = settings.log_level.upper()
    handlers = ["file", "stderr"] if stderr else ["file"]
    # One request line per call is noise at INFO (and thousands of lines in a bulk load).
    access_level = "INFO" if level == "DEBUG" else "WARNING"
    handler_common = {"formatter": "plain", "filters": ["floods", "redact"], "level": "DEBUG"}
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": RedactTokens}, "floods": {"()": RateLimitFloods}},
        "formatters": {"plain": {"format": FORMAT}},
        "handlers": {
            "file": {
                **handler_common,
                "class": "logging.handlers.RotatingFileHandler",
                "filename": str(settings.log_path),
                "maxBytes": LOG_MAX_BYTES,
                "backupCount": LOG_BACKUPS,
                "encoding": "utf-8",
            },
            "stderr": {
                **handler_common,
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": {
            "keymem_daemon": {"level": level},
            "uvicorn": {"level": level},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"level": access_level},
            "apscheduler": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
            "huggingface_hub": {"level": "WARNING"},
        },
        "root": {"level": "WARNING", "handlers": handlers},
    }
    if not stderr:
        del config["handlers"]["stderr"]
    return config


def prepare_log_dir(settings: Settings) -> Path:
    """Create ``<data>/logs`` (private) and return the log file's path."""
    settings.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return settings.log_path


def configure(settings: Settings, *, stderr: bool) -> dict[str, Any]:
    """Install the daemon's logging; returns the dict (uvicorn's ``log_config`` too).

    A log that cannot be opened is one ``StoreError`` saying why, not logging's
    "Unable to configure handler 'file'" traceback.
    """
    config = logging_config(settings, stderr=stderr)
    try:
        prepare_log_dir(settings)
        logging.config.dictConfig(config)
    except (OSError, ValueError) as exc:
        cause: BaseException = exc
        while not isinstance(cause, OSError) and cause.__cause__ is not None:
            cause = cause.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        raise StoreError(f"keymem cannot write its log {settings.log_path}: {why}") from None
    return config


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a log file ([] if it does not exist)."""
    if lines <= 0:
        return []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in deque(handle, maxlen=lines)]
    except FileNotFoundError:
        return []


def same_file(path: Path, fd: int) -> bool:
    """Is the open file ``fd`` still the file at ``path`` (not rotated away)?"""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False
