"""The daemon's housekeeping, on an apscheduler 3 ``BackgroundScheduler``.

===========  ==============================================  ==============================
job          what                                            when
===========  ==============================================  ==============================
cleanup      TTL expiry, learned-alias pruning, activity     at start, every
             entries older than ``KEYMEM_INJECT_LOG``'s      ``KEYMEM_CLEANUP_INTERVAL``
             days (``Service.cleanup``)
checkpoint   fold the WAL into the database file             every ``CHECKPOINT_INTERVAL``
backup       online SQLite backup under ``<data>/backups``,  ``KEYMEM_BACKUP_INTERVAL`` after
             newest ``KEYMEM_BACKUP_KEEP`` kept              the newest backup (0: never)
idle         ask the daemon to exit                          ``KEYMEM_IDLE_EXIT`` without a
                                                             request (0: never)
watch        is ``keymem.db`` still the file the daemon      every ``STORE_WATCH_INTERVAL``
             opened? If not: log, save a copy, refuse writes
             (``Service.watch_store``)
===========  ==============================================  ==============================

Every job runs at most once at a time (``max_instances=1``), missed runs collapse into
one (``coalesce``), and a failing job is logged and retried at its next run -- it never
takes the daemon down. The scheduler starts once the store is loaded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Final

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from keymem_daemon.config import Settings
from keymem_daemon.service import Service

logger = logging.getLogger(__name__)

CHECKPOINT_INTERVAL: Final = 600.0
"""Seconds between WAL checkpoints (SQLite also checkpoints on its own at 1000 pages)."""
IDLE_CHECK_MIN: Final = 0.25
IDLE_CHECK_MAX: Final = 30.0
"""The idle check runs every quarter of ``KEYMEM_IDLE_EXIT``, within these bounds (seconds)."""
JOB_THREADS: Final = 2
STORE_WATCH_INTERVAL: Final = 5.0
"""Seconds between checks that the store file was not deleted or replaced (three stat calls;
writes check it themselves, this is for a daemon that only reads meanwhile)."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Maintenance:
    """The scheduled jobs of one daemon: ``start()`` once loaded, ``shutdown()`` at exit."""

    def __init__(
        self,
        service: Service,
        settings: Settings,
        *,
        idle_for: Callable[[], float] | None = None,
        request_exit: Callable[[], None] | None = None,
    ) -> None:
        self.service = service
        self.settings = settings
        self._idle_for = idle_for
        self._request_exit = request_exit
        self._scheduler = BackgroundScheduler(
            timezone=timezone.utc,
            executors={"default": ThreadPoolExecutor(JOB_THREADS)},
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
        )

    @property
    def job_ids(self) -> list[str]:
        return sorted(job.id for job in self._scheduler.get_jobs())

    def start(self) -> None:
        s = self.settings
        now = _now()
        if s.cleanup_interval > 0:
            self._add("cleanup", self.cleanup, s.cleanup_interval, first=now)
        else:
            self._scheduler.add_job(self._guarded("cleanup", self.cleanup), id="cleanup", next_run_time=now)
        self._add(
            "checkpoint",
            self.checkpoint,
            CHECKPOINT_INTERVAL,
            first=now + timedelta(seconds=CHECKPOINT_INTERVAL),
        )
        if s.backup_interval > 0:
            self._add("backup", self.backup, s.backup_interval, first=self._first_backup(now))
        self._add("watch", self.watch, STORE_WATCH_INTERVAL,
                  first=now + timedelta(seconds=STORE_WATCH_INTERVAL))
        if s.idle_exit > 0 and self._idle_for is not None and self._request_exit is not None:
            every = min(IDLE_CHECK_MAX, max(IDLE_CHECK_MIN, s.idle_exit / 4))
            self._add("idle", self.check_idle, every, first=now + timedelta(seconds=every))
        self._scheduler.start()
        logger.info("scheduler started: %s", ", ".join(self.job_ids))

    def shutdown(self) -> None:
        """Stop scheduling and wait for a running job to finish."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)

    def _add(self, name: str, fn: Callable[[], object], every: float, *, first: datetime) -> None:
        self._scheduler.add_job(
            self._guarded(name, fn),
            IntervalTrigger(seconds=every, timezone=timezone.utc),
            id=name,
            name=name,
            next_run_time=first,
        )

    @staticmethod
    def _guarded(name: str, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            started = time.perf_counter()
            try:
                fn()
            except Exception:
                logger.exception("scheduled %s failed; it runs again at its next interval", name)
            else:
                logger.debug("scheduled %s took %.3f s", name, time.perf_counter() - started)

        return run

    def _first_backup(self, now: datetime) -> datetime:
        """A restarted daemon keeps the rhythm: the next backup is due one interval after the
        newest one on disk (at once if there is none), not one interval after every start."""
        newest = max((p.stat().st_mtime for p in self.settings.backup_dir.glob("keymem-2*.db")), default=None)
        if newest is None:
            return now
        due = datetime.fromtimestamp(newest, timezone.utc) + timedelta(seconds=self.settings.backup_interval)
        return max(now, due)

    # -- the jobs --------------------------------------------------------------------------

    def cleanup(self) -> None:
        result = self.service.cleanup()
        changed = any(isinstance(v, int) and v for v in result.values())
        logger.log(logging.INFO if changed else logging.DEBUG, "cleanup: %s", result)

    def checkpoint(self) -> None:
        self.service.checkpoint()

    def backup(self) -> None:
        self.service.backup()

    def watch(self) -> None:
        self.service.watch_store()

    def check_idle(self) -> None:
        assert self._idle_for is not None and self._request_exit is not None
        idle = self._idle_for()
        if idle >= self.settings.idle_exit:
            logger.info(
                "no request for %.0f s (KEYMEM_IDLE_EXIT=%g); exiting",
                idle,
                self.settings.idle_exit,
            )
            with contextlib.suppress(JobLookupError):
                self._scheduler.remove_job("idle")
            self._request_exit()
