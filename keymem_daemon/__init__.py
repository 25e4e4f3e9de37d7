"""keymem daemon: associative long-term memory for LLM coding agents."""

from __future__ import annotations

__version__ = "0.1.0"
