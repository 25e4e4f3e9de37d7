"""``keymemd run``: one daemon process, from taking the lock to releasing it.

The order is what makes a data directory single-writer and a restart safe:

1. take ``<data>/daemon.lock`` -- fail at once if another daemon owns the directory;
   nothing is opened before this;
2. bind and listen on ``127.0.0.1`` (``KEYMEM_PORT``, or a free port);
3. start loading the store and the models in a thread (it overlaps the web stack's
   imports); once loaded, ``daemon.json`` gains the embedder fingerprint and the
   scheduler starts;
4. publish ``daemon.json`` (pid, port, token, version, started_at) -- only now can a
   client find the daemon, and connecting already works (the socket listens) -- and
   serve: ``/health`` answers ``starting`` until the load is done, then ``ready``;
   beside it the daemon starts its warm shim (``python -m keymem_shim._forkserver``, unless
   ``KEYMEM_WARM_SHIM=false``), to which hosts' ``keymem-shim`` processes hand their stdio;
   it lives as long as the daemon (and exits by itself if the daemon is killed);
5. on SIGTERM/SIGINT/SIGHUP, ``/v1/shutdown`` or idle exit: uvicorn stops accepting and
   lets in-flight requests finish; then the scheduler stops, the store drains its queued
   writes and checkpoints, ``daemon.json`` goes (if it still names this pid) and the lock
   is released.

Signals belong to uvicorn's ``Server`` while it serves. It re-raises a captured signal
after serving; the handlers installed first receive that re-raise, so the cleanup after
``serve`` always runs (and a signal during start-up stops the daemon as soon as it can).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Final

from keymem_daemon import __version__, allocators, logs, runtime
from keymem_daemon.config import Settings
from keymem_daemon.errors import Conflict
from keymem_daemon.scheduler import Maintenance
from keymem_daemon.service import Service

if TYPE_CHECKING:
    import uvicorn

    from keymem_daemon.http.guard import Activity

logger = logging.getLogger(__name__)

BACKLOG: Final = 2048
PRIVATE_UMASK: Final = 0o077
"""Memories are private: the store, its WAL, backups and logs are created for the user only."""
GRACEFUL_SHUTDOWN_TIMEOUT: Final = 30
"""Seconds uvicorn waits for in-flight requests after a stop request before cancelling them."""
KEEP_ALIVE_TIMEOUT: Final = 5
WARM_SHIM_STOP_GRACE: Final = 5.0
"""Seconds the warm shim gets to close its socket after SIGTERM before it is killed."""
LOADER_JOIN_TIMEOUT: Final = 10.0
"""At exit, how long to wait for a load still in progress (a model download may run long)."""


def bind(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (``port`` 0: a free one)."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP;
    # with proto 0 every response would wait ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise Conflict(f"cannot listen on 127.0.0.1:{port} (KEYMEM_PORT): {exc.strerror or exc}") from None
    return sock


class Daemon:
    """The pieces of one running daemon and the order they start and stop in."""

    def __init__(self, settings: Settings, *, log_to_stderr: bool = True) -> None:
        self.settings = settings
        self.log_to_stderr = log_to_stderr
        self.exit_code = 0
        self._lock = threading.Lock()  # orders closing against the loader's last steps
        self._closing = False
        self._server: uvicorn.Server | None = None
        self._service: Service | None = None
        self._maintenance: Maintenance | None = None
        self._activity: Activity | None = None
        self._info: runtime.DaemonInfo | None = None
        self._fingerprint: str | None = None
        self._token = secrets.token_urlsafe(32)
        self._stop_requested = False
        self._warm_shim: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        settings = self.settings
        allocators.configure()
        os.umask(PRIVATE_UMASK)
        tightened = runtime.prepare_data_dir(settings.data_dir)  # read-only, full, foreign: one clear line
        log_config = logs.configure(settings, stderr=self.log_to_stderr)
        if tightened:
            logger.warning("%s", tightened)
        _install_stop_handlers(self)
        try:
            lock = runtime.acquire_daemon_lock(settings.data_dir)
        except Conflict as exc:
            logger.error("%s", exc.message)
            raise
        loader: threading.Thread | None = None
        try:
            sock = bind(settings.port)
            port = int(sock.getsockname()[1])
            settings = self.settings = settings.replace(port=port)
            # Loading (models, store) starts now and overlaps the web stack's imports.
            self._service = Service(settings)
            loader = threading.Thread(target=self._load, name="keymem-loader", daemon=True)
            loader.start()
            started_at = time.time()
            self._server = self._build_server(log_config, started_at)
            with self._lock:
                self._info = runtime.DaemonInfo(
                    pid=os.getpid(),
                    port=port,
                    token=self._token,
                    version=__version__,
                    started_at=started_at,
                    data_dir=str(settings.data_dir),
                    embedder=self._fingerprint,
                )
                runtime.write_daemon_info(settings.data_dir, self._info)
            logger.info(
                "keymemd %s listening on http://127.0.0.1:%d (pid %d, data %s)",
                __version__,
                port,
                os.getpid(),
                settings.data_dir,
            )
            self._start_warm_shim()
            if self._stop_requested:  # a signal arrived while starting: start, then stop at once
                self._server.should_exit = True
            self._server.run(sockets=[sock])
        finally:
            released = self._stop(loader)
            if released:
                lock.release()
        logger.info("keymemd stopped (exit code %d)", self.exit_code)
        return self.exit_code

    def _build_server(self, log_config: dict[str, object], started_at: float) -> uvicorn.Server:
        import uvicorn

        from keymem_daemon.connections import GuardedH11Protocol, max_connections, raise_descriptor_limit

        descriptors = raise_descriptor_limit()
        logger.debug("%d file descriptors: at most %d connections", descriptors, max_connections(descriptors))

        from keymem_daemon.http.app import create_app
        from keymem_daemon.http.guard import Activity

        assert self._service is not None
        self._activity = Activity()
        app = create_app(
            self._service,
            self.settings,
            self._token,
            on_shutdown=self.begin_shutdown,
            activity=self._activity,
            started_at=started_at,
        )
        config = uvicorn.Config(
            app,
            log_config=log_config,
            access_log=self.settings.log_level == "debug",
            proxy_headers=False,
            server_header=False,
            lifespan="off",
            ws="none",
            http=GuardedH11Protocol,
            loop="asyncio",
            backlog=BACKLOG,
            timeout_keep_alive=KEEP_ALIVE_TIMEOUT,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        )
        return uvicorn.Server(config)

    def _start_warm_shim(self) -> None:
        if not self.settings.warm_shim or not hasattr(os, "fork"):  # it forks: POSIX only
            return
        # Its stderr is ours (the log file, or the terminal of ``keymemd run``).
        try:
            self._warm_shim = subprocess.Popen(
                [sys.executable, "-m", "keymem_shim._forkserver", str(os.getpid())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={**os.environ, "KEYMEM_DATA_DIR": str(self.settings.data_dir)},
                close_fds=True,
            )
        except OSError as exc:
            logger.warning("no warm shim (hosts' shims will import the MCP SDK themselves): %s", exc)
            return
        logger.info("warm shim started (pid %d); hosts' shims hand their stdio to %s", self._warm_shim.pid,
                    self.settings.warm_shim_socket)

    def _stop_warm_shim(self) -> None:
        process = self._warm_shim
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(WARM_SHIM_STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _idle_for(self) -> float:
        return self._activity.idle_for() if self._activity is not None else 0.0

    def _load(self) -> None:
        assert self._service is not None
        service = self._service
        service.load()
        with self._lock:
            if self._closing:
                return
            if service.state != "ready" or service.graph is None:
                logger.error("keymemd cannot serve %s: %s", self.settings.data_dir, service.error)
                self.exit_code = 1
            else:
                self._fingerprint = service.graph.embedder.fingerprint
                if self._info is not None:
                    self._info = dataclasses.replace(self._info, embedder=self._fingerprint)
                    runtime.write_daemon_info(self.settings.data_dir, self._info)
                self._maintenance = Maintenance(
                    service,
                    self.settings,
                    idle_for=self._idle_for,
                    request_exit=self.begin_shutdown,
                )
                self._maintenance.start()
                return
        self.begin_shutdown()

    def begin_shutdown(self) -> None:
        """Stop: no new ``daemon.json`` writes, the file gone now, uvicorn told to finish."""
        with self._lock:
            self._closing = True
        runtime.remove_daemon_info(self.settings.data_dir)
        self._end_live_feeds()
        if self._server is not None:
            self._server.should_exit = True

    def request_exit(self) -> None:
        """Ask uvicorn to finish (signal handlers; ``begin_shutdown`` is the full path)."""
        self._stop_requested = True
        self._end_live_feeds()
        if self._server is not None:
            self._server.should_exit = True

    def _end_live_feeds(self) -> None:
        """The inspector's live feeds end now: uvicorn waits for open responses before exiting."""
        if self._service is not None and self._service.activity is not None:
            self._service.activity.end_watches()

    def _stop(self, loader: threading.Thread | None) -> bool:
        """Everything after serving; True when the lock may be released now."""
        with self._lock:
            self._closing = True
        self._stop_warm_shim()
        if self._maintenance is not None:
            self._maintenance.shutdown()
        clean = True
        if loader is not None:
            loader.join(LOADER_JOIN_TIMEOUT)
            if loader.is_alive():
                # Still loading (a model download?): leave the store alone; the OS drops the
                # lock when this process exits a moment from now.
                logger.warning(
                    "still loading after %.0f s; exiting without closing the store",
                    LOADER_JOIN_TIMEOUT,
                )
                clean = False
        if clean and self._service is not None:
            try:
                self._service.close()
            except Exception:
                logger.exception("closing the store failed")
                self.exit_code = self.exit_code or 1
        runtime.remove_daemon_info(self.settings.data_dir)
        return clean


def _install_stop_handlers(daemon: Daemon) -> None:
    """Python-level handlers for the stop signals, for the moments uvicorn's are not in place.

    Before serving they make a stop request that the start-up honours; while serving,
    uvicorn's own handlers take over; afterwards uvicorn re-raises the signal it caught
    into these, which only repeat the request -- the default action would kill the process
    before the store is closed. SIGHUP (terminal closed) is not uvicorn's: it stops the
    daemon too.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        logger.info("%s received; stopping", signal.Signals(signum).name)
        daemon.request_exit()

    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGINT", "SIGHUP"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), stop)


def run(settings: Settings, *, log_to_stderr: bool = True) -> int:
    """Run a daemon for ``settings.data_dir`` in this process until it is stopped."""
    return Daemon(settings, log_to_stderr=log_to_stderr).run()
