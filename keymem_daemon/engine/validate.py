"""Validation of the engine's arguments that come from outside: ids, observed_at, evidence."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Final

import numpy as np

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
