"""A small client the benchmarks share: the daemon over HTTP, or the service in-process.

``open_client(data_dir)`` starts a real ``keymemd`` on ``data_dir`` and talks HTTP to it (the
way hosts do); ``in_process=True`` builds the same ``Service`` inside the benchmark, which
skips HTTP and process start-up when iterating on retrieval.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol


class Client(Protocol):
    def tool(self, name: str, arguments: dict[str, Any]) -> Any: ...

    def inject(self, body: dict[str, Any]) -> Any: ...


class ToolFailed(RuntimeError):
    pass


class InProcess:
    def __init__(self, data_dir: Path) -> None:
        from keymem_daemon.config import Settings
        from keymem_daemon.engine.writes.remember import Host
        from keymem_daemon.service import Service

        env = {**os.environ, "KEYMEM_DATA_DIR": str(data_dir), "KEYMEM_TOOLS": "full", "KEYMEM_RERANK": "false"}
        self.service = Service(Settings.from_env(env))
        self.service.load()
        if self.service.state != "ready":
            raise RuntimeError(f"service failed to load: {self.service.error}")
        self.host = Host()

    def tool(self, name: str, arguments: dict[str, Any]) -> Any:
        outcome = self.service.call_tool(name, arguments, self.host)
        if outcome.is_error or (isinstance(outcome.result, dict) and "error" in outcome.result):
            raise ToolFailed(f"{name}: {outcome.result}")
        return outcome.result

    def inject(self, body: dict[str, Any]) -> Any:
        from keymem_daemon.engine.records import render
        from keymem_daemon.service import InjectRequest

        return render(self.service.inject(InjectRequest(**body)))

    def close(self) -> None:
        self.service.close()


class Http:
    def __init__(self, data_dir: Path) -> None:
        import httpx

        self.env = {**os.environ, "KEYMEM_DATA_DIR": str(data_dir), "KEYMEM_TOOLS": "full",
                    "KEYMEM_RERANK": "false"}
        subprocess.run([sys.executable, "-m", "keymem_daemon", "start"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)
        from keymem_daemon.runtime import read_daemon_info

        info = read_daemon_info(data_dir)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{info.port}",
                                   headers={"Authorization": f"Bearer {info.token}"}, timeout=60)

    def tool(self, name: str, arguments: dict[str, Any]) -> Any:
        response = self.client.post(f"/v1/tools/{name}", json={"arguments": arguments})
        response.raise_for_status()
        body = response.json()
        result = body["result"]
        if body["is_error"] or (isinstance(result, dict) and "error" in result):
            raise ToolFailed(f"{name}: {result}")
        return result

    def inject(self, body: dict[str, Any]) -> Any:
        response = self.client.post("/v1/inject", json=body)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self.client.close()
        subprocess.run([sys.executable, "-m", "keymem_daemon", "stop"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def open_client(data_dir: Path, *, in_process: bool = False) -> Iterator[Client]:
    client: InProcess | Http = InProcess(data_dir) if in_process else Http(data_dir)
    try:
        yield client
    finally:
        client.close()
