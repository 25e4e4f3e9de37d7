"""One router per group of routes, each in its own module: ``mcp`` (tools, instructions,
prompts), ``push`` (the prompt hook's inject) and ``ops`` (health, stats, export, import,
shutdown). ``app.py`` includes them; ``ROUTERS`` is the one route table."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter

from keymem_daemon.http.routes import mcp, ops, push

ROUTERS: Final[tuple[APIRouter, ...]] = (ops.router, mcp.router, push.router)
