"""How a daemon proves that it is the one ``daemon.json`` names: ``health_proof``.

A client sends a fresh nonce on ``GET /health?nonce=...``; only the process that wrote
daemon.json's token can answer it with the right HMAC, and the pid and start time in it
tie the answer to that very file. ``runtime`` (the CLI's and the shim's checks) and
``verified`` (every new connection) use these lines; ``hooks/keymem_hook.py`` holds a
copy. Its own module so that ``verified`` needs nothing of ``runtime`` but a type.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from keymem_daemon.runtime import DaemonInfo

PROOF_VERSION: Final = "keymem-health-v1"
"""Names what ``health_proof`` signs, so a proof can never be mistaken for another HMAC."""
NONCE_BYTES: Final = 16
"""A fresh random nonce per check: a recorded proof is useless for the next one."""
MAX_NONCE_CHARS: Final = 128
"""The longest nonce ``/health`` signs (clients send 32 hex digits)."""


def new_nonce() -> str:
    """A fresh nonce for one ``/health`` check."""
    return secrets.token_hex(NONCE_BYTES)


def health_proof(token: str, nonce: str, *, pid: int, started_at: float) -> str:
    """The daemon's answer to a client's ``nonce``: HMAC-SHA256 under its token over the
    nonce, its pid and its start time (as ``daemon.json`` has them).

    Only the process that wrote the token can compute it, so a program that took over the
    port, or a recycled pid, cannot pass for the daemon; the pid and start time tie it to
    this very ``daemon.json``. ``hooks/keymem_hook.py`` holds a copy of these lines.
    """
    message = f"{PROOF_VERSION}\n{nonce}\n{pid}\n{started_at:.6f}".encode()
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()


def proof_matches(info: DaemonInfo, nonce: str, body: object) -> bool:
    """Does a ``/health`` answer to ``nonce`` prove that the daemon ``info`` names sent it?"""
    if not isinstance(body, dict) or body.get("pid") != info.pid:
        return False
    proof = body.get("proof")
    expected = health_proof(info.token, nonce, pid=info.pid, started_at=info.started_at)
    return isinstance(proof, str) and hmac.compare_digest(proof, expected)
