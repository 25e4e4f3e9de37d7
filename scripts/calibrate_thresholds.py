"""Sweep key-similarity thresholds on the labelled key pairs and print the separation.

    python scripts/calibrate_thresholds.py [--embedder use-multilingual-v3|bge-m3|<dir>] [--split dev|test|all]

For each decision the engine takes with a cosine, it prints, per threshold, how many
labelled pairs land on the right side:
  - merge (same script):  "same" pairs should merge, "distinct" pairs must not;
  - merge (cross script): the same for Hangul <-> Latin pairs;
  - translation pair:     mutual-best cross-script pairs of one write (looser);
  - key recall:           a query term should reach the same concept or a related one,
                          never an unrelated key.
Choose on dev, confirm on test, then commit the profile (models/embedders.py) with the
figures. The pairs live in tests/fixtures/key_pairs.tsv.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from keymem_daemon.config import Settings  # noqa: E402
from keymem_daemon.engine.keys import conflicting_qualifiers, cross_script  # noqa: E402
from keymem_daemon.inference.embedders import load_embedder  # noqa: E402

PAIRS = ROOT / "tests" / "fixtures" / "key_pairs.tsv"


def load_pairs(split: str) -> list[dict[str, str]]:
    with PAIRS.open(encoding="utf-8") as f:
        rows = csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")
        return [r for r in rows if split == "all" or r["split"] == split]


def sweep(name: str, sims: np.ndarray, positive: np.ndarray, blocked: np.ndarray | None = None) -> float:
    """Print precision/recall/accuracy per threshold; return the best-accuracy threshold."""
    print(f"\n{name}: {int(positive.sum())} positive, {int((~positive).sum())} negative pairs")
    print("  thr   recall  precision  accuracy  false+")
    best = (0.0, 0.0)
    for thr in np.arange(0.50, 0.97, 0.02):
        predicted = sims >= thr
        if blocked is not None:
            predicted &= ~blocked
        tp = int((predicted & positive).sum())
        fp = int((predicted & ~positive).sum())
        recall = tp / max(1, int(positive.sum()))
        precision = tp / max(1, tp + fp)
        accuracy = float((predicted == positive).mean())
        print(f"  {thr:.2f}  {recall:6.3f}  {precision:9.3f}  {accuracy:8.3f}  {fp:6d}")
        if accuracy > best[1]:
            best = (float(thr), accuracy)
    print(f"  best accuracy {best[1]:.3f} at {best[0]:.2f}")
    return best[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="use-multilingual-v3")
    parser.add_argument("--split", default="dev", choices=("dev", "test", "all"))
    args = parser.parse_args()
    settings = Settings.from_env({**os.environ, "KEYMEM_EMBED_MODEL": args.embedder})
    embedder = load_embedder(settings)
    pairs = load_pairs(args.split)
    a = embedder.embed([p["a"] for p in pairs])
    b = embedder.embed([p["b"] for p in pairs])
    sims = np.sum(a * b, axis=1)
    same = np.array([p["label"] == "same" for p in pairs])
    cross = np.array([cross_script(p["a"], p["b"]) for p in pairs])
    qualifier = np.array([conflicting_qualifiers(p["a"], p["b"]) for p in pairs])
    kinds = sorted({p["kind"] for p in pairs})
    print(f"embedder {embedder.fingerprint}, split {args.split}, {len(pairs)} pairs")
    print("\ncosine by kind (min / median / max):")
    for kind in kinds:
        for script, mask in (("same-script", ~cross), ("cross-script", cross)):
            sel = np.array([p["kind"] == kind for p in pairs]) & mask
            if sel.any():
                v = sims[sel]
                print(f"  {kind:12s} {script:12s} n={sel.sum():3d}  {v.min():.3f} / {np.median(v):.3f} / {v.max():.3f}")
    sweep("merge, same script (qualifier guard on)", sims[~cross], same[~cross], qualifier[~cross])
    sweep("merge, cross script (qualifier guard on)", sims[cross], same[cross], qualifier[cross])
    related = np.array([p["kind"] in ("related",) for p in pairs])
    reachable = same | related
    names = np.array([p["kind"] in ("names", "qualifier") for p in pairs])
    sweep("key recall (same or related reachable; unrelated/names/qualifier not)",
          sims[~names | same], reachable[~names | same])


if __name__ == "__main__":
    main()
