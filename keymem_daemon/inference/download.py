"""Fetching model files from a Hugging Face hub into a local directory.

A ``ModelSpec`` names the files a model needs, each as (repo, file in the repo, local name),
so files from several repositories land flat in one directory (bge-m3's ONNX graph comes from
``onnx-community/bge-m3-ONNX``, its tokenizer from ``BAAI/bge-m3``). ``ensure_model`` makes
the directory complete:

- A file is present when it exists, is not empty and, if keymem downloaded it, still has the
  size recorded in ``.keymem-files.json``. A complete directory costs no request at all,
  not even a HEAD; a partial one fetches only what is missing or truncated.
- ``verify=True`` also asks the hub for the size (and, for LFS files, the sha256) of files
  that look present; callers use it once a model fails to load, to heal a corrupt file.
- One ``filelock`` per directory, so two processes never write the same files; each file
  streams to a unique ``.part`` name and is renamed into place only once its size (and
  sha256, for LFS files) matched the hub's metadata.
- Every request waits at most ``timeout`` seconds for the hub (connect, and each read), with
  no retries: offline, a fetch fails in about that long instead of backing off for minutes.
- Progress goes to a thread-safe ``DownloadProgress`` (shown by ``keymemd status`` and
  ``/v1/stats``) and to the log at INFO every few seconds.

Failures are raised as ``ModelError``, never logged here: the caller logs them once, together
with what it falls back to.

``huggingface_hub`` supplies the URL scheme (``HF_ENDPOINT`` or ``endpoint``), the request
headers (``HF_TOKEN``), the metadata HEAD and its HTTP session (``HF_HUB_OFFLINE`` is
honoured). Its ``hf_hub_download`` is not used: it retries a failed connection with backoff
(minutes when offline), reads its download timeout from a process-wide constant and mirrors
the repository's paths (``onnx/model_quantized.onnx``) under ``local_dir``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from keymem_daemon.errors import ModelError

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata

logger = logging.getLogger(__name__)

Pooling = Literal["cls", "mean"]
DownloadState = Literal["idle", "downloading", "done", "failed"]

MANIFEST_NAME: Final = ".keymem-files.json"
LOCK_NAME: Final = ".keymem-download.lock"
PART_SUFFIX: Final = ".part"
CHUNK_BYTES: Final = 1 << 20
# How often a running download writes a progress line to the log.
PROGRESS_LOG_INTERVAL: Final = 5.0
# How long to wait for another process that holds the directory's lock (it is probably
# downloading the same 570 MB); past this the caller falls back instead of hanging.
LOCK_TIMEOUT: Final = 900.0
# Free space kept beyond the download itself, so a model never fills the disk to the byte.
DISK_MARGIN_BYTES: Final = 64 << 20
_SHA256_HEX_LEN: Final = 64
_MB: Final = 1_000_000.0


@dataclass(frozen=True, slots=True)
class ModelFile:
    """One file of a model: where it lives on the hub and its name in the local directory."""

    repo_id: str
    remote: str
    local: str


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A downloadable model: its files, and how its vectors are made and named.

    ``pooling`` is None for models that are not embedders (the reranker). ``fingerprint`` is
    what the store records for an embedder; a new value re-embeds every key once.
    """

    name: str
    files: tuple[ModelFile, ...]
    pooling: Pooling | None
    fingerprint: str
    revision: str = "main"


# ----------------------------------------------------------------------------------------
# Progress


@dataclass(frozen=True, slots=True)
class FileProgress:
    file: str
    done: int
    total: int | None


@dataclass(frozen=True, slots=True)
class ModelProgress:
    """A snapshot of one model's download."""

    model: str
    state: DownloadState
    files: tuple[FileProgress, ...] = ()
    error: str | None = None

    @property
    def bytes_done(self) -> int:
        return sum(f.done for f in self.files)

    @property
    def bytes_total(self) -> int | None:
        totals = [f.total for f in self.files]
        return None if any(t is None for t in totals) else sum(t or 0 for t in totals)

    def describe(self) -> str:
        """One human line, e.g. ``bge-m3: downloading model.onnx 123.4/570.0 MB``."""
        if self.state == "downloading":
            current = next((f for f in self.files if f.total is None or f.done < f.total), None)
            if current is not None:
                amount = _megabytes(current.done, current.total)
                return f"{self.model}: downloading {current.file} {amount}"
            return f"{self.model}: downloading"
        if self.state == "failed":
            return f"{self.model}: download failed: {self.error}"
        if self.state == "done":
            return f"{self.model}: downloaded {self.bytes_done / _MB:.1f} MB"
        return f"{self.model}: idle"

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": self.state,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "files": [{"file": f.file, "done": f.done, "total": f.total} for f in self.files],
            "error": self.error,
            "text": self.describe(),
        }


class DownloadProgress:
    """Thread-safe progress of the model downloads of one process, keyed by model name.

    The downloader writes; the daemon's status and stats routes read ``snapshot()``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, ModelProgress] = {}

    def begin(self, model: str, files: Sequence[tuple[str, int | None]]) -> None:
        entries = tuple(FileProgress(name, 0, total) for name, total in files)
        with self._lock:
            self._models[model] = ModelProgress(model, "downloading", entries)

    def advance(self, model: str, file: str, nbytes: int) -> None:
        with self._lock:
            entry = self._models.get(model)
            if entry is None:
                return
            files = tuple(
                dataclasses.replace(f, done=f.done + nbytes) if f.file == file else f
                for f in entry.files
            )
            self._models[model] = dataclasses.replace(entry, files=files)

    def finish(self, model: str) -> None:
        with self._lock:
            entry = self._models.get(model, ModelProgress(model, "idle"))
            self._models[model] = dataclasses.replace(entry, state="done", error=None)

    def fail(self, model: str, message: str) -> None:
        with self._lock:
            entry = self._models.get(model, ModelProgress(model, "idle"))
            self._models[model] = dataclasses.replace(entry, state="failed", error=message)

    def get(self, model: str) -> ModelProgress:
        with self._lock:
            return self._models.get(model, ModelProgress(model, "idle"))

    def snapshot(self) -> dict[str, ModelProgress]:
        with self._lock:
            return dict(self._models)

    @property
    def state(self) -> DownloadState:
        """``downloading`` while any model downloads, else ``failed`` if one failed, else
        ``done`` if one finished, else ``idle``."""
        states = {m.state for m in self.snapshot().values()}
        order: tuple[DownloadState, ...] = ("downloading", "failed", "done")
        for state in order:
            if state in states:
                return state
        return "idle"

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "models": {k: v.as_dict() for k, v in self.snapshot().items()}}


def _megabytes(done: int, total: int | None) -> str:
    if total is None:
        return f"{done / _MB:.1f} MB"
    return f"{done / _MB:.1f}/{total / _MB:.1f} MB"


# ----------------------------------------------------------------------------------------
# Local state (no network)


def _read_manifest(dest: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((dest / MANIFEST_NAME).read_text(encoding="utf-8"))
        files = data.get("files", {})
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError, AttributeError):
        # A missing or damaged manifest only costs the size check; files are still used.
        return {}


def _write_manifest(dest: Path, files: dict[str, dict[str, Any]]) -> None:
    tmp = dest / f"{MANIFEST_NAME}.{uuid.uuid4().hex[:8]}{PART_SUFFIX}"
    tmp.write_text(json.dumps({"files": files}, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, dest / MANIFEST_NAME)


def missing_files(spec: ModelSpec, dest: Path) -> list[ModelFile]:
    """The files of ``spec`` absent, empty or truncated in ``dest``. Never touches the network.

    A file keymem did not download itself (no manifest entry) is trusted when not empty, so a
    directory filled by hand is used as it is.
    """
    manifest = _read_manifest(dest)
    missing: list[ModelFile] = []
    for item in spec.files:
        path = dest / item.local
        try:
            size = path.stat().st_size if path.is_file() else 0
        except OSError:
            size = 0
        recorded = manifest.get(item.local, {}).get("size")
        if size == 0 or (isinstance(recorded, int) and recorded != size):
            missing.append(item)
    return missing


# ----------------------------------------------------------------------------------------
# Fetching


@dataclass(frozen=True, slots=True)
class _Remote:
    item: ModelFile
    url: str
    size: int | None
    etag: str
    commit: str

    @property
    def sha256(self) -> str | None:
        # LFS files carry their sha256 as ETag; small git files carry a git blob id instead.
        etag = self.etag.lower()
        if len(etag) == _SHA256_HEX_LEN and all(c in "0123456789abcdef" for c in etag):
            return etag
        return None


def ensure_model(
    spec: ModelSpec,
    dest: Path,
    *,
    endpoint: str | None = None,
    timeout: float = 10.0,
    progress: DownloadProgress | None = None,
    verify: bool = False,
    cancel: threading.Event | None = None,
    lock_timeout: float = LOCK_TIMEOUT,
) -> list[str]:
    """Make ``dest`` hold every file of ``spec``; return the local names it fetched.

    ``endpoint`` overrides ``HF_ENDPOINT`` (empty = the library's default). ``cancel`` stops a
    running download between chunks. Raises ``ModelError`` when a file cannot be fetched.
    """
    if not verify and not missing_files(spec, dest):
        return []
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create model directory {dest}: {exc}") from exc
    with _dir_lock(dest, spec, lock_timeout):
        _remove_stale_parts(dest)
        # Another process may have completed the directory while we waited for the lock.
        wanted = list(spec.files) if verify else missing_files(spec, dest)
        if not wanted:
            return []
        with _reported(spec, dest, progress):
            return _fetch_files(spec, dest, wanted, endpoint=endpoint or None, timeout=timeout,
                                progress=progress, verify=verify, cancel=cancel)


@contextmanager
def _dir_lock(dest: Path, spec: ModelSpec, lock_timeout: float) -> Iterator[None]:
    import filelock

    lock = filelock.FileLock(str(dest / LOCK_NAME), timeout=lock_timeout)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise ModelError(
            f"cannot fetch {spec.name}: another process has held {dest / LOCK_NAME} for more "
            f"than {lock_timeout:.0f} s"
        ) from None
    except OSError as exc:
        raise ModelError(f"cannot fetch {spec.name}: cannot lock {dest}: {exc}") from exc
    try:
        yield
    finally:
        lock.release()


def _remove_stale_parts(dest: Path) -> None:
    # Under the directory lock no other process writes here, so any .part is left over from
    # a download that died.
    for part in dest.rglob(f"*{PART_SUFFIX}"):
        try:
            part.unlink()
        except OSError:
            logger.debug("cannot remove stale %s", part)


@contextmanager
def _reported(spec: ModelSpec, dest: Path, progress: DownloadProgress | None) -> Iterator[None]:
    """Local trouble (the manifest, the disk check) as a ModelError, and any failure shown
    in the download's progress."""
    try:
        try:
            yield
        except OSError as exc:
            raise ModelError(f"cannot write {spec.name} into {dest}: {exc}") from exc
    except ModelError as exc:
        if progress is not None:
            progress.fail(spec.name, exc.message)
        raise


def _fetch_files(
    spec: ModelSpec,
    dest: Path,
    wanted: Sequence[ModelFile],
    *,
    endpoint: str | None,
    timeout: float,
    progress: DownloadProgress | None,
    verify: bool,
    cancel: threading.Event | None,
) -> list[str]:
    # Ask for every file's metadata before writing anything: an unreachable hub fails here,
    # in one timeout, and the total size is known for the progress line and the disk check.
    remotes = [_metadata(spec, item, endpoint=endpoint, timeout=timeout) for item in wanted]
    manifest = _read_manifest(dest)
    if verify:
        good = [r for r in remotes if _matches(dest / r.item.local, r)]
        # Files now known to equal the hub's get a manifest entry, so a later truncation of
        # a hand-copied file is noticed without the network.
        for remote in good:
            manifest[remote.item.local] = _manifest_entry(dest, remote)
        if good:
            _write_manifest(dest, manifest)
        remotes = [r for r in remotes if r not in good]
        if not remotes:
            return []
    total = sum(r.size or 0 for r in remotes)
    _check_disk(dest, total, spec)
    names = ", ".join(r.item.local for r in remotes)
    logger.info("fetching %s into %s: %s (%.1f MB, one-time)", spec.name, dest, names, total / _MB)
    if progress is not None:
        progress.begin(spec.name, [(r.item.local, r.size) for r in remotes])
    started = time.monotonic()
    for remote in remotes:
        _download(spec, dest, remote, timeout=timeout, progress=progress, cancel=cancel)
        manifest[remote.item.local] = _manifest_entry(dest, remote)
        _write_manifest(dest, manifest)
    if progress is not None:
        progress.finish(spec.name)
    logger.info("fetched %s: %s in %.1f s", spec.name, names, time.monotonic() - started)
    return [r.item.local for r in remotes]


def _manifest_entry(dest: Path, remote: _Remote) -> dict[str, Any]:
    return {
        "repo": remote.item.repo_id,
        "remote": remote.item.remote,
        "commit": remote.commit,
        "etag": remote.etag,
        "size": (dest / remote.item.local).stat().st_size,
    }


def _describe_failure(exc: BaseException, endpoint: str, timeout: float) -> str:
    """Turn a hub or network exception into a short reason a user can act on."""
    import httpx2
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set"
    if isinstance(exc, httpx2.TimeoutException):
        return f"no answer from {endpoint} within {timeout:g} s"
    if isinstance(exc, httpx2.TransportError):
        return f"cannot connect to {endpoint} ({exc.__class__.__name__}: {exc})"
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return f"repository not found on {endpoint}"
    if isinstance(exc, (hf_errors.RemoteEntryNotFoundError, hf_errors.RevisionNotFoundError)):
        return f"file not found on {endpoint}"
    if isinstance(exc, hf_errors.HfHubHTTPError):
        return f"{endpoint} answered HTTP {exc.response.status_code}"
    if isinstance(exc, hf_errors.FileMetadataError):
        return f"{endpoint} does not answer like a model hub ({exc})"
    return f"{exc.__class__.__name__}: {exc}"


def _hub_endpoint(endpoint: str | None) -> str:
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def _metadata(spec: ModelSpec, item: ModelFile, *, endpoint: str | None, timeout: float) -> _Remote:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(item.repo_id, item.remote, revision=spec.revision, endpoint=endpoint)
    try:
        meta: HfFileMetadata = get_hf_file_metadata(
            url, timeout=timeout, endpoint=endpoint, retry_on_errors=False
        )
    except Exception as exc:  # every failure mode becomes one ModelError with its reason
        reason = _describe_failure(exc, _hub_endpoint(endpoint), timeout)
        raise ModelError(
            f"cannot fetch {spec.name} ({item.repo_id}/{item.remote}): {reason}"
        ) from exc
    if not meta.commit_hash or not meta.etag:
        raise ModelError(
            f"cannot fetch {spec.name} ({item.repo_id}/{item.remote}): "
            f"{_hub_endpoint(endpoint)} does not answer like a model hub (no commit or ETag)"
        )
    return _Remote(item, url, meta.size, meta.etag, meta.commit_hash)


def _matches(path: Path, remote: _Remote) -> bool:
    """Whether a local file equals the hub's (size, and sha256 when the hub gives one)."""
    try:
        size = path.stat().st_size if path.is_file() else -1
    except OSError:
        return False
    if size <= 0 or (remote.size is not None and size != remote.size):
        return False
    if remote.sha256 is None:
        return True
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest() == remote.sha256


def _check_disk(dest: Path, total: int, spec: ModelSpec) -> None:
    free = shutil.disk_usage(dest).free
    if free < total + DISK_MARGIN_BYTES:
        raise ModelError(
            f"cannot fetch {spec.name}: {total / _MB:.1f} MB needed but {free / _MB:.1f} MB "
            f"free in {dest}"
        )


def _download(
    spec: ModelSpec,
    dest: Path,
    remote: _Remote,
    *,
    timeout: float,
    progress: DownloadProgress | None,
    cancel: threading.Event | None,
) -> None:
    import httpx2
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import get_session, hf_raise_for_status

    # Documented public API; the package's lazy __init__ re-exports it without `as`.
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    final = dest / remote.item.local
    final.parent.mkdir(parents=True, exist_ok=True)
    part = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}{PART_SUFFIX}")
    label = f"{spec.name} {remote.item.local}"
    digest = hashlib.sha256() if remote.sha256 else None
    report = _ProgressLog(label, remote.size)
    received = 0
    headers = build_hf_headers()
    # The metadata HEAD asked for the real size; ask the same of the body, so the size check
    # compares like with like.
    headers["Accept-Encoding"] = "identity"
    try:
        # The resolve URL again (not the CDN location the HEAD saw): the client follows the
        # redirect itself and drops the Authorization header when it leaves the hub's origin.
        with get_session().stream(
            "GET", remote.url, headers=headers, timeout=httpx2.Timeout(timeout),
            follow_redirects=True,
        ) as response:
            hf_raise_for_status(response)
            with part.open("wb") as out:
                for chunk in response.iter_bytes(CHUNK_BYTES):
                    if cancel is not None and cancel.is_set():
                        raise ModelError(f"download of {label} cancelled")
                    out.write(chunk)
                    received += len(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    if progress is not None:
                        progress.advance(spec.name, remote.item.local, len(chunk))
                    report.tick(received)
                out.flush()
                os.fsync(out.fileno())
        if remote.size is not None and received != remote.size:
            raise ModelError(
                f"cannot fetch {label}: received {received} bytes, the hub announced {remote.size}"
            )
        if digest is not None and digest.hexdigest() != remote.sha256:
            raise ModelError(f"cannot fetch {label}: sha256 differs from the hub's ETag")
        os.replace(part, final)
        report.done(received)
    except ModelError:
        raise
    # Before OSError: the hub's HTTP errors and the offline switch are OSErrors too.
    except (httpx2.HTTPError, hf_errors.OfflineModeIsEnabled) as exc:
        raise _network_error(label, exc, remote, timeout) from exc
    except OSError as exc:
        raise ModelError(f"cannot write {final}: {exc}") from exc
    finally:
        part.unlink(missing_ok=True)


def _network_error(label: str, exc: BaseException, remote: _Remote, timeout: float) -> ModelError:
    origin = remote.url.split("/", 3)
    endpoint = "/".join(origin[:3]) if len(origin) >= 3 else remote.url
    return ModelError(f"cannot fetch {label}: {_describe_failure(exc, endpoint, timeout)}")


class _ProgressLog:
    """Logs a running download at INFO at most every ``PROGRESS_LOG_INTERVAL`` seconds."""

    def __init__(self, label: str, total: int | None, clock: Callable[[], float] = time.monotonic):
        self._label = label
        self._total = total
        self._clock = clock
        self._started = clock()
        self._last = self._started

    def tick(self, received: int) -> None:
        now = self._clock()
        if now - self._last >= PROGRESS_LOG_INTERVAL:
            self._last = now
            logger.info("downloading %s: %s", self._label, _megabytes(received, self._total))

    def done(self, received: int) -> None:
        elapsed = self._clock() - self._started
        logger.info("downloaded %s: %.1f MB in %.1f s", self._label, received / _MB, elapsed)
