"""What the warming after an ingest costs, and how true its time-left estimate is.

A fresh store and cache, ``Pipeline.ingest`` of a folder with the defaults (``ingest.warm = "auto"``),
then the warming it starts, waited for as ``rag ingest`` waits for it. Reported: the embedding's seconds,
the warming's seconds (calibration and section states) and tokens, when its first progress arrived, and,
at a quarter, half and three quarters of its tokens, the time left it estimated against the time it
then really took (their ratio; the target is within a factor of 2).

    .venv/bin/python benchmarks/warm.py [--folder samples] [--threads N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=ROOT / "samples")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rag-bench-warm-"))
    seen: list[tuple[float, str, int, int, float | None]] = []
    try:
        overrides = {"store.path": str(work / "store"), "cache.path": str(work / "cache"),
                     "engine.threads": args.threads, "ingest.warm": "auto"}
        with Pipeline.from_config(overrides=overrides) as rag:
            t0 = time.monotonic()
            report = rag.ingest([args.folder])
            embedded = time.monotonic()
            job = report.warming
            outcome = job.wait(on_progress=lambda p: seen.append((time.monotonic(), p.stage, p.done, p.total, p.eta)),
                               every=0.5)
            end = time.monotonic()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm_s = end - embedded
    first = seen[0][0] - embedded if seen else float("nan")
    print(f"{args.folder}: {report.tokens:,} tokens embedded in {embedded - t0:.1f} s; warming {warm_s:.1f} s "
          f"({seen[-1][3] if seen else 0:,} tokens of work), its first progress after {first:.1f} s: "
          f"{outcome.get('reason', '')}")
    c = outcome.get("calibration") or {}
    if c:
        print(f"calibration: KL {c['kl']:.4f} over {c['prompts']} prompts (spread {c['kl_spread']:.4f}), "
              f"allowed {c['allowed']}")
    print("\n| share of the work done | time left estimated | time left in fact | estimate / fact |\n"
          "| --- | --- | --- | --- |")
    ratios = []
    for share in (0.25, 0.5, 0.75):
        at = next((s for s in seen if s[3] and s[2] >= share * s[3] and s[4] is not None), None)
        if at is None:
            continue
        fact = end - at[0]
        ratios.append(at[4] / fact if fact > 0 else float("inf"))
        print(f"| {share:.0%} ({at[1]}) | {at[4]:.0f} s | {fact:.0f} s | {ratios[-1]:.2f} |")
    within = all(0.5 <= r <= 2 for r in ratios) and bool(ratios)
    print(f"\nestimates within a factor of 2: {'PASS' if within else 'FAIL'}")
    if args.json:
        from devtools.bench import document, row

        rows = [row("embedding", embedded - t0, "s"), row("warming", warm_s, "s"),
                row("first progress after", first, "s")]
        rows += [row(f"time-left estimate / fact at {share:.0%}", r, "x") for share, r in zip((0.25, 0.5, 0.75), ratios)]
        args.json.write_text(json.dumps(document(rows, outcome=outcome), indent=2))
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
