"""The housekeeping jobs: when they run, that a failure is logged and retried, idle exit."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import wait_for

from keymem_daemon.config import Settings
from keymem_daemon.scheduler import Maintenance

pytestmark = pytest.mark.timeout(60)


class FakeService:
    """Counts the calls the scheduler makes; ``fail`` makes a job raise."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"cleanup": 0, "checkpoint": 0, "backup": 0, "watch": 0}
        self.fail: set[str] = set()
        self.lock = threading.Lock()

    def _hit(self, name: str) -> None:
        with self.lock:
            self.calls[name] += 1
        if name in self.fail:
            raise RuntimeError(f"{name} broke")

    def cleanup(self) -> dict[str, Any]:
        self._hit("cleanup")
        return {"deleted": 0}

    def checkpoint(self) -> None:
        self._hit("checkpoint")

    def backup(self) -> str | None:
        self._hit("backup")
        return None

    def watch_store(self) -> None:
        self._hit("watch")


def _settings(tmp_path: Path, **changes: Any) -> Settings:
    return Settings.from_env({"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path / "data")}).replace(**changes)


def _maintenance(service: FakeService, settings: Settings, **kwargs: Any) -> Maintenance:
    return Maintenance(service, settings, **kwargs)  # type: ignore[arg-type]


def test_jobs_follow_the_settings(tmp_path: Path) -> None:
    idle = {"idle_for": lambda: 0.0, "request_exit": lambda: None}
    m = _maintenance(FakeService(), _settings(tmp_path), **idle)
    m.start()
    try:
        assert m.job_ids == ["backup", "checkpoint", "cleanup", "watch"]
    finally:
        m.shutdown()
    m = _maintenance(FakeService(), _settings(tmp_path, backup_interval=0, idle_exit=60), **idle)
    m.start()
    try:
        assert m.job_ids == ["checkpoint", "cleanup", "idle", "watch"]
    finally:
        m.shutdown()


def test_cleanup_runs_at_start_and_every_interval(tmp_path: Path) -> None:
    service = FakeService()
    m = _maintenance(service, _settings(tmp_path, cleanup_interval=0.2, backup_interval=0))
    m.start()
    try:
        wait_for(lambda: service.calls["cleanup"] >= 1, 5, message="the start-up cleanup")
        wait_for(lambda: service.calls["cleanup"] >= 3, 10, message="two more cleanups")
    finally:
        m.shutdown()
    count = service.calls["cleanup"]
    assert not m._scheduler.running
    assert service.calls["cleanup"] == count, "a job ran after shutdown"


def test_a_failing_job_is_logged_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service = FakeService()
    service.fail.add("cleanup")
    m = _maintenance(service, _settings(tmp_path, cleanup_interval=0.2, backup_interval=0))
    with caplog.at_level(logging.ERROR, logger="keymem_daemon.scheduler"):
        m.start()
        try:
            wait_for(lambda: service.calls["cleanup"] >= 3, 10, message="retries of the failing cleanup")
        finally:
            m.shutdown()
    failures = [r for r in caplog.records if "scheduled cleanup failed" in r.getMessage()]
    assert failures and failures[0].exc_info is not None


def test_the_first_backup_keeps_the_rhythm_across_restarts(tmp_path: Path) -> None:
    settings = _settings(tmp_path, backup_interval=3600)
    m = _maintenance(FakeService(), settings)
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    assert m._first_backup(now) == now  # no backup yet: at once
    settings.backup_dir.mkdir(parents=True)
    recent = settings.backup_dir / "keymem-20260101T115000Z.db"
    recent.write_bytes(b"")
    stamp = (now - timedelta(minutes=10)).timestamp()
    os.utime(recent, (stamp, stamp))
    assert m._first_backup(now) == now + timedelta(minutes=50)
    old = now - timedelta(hours=5)
    os.utime(recent, (old.timestamp(), old.timestamp()))
    assert m._first_backup(now) == now


def test_idle_exit_fires_once_after_the_idle_time(tmp_path: Path) -> None:
    idle = [0.0]
    exits: list[float] = []
    m = _maintenance(
        FakeService(),
        _settings(tmp_path, idle_exit=1.0, backup_interval=0),
        idle_for=lambda: idle[0],
        request_exit=lambda: exits.append(time.monotonic()),
    )
    m.start()
    try:
        wait_for(lambda: "idle" in m.job_ids and len(exits) == 0, 5)
        idle[0] = 0.9  # not yet
        m.check_idle()
        assert exits == []
        idle[0] = 1.5
        wait_for(lambda: exits, 5, message="the idle exit")
        assert "idle" not in m.job_ids  # asked once, not every quarter second from now on
    finally:
        m.shutdown()
    assert len(exits) == 1
