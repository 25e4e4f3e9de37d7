"""The cross-encoder reranker (bge-reranker-v2-m3 in ONNX) and the manager that keeps it
from ever slowing a call down.

``OnnxReranker`` scores (query, text) pairs with any cross-encoder whose graph takes
``input_ids`` and ``attention_mask`` (and optionally ``token_type_ids``) and returns one
logit per pair. ``RerankerManager`` owns it for the daemon, following ``KEYMEM_RERANK``:

- ``false``: never loaded; ``score`` returns None and recall uses fused ranking.
- ``auto`` and ``true``: used once ready. Fetching (when not cached) and loading happen in
  one background thread, started by ``start()`` or by the first ``score``; until it is done,
  ``score`` returns None at once, so no call ever waits for a download or a load. The two
  differ only in how a failure is reported: ``auto`` logs it at INFO (nobody asked for the
  reranker explicitly and keymem works without it), ``true`` at WARNING.
- A failure (offline, corrupt file, a run that raises) is logged once, drops the reranker
  and is retried after ``RETRY_BACKOFF`` seconds, on the next ``score`` or ``start``; the
  same failure again is logged at DEBUG only. After a load or run failure the retry
  re-checks the files against the hub, so a corrupt file is fetched again.

A cross-encoder reads every (query, memory) pair through the whole model: bge-reranker-v2-m3
is XLM-RoBERTa-large, about 28 times the compute per token of all-MiniLM-L6-v2, which (int8,
two cores) takes 0.2-0.4 s for 30 pairs of 80-150 tokens. So a caller passes a time budget:
the reranker measures its own speed (seconds per token, from a calibration run when it
loads and from every batch since) and scores only the best candidates it can finish in
time -- none when another call keeps it busy that long. Ordering needs at least two.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from keymem_daemon.errors import ModelError
from keymem_daemon.inference.download import (
    DownloadProgress,
    ModelFile,
    ModelSpec,
    ensure_model,
    missing_files,
)
from keymem_daemon.inference.embedders import MAX_TOKENS, MODEL_FILE, open_transformer

if TYPE_CHECKING:
    from keymem_daemon.config import Settings

logger = logging.getLogger(__name__)

RERANKER_SPEC: Final = ModelSpec(
    name="bge-reranker-v2-m3",
    files=(
        ModelFile(
            "onnx-community/bge-reranker-v2-m3-ONNX", "onnx/model_quantized.onnx", MODEL_FILE
        ),
        # The reranker shares bge-m3's XLM-RoBERTa tokenizer, which parses where
        # onnx-community's serialization does not.
        ModelFile("BAAI/bge-m3", "tokenizer.json", "tokenizer.json"),
        ModelFile("BAAI/bge-m3", "tokenizer_config.json", "tokenizer_config.json"),
    ),
    pooling=None,
    fingerprint="onnx:bge-reranker-v2-m3",
)

# Candidate texts are cut here before tokenizing: the head of a memory carries its gist,
# and a 512-token pair costs ~4x a 128-token one.
MAX_TEXT_CHARS: Final = 512
# Pairs per forward pass; pairs are sorted by length first so a batch pads little.
RERANK_BATCH: Final = 16
# Calibration: pairs of a query and a memory-sized text, run once to warm the session up
# and once to time it; later batches update the speed with this weight.
CALIBRATION_PAIRS: Final = 8
CALIBRATION_TEXT: Final = ("The staging database is reset every Sunday at 03:00 UTC, so long-running tests "
                           "should seed their own fixtures instead of relying on yesterday's rows.")
SPEED_WEIGHT: Final = 0.3
# Seconds before a failed reranker is tried again (fetch, load or run).
RETRY_BACKOFF: Final = 600.0
# How long close() waits for the background thread between two download chunks.
CLOSE_TIMEOUT: Final = 5.0

RerankState = Literal["disabled", "absent", "downloading", "loading", "ready", "failed"]


class OnnxReranker:
    """A cross-encoder in ONNX: ``score(query, texts)`` returns one raw logit per text."""

    def __init__(self, model_dir: Path, *, threads: int) -> None:
        self.model_dir = model_dir
        self._tokenizer, self._session, self._inputs = open_transformer(
            model_dir, threads=threads, max_tokens=MAX_TOKENS)
        self._pad_id = _pad_id(self._tokenizer)
        self._output: str = self._session.get_outputs()[0].name
        # One batch at a time, so concurrent recalls stay within the thread cap.
        self._lock = threading.Lock()
        self._seconds_per_token = 0.0
        try:
            pairs = [CALIBRATION_TEXT] * CALIBRATION_PAIRS
            self.score("when is the staging database reset?", pairs)  # first run: allocation
            self._seconds_per_token = 0.0
            self.score("when is the staging database reset?", pairs)
        except Exception as exc:  # a graph that loads but cannot run is as broken as a bad file
            raise ModelError(f"{model_dir / MODEL_FILE} cannot run: {exc}") from exc

    @property
    def tokens_per_second(self) -> float:
        """The measured speed (a calibration run when loaded, every batch since)."""
        return 1.0 / self._seconds_per_token if self._seconds_per_token > 0 else 0.0

    def score(self, query: str, texts: Sequence[str], *, budget: float | None = None) -> list[float]:
        """One raw logit per text of ``texts[:n]``. Without a budget n is all of them; with
        one (seconds) it is the longest prefix -- callers pass their best candidates first --
        that the measured speed says will be scored in time, waiting for a busy model
        included (none at all if it stays busy that long)."""
        if not texts:
            return []
        started = time.perf_counter()
        # encode() per pair applies the tokenizer's pair template (<s> q </s></s> t </s>).
        encodings = [self._tokenizer.encode(query, text[:MAX_TEXT_CHARS]) for text in texts]
        if budget is not None and self._affordable(encodings, budget) == 0:
            return []
        if budget is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(0.0, budget - (time.perf_counter() - started))):
            return []  # busy with another call for longer than this one may wait
        try:
            if budget is not None:
                encodings = encodings[:self._affordable(encodings, budget - (time.perf_counter() - started))]
                if not encodings:
                    return []
            order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
            scores = [0.0] * len(encodings)
            for start in range(0, len(order), RERANK_BATCH):
                chunk = order[start : start + RERANK_BATCH]
                logits = self._run([encodings[i] for i in chunk])
                for i, value in zip(chunk, logits, strict=True):
                    scores[i] = float(value)
        finally:
            self._lock.release()
        return scores

    def _affordable(self, encodings: Sequence[Any], seconds: float) -> int:
        """How many of ``encodings``, from the first, the measured speed scores in ``seconds``:
        the tokens their batches run, each batch padded to its longest pair."""
        lengths: list[int] = []
        for n, enc in enumerate(encodings):
            lengths.append(len(enc.ids))
            ordered = sorted(lengths)
            tokens = sum(len(batch) * batch[-1] for batch in (
                ordered[i:i + RERANK_BATCH] for i in range(0, len(ordered), RERANK_BATCH)))
            if tokens * self._seconds_per_token > seconds:
                return n
        return len(encodings)

    def _run(self, encodings: Sequence[Any]) -> list[float]:
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        feeds = {"input_ids": ids}
        if "attention_mask" in self._inputs:
            feeds["attention_mask"] = mask
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = types
        started = time.perf_counter()
        out = np.asarray(self._session.run([self._output], feeds)[0], dtype=np.float32)
        rate = (time.perf_counter() - started) / ids.size
        self._seconds_per_token = rate if self._seconds_per_token == 0 else (
            (1 - SPEED_WEIGHT) * self._seconds_per_token + SPEED_WEIGHT * rate)
        # [batch, 1] for bge rerankers; with two classes the last column is "relevant".
        return [float(v) for v in out.reshape(len(encodings), -1)[:, -1]]


def _pad_id(tokenizer: Any) -> int:
    for token in ("<pad>", "[PAD]"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


class RerankerManager:
    """Hands out reranker scores when the model is ready and None otherwise, never waiting.

    ``clock`` (monotonic seconds) is injectable so tests can step past the retry backoff.
    """

    def __init__(
        self,
        settings: Settings,
        progress: DownloadProgress | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_backoff: float = RETRY_BACKOFF,
    ) -> None:
        self.mode = settings.rerank
        self.pool = settings.rerank_pool
        self.model_dir = settings.rerank_model_path or settings.models_dir / RERANKER_SPEC.name
        self._settings = settings
        self._progress = progress
        self._clock = clock
        self._retry_backoff = retry_backoff
        self._lock = threading.Lock()
        self._state: RerankState = "disabled" if self.mode == "false" else "absent"
        self._detail = "KEYMEM_RERANK=false" if self.mode == "false" else "not loaded yet"
        self._reranker: OnnxReranker | None = None
        self._worker: threading.Thread | None = None
        self._failed_at: float | None = None
        self._verify_next = False
        self._last_logged: str | None = None
        self._cancel = threading.Event()

    @property
    def state(self) -> RerankState:
        with self._lock:
            return self._state

    def start(self) -> None:
        """Begin fetching and loading in the background if needed; returns at once."""
        if self.mode == "false":
            return
        with self._lock:
            self._start_locked()

    def score(self, query: str, texts: Sequence[str], *, budget: float | None = None) -> list[float] | None:
        """One score per text of ``texts[:n]`` (higher = more relevant; see
        ``OnnxReranker.score`` for ``budget`` and n), or None when the caller should use
        fused ranking: disabled, still downloading or loading, or failed."""
        if self.mode == "false":
            return None
        with self._lock:
            reranker = self._reranker
            if reranker is None:
                self._start_locked()
                return None
        try:
            return reranker.score(query, texts, budget=budget)
        except Exception as exc:  # onnxruntime errors are untyped; any of them ends this model
            self._fail(f"reranker {RERANKER_SPEC.name} failed to run: {exc}", verify=True,
                       dropped=reranker)
            return None

    def status(self) -> dict[str, Any]:
        """For ``/v1/stats`` and ``keymemd status``: mode, state and which ranking recall uses."""
        with self._lock:
            state, detail, reranker = self._state, self._detail, self._reranker
            retry_in = None
            if state == "failed" and self._failed_at is not None:
                retry_in = max(0.0, self._failed_at + self._retry_backoff - self._clock())
        out: dict[str, Any] = {
            "mode": self.mode,
            "state": state,
            "ranking": "reranker" if state == "ready" else "fused",
            "model": RERANKER_SPEC.name,
            "path": str(self.model_dir),
            "pool": self.pool,
            "budget_ms": self._settings.rerank_budget_ms,
            "inject_budget_ms": self._settings.inject_rerank_budget_ms,
            "detail": detail,
        }
        if reranker is not None:
            out["tokens_per_second"] = round(reranker.tokens_per_second)
        if retry_in is not None:
            out["retry_in_s"] = round(retry_in, 1)
        if state == "downloading" and self._progress is not None:
            out["download"] = self._progress.get(RERANKER_SPEC.name).as_dict()
        return out

    def close(self) -> None:
        """Stop a running download between two chunks and wait briefly for the thread."""
        self._cancel.set()
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(timeout=CLOSE_TIMEOUT)

    # --------------------------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._cancel.is_set() or self._state in ("downloading", "loading", "ready"):
            return
        if (
            self._state == "failed"
            and self._failed_at is not None
            and self._clock() - self._failed_at < self._retry_backoff
        ):
            return
        verify = self._verify_next
        cached = not missing_files(RERANKER_SPEC, self.model_dir)
        self._state = "loading" if cached and not verify else "downloading"
        self._detail = ("loading" if self._state == "loading"
                        else f"fetching into {self.model_dir} in the background")
        self._worker = threading.Thread(
            target=self._work, args=(verify,), name="keymem-reranker", daemon=True
        )
        self._worker.start()

    def _work(self, verify: bool) -> None:
        loading = False
        try:
            fetched = ensure_model(
                RERANKER_SPEC, self.model_dir,
                endpoint=self._settings.hf_endpoint or None,
                timeout=self._settings.download_timeout,
                progress=self._progress, verify=verify, cancel=self._cancel,
            )
            loading = True
            with self._lock:
                self._state, self._detail = "loading", "loading"
            started = time.monotonic()
            reranker = OnnxReranker(self.model_dir, threads=self._settings.rerank_threads)
        except ModelError as exc:
            if self._cancel.is_set():  # closing: not a failure worth a log line
                with self._lock:
                    self._state, self._detail = "absent", "closed"
                return
            # A failed fetch is retried as a fetch; after a failed load the retry also
            # re-checks the files that looked complete.
            self._fail(f"reranker {RERANKER_SPEC.name} unavailable: {exc.message}",
                       verify=loading)
            return
        with self._lock:
            self._reranker = reranker
            self._state = "ready"
            self._detail = f"{RERANKER_SPEC.name} from {self.model_dir}"
            self._failed_at = None
            self._verify_next = False
            self._last_logged = None
        note = f" (fetched {', '.join(fetched)})" if fetched else ""
        logger.info("reranker %s ready in %.1f s%s", RERANKER_SPEC.name,
                    time.monotonic() - started, note)

    def _fail(self, message: str, *, verify: bool, dropped: OnnxReranker | None = None) -> None:
        with self._lock:
            if dropped is not None and self._reranker is not dropped:
                return  # another thread already handled this reranker's failure
            self._reranker = None
            self._state = "failed"
            self._failed_at = self._clock()
            self._verify_next = verify
            self._detail = message
            repeat = message == self._last_logged
            self._last_logged = message
        retry = f"; fused ranking until a retry in {self._retry_backoff / 60:.0f} min"
        if repeat:
            logger.debug("%s%s", message, retry)
        elif self.mode == "true":
            logger.warning("%s%s", message, retry)
        else:
            logger.info("%s%s", message, retry)
