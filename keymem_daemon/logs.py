"""The daemon's logging: one ``dictConfig`` dict, shared with uvicorn.

Everything goes to ``<data>/logs/daemon.log`` (rotating), and to stderr too when the
daemon runs in the foreground (``keymemd run``; under systemd that is the journal).
uvicorn gets the same dict as ``log_config``, so its loggers use the same handlers.

What is never logged: the bearer token (a filter masks anything that looks like an
``Authorization`` value, in case a library ever prints one), and prompt or memory text
at INFO or above -- modules log ids and counts, and text only at DEBUG.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from pathlib import Path
from typing import Any, Final

from keymem_daemon.config import Settings

LOG_MAX_BYTES: Final = 5 * 1024 * 1024
LOG_BACKUPS: Final = 3
FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s [%(process)d]: %(message)s"

_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


class RedactTokens(logging.Filter):
    """Masks bearer tokens in a record's final message (defence in depth)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "earer" in message:
            record.msg = _BEARER.sub(r"\1[redacted]", message)
            record.args = None
        return True


def logging_config(settings: Settings, *, stderr: bool) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` dict for the daemon (also uvicorn's ``log_config``)."""
    level = settings.log_level.upper()
    handlers = ["file", "stderr"] if stderr else ["file"]
    # One request line per call is noise at INFO (and thousands of lines in a bulk load).
    access_level = "INFO" if level == "DEBUG" else "WARNING"
    handler_common = {"formatter": "plain", "filters": ["redact"], "level": "DEBUG"}
    config: dict[str, Any] = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": {"()": RedactTokens}},
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
