"""Secrets never reach the store: credentials in memory content are replaced by a marker
before anything is written, and the response says what was removed.

The patterns are the well-known shapes of provider keys and tokens, private key blocks,
credentials inside URLs and ``password=``-style assignments. Each match becomes
``[REDACTED:<kind>]``; the surrounding text is kept so the memory still makes sense.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Final

_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("private_key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
        re.DOTALL)),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[0-9A-Z]{16}\b")),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b")),
    ("anthropic_key", re.compile(r"\bsk-ant-[A-Za-z0-9_-]{20,}")),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("stripe_key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b")),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("bearer_token", re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/=-]{20,}")),
    ("url_credentials", re.compile(r"(?<=://)[^\s:/@]+:[^\s@/]+(?=@)")),
    # key = value / key: value / "key": "value" for secret-named keys; the name stays.
    ("assignment", re.compile(
        r"""(?ix)(?<![a-z0-9])[a-z0-9_.-]*
        (?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token
          |refresh[_-]?token|client[_-]?secret|private[_-]?key|token)
        ["']?\s*[:=]\s*["']?
        |(?:비밀번호|패스워드|암호|토큰)\s*(?:[:=]|은|는)\s*["']?""")),
)
_ASSIGNMENT_VALUE: Final = re.compile(r"""[^\s"',;)}]{4,}""")


@dataclass(frozen=True, slots=True)
class Redaction:
    kind: str
    count: int


def redact(text: str) -> tuple[str, list[Redaction]]:
    """``text`` with every recognised secret replaced, and what was replaced."""
    found: Counter[str] = Counter()
    for kind, pattern in _PATTERNS:
        if kind == "assignment":
            text = _redact_assignments(text, pattern, found)
            continue

        def mark(match: re.Match[str], kind: str = kind) -> str:
            found[kind] += 1
            return f"[REDACTED:{kind}]"

        text = pattern.sub(mark, text)
    return text, [Redaction(kind, n) for kind, n in sorted(found.items())]


def _redact_assignments(text: str, name: re.Pattern[str], found: Counter[str]) -> str:
    out: list[str] = []
    pos = 0
    for match in name.finditer(text):
        if match.start() < pos:
            continue
        value = _ASSIGNMENT_VALUE.match(text, match.end())
        if value is None or value.group().startswith("[REDACTED:"):
            continue
        out.append(text[pos:value.start()])
        out.append("[REDACTED:secret]")
        found["secret"] += 1
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)
