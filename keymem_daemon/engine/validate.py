"""Validation of the engine's arguments that come from outside: ids, namespaces, observed_at,
evidence kinds. Each failure is an ``InvalidInput`` naming its field."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Final

import numpy as np

from keymem_daemon.engine.text import normalize_namespace
from keymem_daemon.errors import InvalidInput

EVIDENCE_KINDS: Final = ("user", "authoritative_source", "observation")

ID_PATTERN: Final = re.compile(r"^[0-9a-f]{12}$")


def parse_observed_at(value: object, *, field: str = "observed_at") -> float | None:
    """An ISO-8601 date or datetime, or epoch seconds; naive times are taken as UTC."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{field} must be an ISO-8601 date/time or epoch seconds", field=field)
    if isinstance(value, int | float):
        if not np.isfinite(value) or value < 0:
            raise InvalidInput(f"{field} must be a finite, non-negative epoch time", field=field)
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(
                f"{field} is not an ISO-8601 date/time: {text[:40]!r} (e.g. 2023-05-08 or "
                "2023-05-08T13:56:00Z)", field=field) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    raise InvalidInput(f"{field} must be an ISO-8601 date/time or epoch seconds", field=field)


def require_str(value: object, field: str) -> str:
    """``value``, which must be a string."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string", field=field)
    return value


def namespace_arg(value: object, *, field: str = "namespace") -> str | None:
    """A namespace argument, normalised; None (and a blank one) means every namespace."""
    if value is None:
        return None
    text = require_str(value, field)
    return normalize_namespace(text) if text.strip() else None


def related_arg(value: object) -> list[str]:
    """A ``related_to`` argument: memory ids, as an array or a JSON array in a string (or one
    id), each once in the order given; None is none."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip().startswith("[") else [value]
        except json.JSONDecodeError:
            raise InvalidInput("related_to is not a JSON array", field="related_to") from None
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise InvalidInput("related_to must be an array of memory ids", field="related_to")
    return list(dict.fromkeys(value))


def key_id_arg(value: object) -> str:
    """A key id argument: the 12 hex characters recall and browse_keys show."""
    key_id = require_str(value, "key_id")
    if not ID_PATTERN.match(key_id):
        raise InvalidInput(
            f"key_id {key_id[:40]!r} is not a key id: pass the 12-character id from recall or "
            "browse_keys (e.g. 'a1b2c3d4e5f6'), not the concept text -- call recall(query) to find it.",
            field="key_id")
    return key_id


def evidence_arg(value: object) -> str:
    """A confirmation's evidence: one of ``EVIDENCE_KINDS``."""
    if value not in EVIDENCE_KINDS:
        raise InvalidInput(f"Unknown confirmation evidence: {value!r} (use one of "
                           f"{', '.join(EVIDENCE_KINDS)})", field="evidence")
    return str(value)
