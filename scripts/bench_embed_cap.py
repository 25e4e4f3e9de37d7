"""What capping the embedder's input (``EMBED_MAX_CHARS``) buys: issue 19 item 6.

A batch of 20 memories, each one 19,000-character unbroken token (under the 20,000-character
content limit), is embedded the way remember_batch embeds it -- once by the raw embedder
(the baseline: every character) and once through ``CachedEmbedder`` (capped). Meanwhile a
second thread embeds a short text the way a concurrent remember would, and waits for the
embedder: its wait is the latency other writes see. Prints seconds and the ratios.

    .venv/bin/python scripts/bench_embed_cap.py [--items 20] [--chars 19000]
"""

from __future__ import annotations

import argparse
import random
import string
import threading
import time
from collections.abc import Sequence

from keymem_daemon.engine.limits import EMBED_MAX_CHARS
from keymem_daemon.inference.embedders import CachedEmbedder, UseEmbedder


def run(embed: object, texts: Sequence[str]) -> tuple[float, float]:
    """(seconds for the batch, worst wait of a short embed issued while it runs)."""
    done = threading.Event()
    waits: list[float] = []

    def other_writer() -> None:
        while not done.is_set():
            started = time.perf_counter()
            embed.embed([f"a short memory {len(waits)}"])  # type: ignore[attr-defined]
            waits.append(time.perf_counter() - started)

    started = time.perf_counter()
    writer = threading.Thread(target=other_writer)
    writer.start()
    embed.embed(list(texts))  # type: ignore[attr-defined]
    took = time.perf_counter() - started
    done.set()
    writer.join()
    return took, max(waits, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--chars", type=int, default=19_000)
    args = parser.parse_args()
    rng = random.Random(6)
    texts = ["".join(rng.choices(string.ascii_letters, k=args.chars)) for _ in range(args.items)]
    raw = UseEmbedder()
    base_batch, base_wait = run(raw, texts)
    capped_batch, capped_wait = run(CachedEmbedder(raw), texts)
    print(f"{args.items} texts of {args.chars} unbroken letters; cap {EMBED_MAX_CHARS} characters")
    for name, batch, wait in (("uncapped (baseline)", base_batch, base_wait), ("capped", capped_batch, capped_wait)):
        print(f"  {name:20} batch {batch:7.2f} s; a concurrent short embed waited up to {wait:6.2f} s")
    ratio_wait = capped_wait / max(base_wait, 1e-9)
    print(f"  ratio capped/baseline: batch {capped_batch / base_batch:.3f}, wait {ratio_wait:.3f}")


if __name__ == "__main__":
    main()
