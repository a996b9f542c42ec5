"""The screenshot of the web page in docs/app.md, taken by the browser the tests use.

    .venv/bin/python tests/support/web_screenshot.py docs/web-page.png

Ingests samples/ into a temporary store (as `rag ingest` does by default: section states saved and
composition calibrated where the collection is larger than the context), starts `rag serve` on it
(shorter answers), opens `/?q=...` in headless Chromium, asks a follow-up, and saves the page as a
PNG. It prints each answer's figures (TTFT, tokens reused and how).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]  # the helpers' package, and the checkout (devtools/)

from support.browser import Browser, find_chromium  # noqa: E402
from support.serving import RagServer  # noqa: E402

ROOT = TESTS.parent
QUESTION = "How much faster was prefill with 8 layers' experts on the CPU?"  # the two questions of `make demo`
FOLLOW_UP = "What is the difference between n_batch and n_ubatch?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / "docs" / "web-page.png")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--config", type=Path, help="a settings file (RAG_CONFIG), e.g. configs/smollm2-135m.toml")
    args = parser.parse_args()
    binary = find_chromium()
    if binary is None:
        sys.exit("no Chromium found: install Debian's chromium package, or name one with RAG_TEST_CHROMIUM")
    with tempfile.TemporaryDirectory(prefix="rag-screenshot-") as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_") or k == "RAG_HOME"}
        env.update(RAG_STORE_PATH=str(root / "store"), RAG_CACHE_PATH=str(root / "cache"),
                   RAG_ASK_MAX_TOKENS=str(args.max_tokens))
        if args.config:
            env["RAG_CONFIG"] = str(args.config.resolve())
        subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(ROOT / "samples")], env=env, check=True,
                       capture_output=True)
        server = RagServer(env, log=root / "serve.log").start()
        browser = Browser(binary, root / "profile")
        try:
            page = browser.page(width=1000, height=800)
            page.goto(f"{server.base}/?q={quote(QUESTION)}")
            done = "document.getElementById('turn').dataset.state === 'done'"
            page.wait_for(done, timeout=1800)
            page.type("#question", FOLLOW_UP)
            page.click("#ask")
            page.wait_for(f"document.getElementById('asked').textContent === {FOLLOW_UP!r} && {done}", timeout=1800)
            for line in page.eval("[...document.querySelectorAll('.stats')].map(e => e.innerText)"):
                print(line)
            page.eval("document.activeElement.blur()")
            page.screenshot(args.out)
        finally:
            browser.close()
            server.stop()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
