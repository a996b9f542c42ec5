"""Shared fixtures: every store lives in ``tmp_path``; models come from the real model home.

The default models are provisioned by ``./setup.sh`` (``rag models pull``); a test
run without them fails loudly rather than skipping.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pdfs import make_pdf  # noqa: E402


@pytest.fixture(scope="session")
def model_home() -> Path:
    """The real model home, with the default models already provisioned."""
    from pipeline.config import resolve_home
    from pipeline.models import resolve

    home = resolve_home()
    for ref in ("builtin:all-MiniLM-L6-v2", "builtin:SmolLM2-135M-Instruct"):
        try:
            resolve(ref, home=home, fetch=False)
        except Exception as exc:  # noqa: BLE001 - turn any failure into setup advice
            pytest.fail(f"default model {ref} is not provisioned ({exc}); run ./setup.sh first")
    return home


@pytest.fixture
def store_dir(tmp_path, monkeypatch, model_home) -> Path:
    """A fresh store (and prefix cache) directory, exported so CLI runs and subprocesses use it."""
    path = tmp_path / "store"
    for name in list(os.environ):
        if name.startswith("RAG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RAG_STORE_PATH", str(path))
    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    monkeypatch.setenv("RAG_HOME", str(model_home))
    return path


@pytest.fixture
def make_pipeline(store_dir):
    """Build a Pipeline on the temporary store; overrides are dotted config keys."""
    from pipeline import Pipeline

    made = []

    def factory(**overrides):
        p = Pipeline.from_config(overrides={k.replace("__", "."): v for k, v in overrides.items()})
        made.append(p)
        return p

    yield factory
    for p in made:
        p.close()


CORPUS = {
    "guide.md": "# Prefill tuning\n\nThe flag --n-cpu-moe keeps expert tensors of the first N layers "
                "in CPU memory. Larger micro-batches (-ub 512) amortise the copies of expert weights.\n\n"
                "## Flash attention\n\nFlash attention reduces memory traffic during prompt processing.\n",
    "notes.txt": "Chroma runs embedded through PersistentClient or as a server through HttpClient.\n"
                 "The error code ERR_SOCKET_ZX81 appears when the server is unreachable.\n",
    "page.html": "<html><head><title>Gardening</title><style>p{color:red}</style></head><body>"
                 "<h1>Tomatoes</h1><p>Tomato plants need full sun and regular watering.</p>"
                 "<script>var x = 'hidden';</script></body></html>",
}


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A small folder with one document of each format and one unsupported file."""
    root = tmp_path / "docs"
    root.mkdir()
    for name, text in CORPUS.items():
        (root / name).write_text(text)
    make_pdf(root / "manual.pdf", [
        "Page one introduces the llama_state_seq_save_file function for saving KV state.",
        "Page two explains that bananas are yellow and rich in potassium.",
        "Page three covers the header file ggml-backend.h and buffer types.",
    ], title="Manual")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    return root
