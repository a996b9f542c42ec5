"""Shared fixtures: every test runs in an isolated environment, stores and caches live in ``tmp_path``.

* Every ``RAG_*`` variable is cleared for each test (:func:`_isolated_environment`), and
  ``RAG_HOME`` points at an empty home in ``tmp_path`` whose ``models`` folder is the
  real model home's: tests see the provisioned models and nothing else of the user's
  home (store, prefix cache, tuned profiles, hardware profile).
* The real model home is ``RAG_HOME`` as the test run started with it (default
  ``~/.cache/rag``); ``./setup.sh`` (``rag models pull``) provisions the default models
  there. A test that needs them (:func:`model_home`) fails with that advice when they
  are missing, and is ``slow`` (marked so at collection): ``pytest -m "not slow"`` runs the rest,
  which use the deterministic fakes of ``tests/support/fakes.py`` (:func:`fake_pipeline`) or
  tiny generated models.
* ``RAG_INGEST_WARM=off``: ``rag ingest`` does not save section states afterwards (what
  ``ingest.warm = "auto"`` does for a collection larger than the context, the bundled samples
  at the 8K default included), so an ingest in a test costs its embedding only; the tests of
  that default set it back (``tests/ingest/test_ingest_warm.py``).
* Every llama.cpp model a test loads must be closed by the end of the test (the
  ``make_pipeline`` and ``fake_pipeline`` factories close theirs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers: ``from support.fakes import ...``
if str(ROOT) not in sys.path:  # the development tools (devtools/) are the checkout's, never installed
    sys.path.insert(1, str(ROOT))
pytest.register_assert_rewrite("support")  # the helpers' asserts explain a failure as a test's do

from support.pdfs import make_pdf  # noqa: E402

#: The environment the run started with: where the real models are.
_REAL_HOME = os.environ.get("RAG_HOME") or ""


def pytest_collection_modifyitems(config, items):
    """A test that uses the real models (through :func:`model_home`) is ``slow``, marked or not:
    the fast subset (``-m "not slow"``) never needs a provisioned model."""
    for item in items:
        if "model_home" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


def _real_home() -> Path:
    from pipeline.config import resolve_home

    return resolve_home(_REAL_HOME)


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory, monkeypatch):
    """No RAG_* setting of the caller's leaks in; RAG_HOME is a fresh home that shares only the models."""
    for name in list(os.environ):
        if name.startswith("RAG_"):
            monkeypatch.delenv(name)
    home = tmp_path_factory.mktemp("rag-home")
    real_models = _real_home() / "models"
    if real_models.is_dir():
        (home / "models").symlink_to(real_models, target_is_directory=True)
    monkeypatch.setenv("RAG_HOME", str(home))
    monkeypatch.setenv("RAG_INGEST_WARM", "off")
    yield home


@pytest.fixture(autouse=True)
def _models_closed():
    """Fail a test that leaves a llama.cpp model open (every engine and embedder must be closed)."""
    def open_models() -> list:
        boundary = sys.modules.get("pipeline.engine._llama")  # not imported: nothing was loaded
        return boundary.open_models() if boundary else []

    before = set(map(id, open_models()))
    yield
    left = [m for m in open_models() if id(m) not in before]
    if left:
        for m in left:
            m.close()
        pytest.fail(f"{len(left)} llama.cpp model(s) left open by the test: close every Engine/Embedder it makes")


@pytest.fixture(scope="session")
def model_home() -> Path:
    """The real model home, with the default models already provisioned (the tests using it are slow)."""
    from pipeline.models import resolve

    home = _real_home()
    # The default models, and SmolLM2 for the tests of a chat template (`make test` pulls it).
    for ref in ("builtin:all-MiniLM-L6-v2", "builtin:gemma-3-270m", "builtin:SmolLM2-135M-Instruct"):
        try:
            resolve(ref, home=home, fetch=False)
        except Exception as exc:  # noqa: BLE001 - turn any failure into setup advice
            pytest.fail(f"default model {ref} is not provisioned in {home} ({exc}); run ./setup.sh first "
                        f"(it provisions the models in RAG_HOME), or `pytest -m 'not slow'` for the tests "
                        "that need no model")
    return home


@pytest.fixture
def tmp_store(tmp_path, monkeypatch) -> Path:
    """A fresh store (and prefix cache) directory, exported so CLI runs and subprocesses use it."""
    path = tmp_path / "store"
    monkeypatch.setenv("RAG_STORE_PATH", str(path))
    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    return path


@pytest.fixture
def store_dir(tmp_store, model_home) -> Path:
    """:func:`tmp_store`, for a test that runs the real default models."""
    return tmp_store


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


@pytest.fixture
def fake_pipeline(tmp_store):
    """Build a Pipeline on a temporary store with the fakes of ``tests/support/fakes.py``: no model loads.

    ``factory(embedder=..., generator=..., **overrides)``; by default a fresh
    :class:`support.fakes.HashEmbedder` and an :class:`support.fakes.EchoGenerator` sharing one set of
    saved prefixes with every other pipeline of the test (as processes share a cache).
    """
    from support.fakes import EchoGenerator, HashEmbedder
    from pipeline import Pipeline

    saved: set = set()
    made = []

    def factory(*, embedder=None, generator=None, **overrides):
        p = Pipeline.from_config(overrides={k.replace("__", "."): v for k, v in overrides.items()},
                                 embedder=embedder or HashEmbedder(),
                                 generator=generator or EchoGenerator(saved=saved))
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


@pytest.fixture
def ingested(make_pipeline, corpus):
    """``corpus`` ingested with the default (real) embedder; a test module may override it with a fake one."""
    make_pipeline().ingest([corpus])
    return corpus


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium for the web page's tests, one per test module."""
    from support.browser import Browser, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium to test the web page in: install Debian's chromium package (./setup.sh does "
                    "where apt-get can), or name a browser with RAG_TEST_CHROMIUM")
    b = Browser(binary, tmp_path_factory.mktemp("chromium") / "profile")
    yield b
    b.close()
