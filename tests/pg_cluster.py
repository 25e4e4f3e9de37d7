"""A throwaway PostgreSQL cluster for the team-memory tests (issue 22).

``pg_cluster`` (one per test session, so one per pytest-xdist worker) runs PostgreSQL from
the installed binaries (``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``)
on a free port on 127.0.0.1, with its unix socket in the cluster's temp dir (never the
system's /var/run/postgresql), with the role ``keymem_owner`` and the database ``keymem`` it
owns, and yields a ``PgCluster`` whose ``url`` points there. At the end it stops the server
and removes the directory. A test that stops its server gets a cluster of its own
(``own_pg_cluster``). Every cluster of a run is a copy of one template (``pg_template``:
``initdb``, a first start that adds the owner and its database, a clean stop), made once
for all the run's workers: copying its files costs a fraction of an ``initdb``.

PostgreSQL refuses to run as root, and CI runs as root: then the cluster's files belong to an
unprivileged OS user (Debian's ``postgres``, else ``nobody``) and ``initdb``, ``pg_ctl`` and the
server run as that user (``subprocess``'s ``user=``/``group=``, no sudo needed).

Every connection needs a password (scram-sha-256, local and TCP alike), so a test of access
control never passes because of ``trust``. Durability settings are relaxed (``fsync=off``):
the cluster lives as long as the session, and a clean ``pg_ctl stop`` writes everything out.

Without PostgreSQL binaries the tests that use it skip, saying why -- except under
``CI=true``, where CI installs PostgreSQL (``scripts/run-tests.sh``), so it is a failure.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import itertools
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import pytest
from daemon_helpers import DaemonFactory, DaemonProcess, built_once

SUPERUSER: Final = "keymem_super"
OWNER: Final = "keymem_owner"
DATABASE: Final = "keymem"
START_TIMEOUT: Final = 120
"""Seconds ``pg_ctl start`` may take: initdb's first start on a loaded 2-core machine is ~2 s."""
STOP_TIMEOUT: Final = 60
PORT_ATTEMPTS: Final = 5
"""A free port can be taken by another process between the probe and the server's bind."""
# Whom the cluster runs as when the tests run as root, in order of preference.
_UNPRIVILEGED_USERS: Final = ("postgres", "nobody")
PASSWORDS_FILE: Final = "passwords.json"
"""Beside a template's ``data``: the passwords of the roles its copies hold."""

_counter = itertools.count(1)


def find_bindir() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl``/``postgres``, or None when not installed."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True)
            candidates.append(Path(out.stdout.strip()))

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    for path in candidates:
        if all((path / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class PgCluster:
    """A running throwaway cluster: how to reach it and how to add roles and databases."""

    bindir: Path
    root: Path
    port: int
    passwords: dict[str, str]
    run_as: pwd.struct_passwd | None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def url_for(self, role: str, database: str = DATABASE, *, password: str | None = None) -> str:
        """A ``postgresql://`` URL for ``role`` on ``database`` (its own password by default)."""
        secret = self.passwords[role] if password is None else password
        return f"postgresql://{quote(role, safe='')}:{quote(secret, safe='')}@{self.host}:{self.port}/{database}"

    @property
    def url(self) -> str:
        """The owner role on the ``keymem`` database."""
        return self.url_for(OWNER)

    @property
    def superuser_url(self) -> str:
        return self.url_for(SUPERUSER, "postgres")

    def admin(self, *statements: Any, params: tuple[Any, ...] = ()) -> None:
        """Run statements as the superuser, outside a transaction (CREATE DATABASE needs that).
        psycopg is imported here, not at the top: a venv without it still collects the suite."""
        import psycopg

        with psycopg.connect(self.superuser_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement, params or None)

    def create_role(self, prefix: str = "person") -> str:
        """A new login role with a password of its own and no privileges; returns its name."""
        from psycopg import sql

        name = f"{prefix}_{next(_counter)}_{secrets.token_hex(3)}"
        self.passwords[name] = secrets.token_urlsafe(12)
        self.admin(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(self.passwords[name])))
        return name

    def create_database(self, owner: str = OWNER, *, template: str | None = None) -> str:
        """A new database owned by ``owner`` -- empty, or a copy of ``template`` (a file-level
        copy: far faster than migrating again); returns its name."""
        from psycopg import sql

        name = f"keymem_{next(_counter)}_{secrets.token_hex(3)}"
        copy = sql.SQL(" TEMPLATE {}").format(sql.Identifier(template)) if template else sql.SQL("")
        # Nobody but the owner connects unless a test grants it (PUBLIC may connect by default).
        self.admin(sql.SQL("CREATE DATABASE {} OWNER {}{}").format(sql.Identifier(name), sql.Identifier(owner), copy),
                   sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
        return name

    def start_server(self) -> None:
        """``pg_ctl start`` on the cluster's port, waiting until it accepts connections."""
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c full_page_writes=off -c max_connections=200")
        _run(self.run_as, [str(self.bindir / "pg_ctl"), "start", "-D", str(self.data_dir), "-w",
                           "-t", str(START_TIMEOUT), "-l", str(self.log_file), "-o", options],
             timeout=START_TIMEOUT + 10)

    def stop_server(self) -> None:
        """``pg_ctl stop -m fast``: open sessions are cut, as when a server goes down."""
        _run(self.run_as, [str(self.bindir / "pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast",
                           "-w", "-t", str(STOP_TIMEOUT)], timeout=STOP_TIMEOUT + 10)

    def drop_database(self, name: str) -> None:
        from psycopg import sql

        self.admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def unprivileged_user() -> pwd.struct_passwd | None:
    """Whom the cluster runs as: None (the current user) unless the tests run as root."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    pytest.fail("running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as")


def _run(cluster_user: pwd.struct_passwd | None, args: list[str], *, timeout: float) -> None:
    """Run a PostgreSQL tool, as the cluster's user when that is not us; fail with its output."""
    extra: dict[str, Any] = {}
    if cluster_user is not None:
        extra = {"user": cluster_user.pw_uid, "group": cluster_user.pw_gid, "extra_groups": []}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    if cluster_user is not None:
        env["HOME"] = cluster_user.pw_dir
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False,
                          cwd="/", **extra)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")


def start_cluster(bindir: Path, run_as: pwd.struct_passwd | None) -> PgCluster:
    """``initdb`` a new cluster, start it and add the owner role and its database."""
    # Not under pytest's tmp_path: its base directory is private to us, and the cluster's user
    # must be able to reach the directory it owns.
    root = Path(tempfile.mkdtemp(prefix="keymem-pg-"))
    passwords = {SUPERUSER: secrets.token_urlsafe(16), OWNER: secrets.token_urlsafe(16)}
    (root / "socket").mkdir()
    pwfile = root / "superuser.pw"
    pwfile.write_text(passwords[SUPERUSER] + "\n")
    if run_as is not None:
        for path in (root, root / "socket", pwfile):
            os.chown(path, run_as.pw_uid, run_as.pw_gid)
    _run(run_as, [str(bindir / "initdb"), "-D", str(root / "data"), "-U", SUPERUSER, f"--pwfile={pwfile}",
                  "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
                  "--no-sync"], timeout=START_TIMEOUT)
    pwfile.unlink()
    cluster = _serve(bindir, root, passwords, run_as)
    from psycopg import sql

    cluster.admin(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
        sql.Identifier(OWNER), sql.Literal(passwords[OWNER])))
    cluster.admin(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(DATABASE), sql.Identifier(OWNER)),
                  sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(DATABASE)))
    return cluster


def _serve(bindir: Path, root: Path, passwords: dict[str, str], run_as: pwd.struct_passwd | None) -> PgCluster:
    """Start the cluster whose data directory is ``root/data`` on a free port; removes
    ``root`` when it cannot."""
    last: RuntimeError | None = None
    for _ in range(PORT_ATTEMPTS):
        cluster = PgCluster(bindir=bindir, root=root, port=_free_port(), passwords=passwords, run_as=run_as)
        try:
            cluster.start_server()
        except RuntimeError as exc:
            log = cluster.log_file.read_text(errors="replace") if cluster.log_file.exists() else ""
            last = RuntimeError(f"{exc}\n{log}")
            if "already in use" not in log:
                break
            continue
        return cluster
    shutil.rmtree(root, ignore_errors=True)
    raise last or RuntimeError("could not start PostgreSQL")


def make_template(bindir: Path, run_as: pwd.struct_passwd | None, where: Path) -> None:
    """A stopped cluster at ``where`` (its ``data`` and the passwords of its roles) for
    ``copy_cluster``: ``initdb`` and the first start cost seconds on a busy machine, a copy
    of the files a fraction of that."""
    cluster = start_cluster(bindir, run_as)
    try:
        cluster.stop_server()
        passwords = cluster.root / PASSWORDS_FILE
        passwords.write_text(json.dumps(cluster.passwords))
        passwords.chmod(0o600)
        shutil.move(cluster.root, where)
    finally:
        shutil.rmtree(cluster.root, ignore_errors=True)


def copy_cluster(bindir: Path, template: Path, run_as: pwd.struct_passwd | None, *, conf: str = "") -> PgCluster:
    """A cluster of its own, started from a copy of ``template``'s files (``make_template``):
    the same roles, passwords and empty ``keymem`` database, on a port of its own, with the
    lines ``conf`` added to its ``postgresql.conf`` before it starts."""
    root = Path(tempfile.mkdtemp(prefix="keymem-pg-"))  # reachable by the cluster's user, see start_cluster
    shutil.copytree(template / "data", root / "data", symlinks=True)
    if conf:
        with (root / "data" / "postgresql.conf").open("a") as settings:
            settings.write(f"\n{conf}\n")
    (root / "socket").mkdir()
    if run_as is not None:
        for path in (root, root / "socket", root / "data", *(root / "data").rglob("*")):
            os.chown(path, run_as.pw_uid, run_as.pw_gid, follow_symlinks=False)
    passwords: dict[str, str] = json.loads((template / PASSWORDS_FILE).read_text())
    return _serve(bindir, root, passwords, run_as)


def stop_cluster(cluster: PgCluster) -> None:
    try:
        cluster.stop_server()
    finally:
        shutil.rmtree(cluster.root, ignore_errors=True)


def _require_postgres() -> Path:
    """The PostgreSQL binaries' directory; skip without them (or psycopg), fail under CI=true."""
    skip_or_fail = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
    bindir = find_bindir()
    if bindir is None:
        skip_or_fail("PostgreSQL is not installed (no pg_config --bindir, no /usr/lib/postgresql/*/bin with "
                     "initdb, pg_ctl and postgres); scripts/run-tests.sh installs it with apt-get as root")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        skip_or_fail("psycopg is not installed: pip install -e '.[test]'")
    assert bindir is not None
    return bindir


@pytest.fixture(scope="session")
def pg_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stopped cluster every cluster of this run is copied from: made once, by the first
    pytest-xdist worker that needs it (skips without PostgreSQL, fails in CI)."""
    bindir = _require_postgres()
    with built_once(tmp_path_factory, "pg-template") as template:
        if not (template / PASSWORDS_FILE).is_file():
            make_template(bindir, unprivileged_user(), template)
    return template


@pytest.fixture(scope="session")
def pg_cluster(pg_template: Path) -> Iterator[PgCluster]:
    """A running PostgreSQL cluster for this session (one per pytest-xdist worker)."""
    cluster = copy_cluster(_require_postgres(), pg_template, unprivileged_user())
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@contextlib.contextmanager
def own_cluster(template: Path, conf: str = "") -> Iterator[PgCluster]:
    """A running copy of ``template`` (``copy_cluster``), stopped and removed at the end."""
    cluster = copy_cluster(_require_postgres(), template, unprivileged_user(), conf=conf)
    try:
        yield cluster
    finally:
        with contextlib.suppress(RuntimeError):  # the test may have left it stopped
            cluster.stop_server()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def own_pg_cluster(pg_template: Path) -> Iterator[PgCluster]:
    """A cluster of one test's own, for tests that stop and start its server."""
    with own_cluster(pg_template) as cluster:
        yield cluster


class DatabaseSupply:
    """Fresh copies of one template database, made ahead while the tests before run: one
    thread keeps ``AHEAD`` copies ready and another drops the used ones (a drop forces a
    checkpoint), so a test waits for neither (each takes about a third of a second on a busy
    2-core machine, longer than many engine tests)."""

    AHEAD: Final = 2

    def __init__(self, cluster: PgCluster, template: str) -> None:
        self._cluster, self._template = cluster, template
        self._creator = ThreadPoolExecutor(1, thread_name_prefix="pg-create")
        self._dropper = ThreadPoolExecutor(1, thread_name_prefix="pg-drop")
        self._ready = collections.deque(self._make() for _ in range(self.AHEAD))
        self._drops: list[Future[None]] = []

    def _make(self) -> Future[str]:
        return self._creator.submit(self._cluster.create_database, template=self._template)

    def take(self) -> str:
        """A database nobody used, owned by ``keymem_owner``; its name."""
        name = self._ready.popleft().result()
        self._ready.append(self._make())
        return name

    def give_back(self, name: str) -> None:
        """Drop ``name`` in the background (its connections are cut)."""
        self._drops.append(self._dropper.submit(self._cluster.drop_database, name))

    def close(self) -> None:
        """Drop the spare copies, wait for both threads, and raise what a drop raised."""
        for spare in self._ready:
            self.give_back(spare.result())
        self._creator.shutdown(wait=True)
        self._dropper.shutdown(wait=True)
        for done in self._drops:
            done.result()


@pytest.fixture(scope="session")
def pg_fresh_databases(pg_cluster: PgCluster) -> Iterator[DatabaseSupply]:
    """Fresh databases holding keymem's current schema and nothing else: copies of one
    database migrated once (CREATE DATABASE ... TEMPLATE: a file copy, far faster than
    migrating again), for the engine suite's PostgreSQL runs."""
    from keymem_daemon.store.postgres.repository import PostgresRepository

    template = pg_cluster.create_database()
    PostgresRepository.open(pg_cluster.url_for(OWNER, template)).close()
    supply = DatabaseSupply(pg_cluster, template)
    try:
        yield supply
    finally:
        supply.close()


@pytest.fixture
def pg_database(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh, empty database owned by ``keymem_owner`` for one test; its owner URL. Dropped after."""
    name = pg_cluster.create_database()
    try:
        yield pg_cluster.url_for(OWNER, name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
def factories() -> Iterator[list[DaemonFactory]]:
    """The daemons a test starts with ``start_on``, each torn down at its end."""
    made: list[DaemonFactory] = []
    yield made
    for factory in made:
        factory.teardown()


def start_on(factories: list[DaemonFactory], tmp_path: Path, name: str, url: str, **env: str) -> DaemonProcess:
    """A daemon with its own data dir ``tmp_path/name``, on the store at ``url``."""
    (tmp_path / name).mkdir(exist_ok=True)
    factory = DaemonFactory(tmp_path / name)
    factories.append(factory)
    return factory.start(KEYMEM_STORE_URL=url, **env)
