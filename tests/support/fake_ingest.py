"""``rag ingest ROOT`` with the fake embedder, as its own process, for the crash tests.

    python tests/support/fake_ingest.py ROOT[,ROOT...] [DELAY]

``DELAY`` seconds per embedded chunk keep the run long enough to be killed mid-way.
Settings (store path...) come from the environment, as for ``rag``.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]  # the helpers' package, and the checkout

from support.fakes import HashEmbedder  # noqa: E402

from pipeline import Pipeline  # noqa: E402


def main(argv: list[str]) -> int:
    roots, delay = argv[0].split(","), float(argv[1]) if len(argv) > 1 else 0.0
    with Pipeline.from_config(embedder=HashEmbedder(delay=delay)) as rag:
        report = rag.ingest(roots)
    print(report.summary(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
