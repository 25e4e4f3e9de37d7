"""An outside client: the official MCP Inspector CLI (npm) against the real shim and daemon.

``@modelcontextprotocol/inspector`` is pinned: 2.12.0 declares ``node >= 22.19`` but its CLI
mode runs on node 20 (npm only warns), which is what CI has. Each run spawns
``python -m keymem_shim`` itself over stdio; the shim's environment goes in with ``-e``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Final

import pytest
from daemon_helpers import DaemonProcess, scaled

INSPECTOR: Final = "@modelcontextprotocol/inspector@2.12.0"
RUN_TIMEOUT: Final = 240.0
"""One Inspector run; the first one may download the package."""
TOOL_FAILED_EXIT: Final = 5
"""The Inspector's exit code for a tool result with ``isError: true``."""

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is not installed"),
]


def inspector(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    shim_env = [
        f"{name}={value}"
        for name, value in daemon.env.items()
        if name.startswith("KEYMEM_") or name in ("HOME", "HF_HUB_OFFLINE")
    ]
    command = ["npx", "-y", INSPECTOR, "--cli"]
    for pair in shim_env:
        command += ["-e", pair]
    command += [sys.executable, "-m", "keymem_shim", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYMEM_", "CLAUDE_", "CODEX_"))}
    env["npm_config_update_notifier"] = "false"
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=scaled(RUN_TIMEOUT), check=False)


def output(result: subprocess.CompletedProcess[str], daemon: DaemonProcess) -> Any:
    assert result.returncode == 0, f"{result.returncode}\n{result.stdout}\n{result.stderr}\n{daemon.log()}"
    return json.loads(result.stdout)


def text_of(result: Any) -> Any:
    [block] = result["content"]
    assert block["type"] == "text"
    return json.loads(block["text"])


def test_the_mcp_inspector_cli_lists_and_calls_tools_and_prompts(daemon: DaemonProcess) -> None:
    listed = output(inspector(daemon, "--method", "tools/list", "--strict"), daemon)
    assert len(listed["tools"]) == 10
    assert {t["name"] for t in listed["tools"]} >= {"recall", "remember", "read_memory"}
    assert all(t["inputSchema"]["type"] == "object" for t in listed["tools"])

    saved = output(
        inspector(
            daemon,
            "--method",
            "tools/call",
            "--tool-name",
            "remember",
            "--tool-arg",
            "content=The user listens to jazz while coding.",
            'keys=["music", "jazz", "음악"]',
        ),
        daemon,
    )
    assert saved["isError"] is False
    memory_id = text_of(saved)["saved"]

    recalled = output(
        inspector(daemon, "--method", "tools/call", "--tool-name", "recall", "--tool-arg", "query=music"),
        daemon,
    )
    assert recalled["isError"] is False
    assert text_of(recalled)["memories"][0]["id"] == memory_id

    bad = inspector(daemon, "--method", "tools/call", "--tool-name", "remember", "--tool-arg", "keys=5")
    assert bad.returncode == TOOL_FAILED_EXIT, bad.stderr
    assert text_of(json.loads(bad.stdout)) == {"error": "content is required", "field": "content"}

    prompts = output(inspector(daemon, "--method", "prompts/list"), daemon)
    assert [p["name"] for p in prompts["prompts"]] == ["memory_system_prompt"]
    prompt = output(
        inspector(daemon, "--method", "prompts/get", "--prompt-name", "memory_system_prompt"),
        daemon,
    )
    assert "MANDATORY: First turn behavior" in prompt["messages"][0]["content"]["text"]
