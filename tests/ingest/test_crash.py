"""Crash safety and process exclusion, with real processes: ``kill -9`` mid-ingest, two writers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import StoreBusyError

pytestmark = pytest.mark.slow  # the real default models (see conftest.py)


N_DOCS = 8


def _corpus(root: Path, n: int = N_DOCS, *, version: str = "v1") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = "\n\n".join(f"Document {i} {version} paragraph {j}: the quick brown fox number {i * 100 + j} "
                           f"jumps over the lazy dog while llama.cpp prefills {j * 512} tokens."
                           for j in range(25))
        (root / f"doc{i:02d}.md").write_text(f"# Doc {i}\n\n{body}\n")
    return root


#: A rag process that ingests the folder it is given, then holds the store open until its stdin closes.
HOLD_STORE = """
import sys
from pipeline import Pipeline
with Pipeline.from_config() as rag:
    rag.ingest([sys.argv[1]])
    with rag.runtime.store() as store:
        print("holding", flush=True)
        sys.stdin.read()
"""


def _spawn_ingest(root: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", "ingest", str(root), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))


def _committed(store_dir: Path, since: float = 0.0) -> int:
    """Documents committed (after ``since``), read from the catalog while another process writes it."""
    import sqlite3

    try:
        db = sqlite3.connect(f"file:{store_dir / 'catalog.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM documents WHERE ingested_at >= ?",
                              (since,)).fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def _kill_after(proc: subprocess.Popen, store_dir: Path, committed: int, extra: float,
                since: float = 0.0) -> None:
    """SIGKILL ``proc`` ``extra`` seconds after ``committed`` documents are in the catalog."""
    deadline = time.time() + 300
    while _committed(store_dir, since) < committed:
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.time() < deadline
        time.sleep(0.02)
    time.sleep(extra)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _check_consistent(rag, root: Path) -> None:
    """Both sides hold exactly the committed documents' chunks: none missing, none duplicated."""
    with rag.store() as store:
        docs = store.documents()
        n_chunks = sum(d.n_chunks for d in docs.values())
        assert store.chunk_count() == n_chunks
        got = store._col().get(include=["metadatas"])
        ids = got["ids"]
        assert len(ids) == len(set(ids))
        for meta in got["metadatas"]:
            assert docs[meta["source"]].content_hash == meta["content_hash"]
        for source, doc in docs.items():
            chunks = store.catalog.chunks(store.name, source)
            assert [c.index for c in chunks] == list(range(doc.n_chunks))


@pytest.mark.parametrize("committed,extra", [(0, 0.0), (1, 0.3), (4, 0.1)])
def test_kill_9_mid_ingest_then_resume(make_pipeline, tmp_path, store_dir, committed, extra):
    root = _corpus(tmp_path / "docs")
    proc = _spawn_ingest(root)
    _kill_after(proc, store_dir, committed, extra)

    rag = make_pipeline()
    if (store_dir / "catalog.sqlite").exists() and rag.status().exists:
        # Whatever is visible after the crash is whole: every listed document has all its chunks.
        _check_consistent(rag, root)
        partial = rag.status().documents
        for hit in rag.search("quick brown fox", top_k=20):
            assert hit.source in {str(p.resolve()) for p in root.iterdir()}
    else:
        partial = 0

    report = rag.ingest([root])
    assert partial < N_DOCS, "the ingest finished before it was killed: nothing was tested"
    assert report.count("new") == N_DOCS - partial and report.count("unchanged") == partial
    _check_consistent(rag, root)
    st = rag.status()
    assert st.documents == N_DOCS and st.dense_chunks == st.chunks


def test_kill_9_while_replacing_documents_keeps_old_or_new_never_both(make_pipeline, tmp_path, store_dir):
    root = _corpus(tmp_path / "docs")
    rag = make_pipeline()
    rag.ingest([root])
    _corpus(root, version="v2")  # every file changes
    started = time.time()
    proc = _spawn_ingest(root)
    _kill_after(proc, store_dir, 2, 0.2, since=started)  # two replaced, the third under way
    _check_consistent(rag, root)
    assert _committed(store_dir, started) < N_DOCS
    for hit in rag.search("Document paragraph quick brown fox", top_k=30):
        assert (" v1 " in hit.text) != (" v2 " in hit.text)
    report = rag.ingest([root])
    assert report.count("changed") + report.count("unchanged") == N_DOCS
    assert report.count("changed") >= 1
    _check_consistent(rag, root)
    assert all(" v2 " in h.text for h in rag.search("quick brown fox", top_k=30))


def test_second_process_waits_then_stops_with_a_clear_message(make_pipeline, tmp_path, store_dir):
    root = _corpus(tmp_path / "docs")
    # A real rag process ingests, then keeps the store open until told to stop: the lock is held
    # for certain while the checks run, however fast this machine ingests.
    holder = subprocess.Popen([sys.executable, "-c", HOLD_STORE, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    try:
        assert holder.stdout.readline().strip() == "holding", holder.stdout.read()
        waiting = make_pipeline(store__wait=0.5)
        with pytest.raises(StoreBusyError, match=r"in use by another rag process \(pid \d+"):
            waiting.status()
        # The CLI says the same, with its own exit status and no traceback.
        out = subprocess.run([sys.executable, "-m", "pipeline", "status"], capture_output=True, text=True,
                             env=dict(os.environ, RAG_STORE_WAIT="0.2"))
        assert out.returncode == 5 and "in use by another rag process" in out.stderr
        assert "Traceback" not in out.stderr
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=300) == 0
    # A process that waits long enough gets in once the first is done.
    assert make_pipeline(store__wait=30).status().documents == N_DOCS


def test_kill_9_mid_recut_leaves_whole_documents_and_a_rerun_finishes_it(store_dir, tmp_path, monkeypatch):
    """`rag sections --recut` killed after its first document: that document has its new sections,
    the others their old ones, none a mix; a rerun cuts the rest and ends where an uninterrupted
    re-cut ends."""
    import json
    import shutil

    from pipeline import Pipeline

    root = _corpus(tmp_path / "docs", n=4)
    monkeypatch.setenv("RAG_CHUNKING_SECTION_TOKENS", "512")
    with Pipeline.from_config() as rag:
        rag.ingest([root])
    shutil.copytree(store_dir, tmp_path / "clean-store")
    monkeypatch.setenv("RAG_CHUNKING_SECTION_TOKENS", "128")

    def sections(*extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline", "sections", "--json", *extra],
                              capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300)

    killed = sections("--recut", env={"RAG_TEST_KILL_SECTIONS_RECUT": "1"})
    assert killed.returncode == -signal.SIGKILL
    after_kill = json.loads(sections().stdout)
    assert after_kill["stale"] == 3 and {t["target"]: t["documents"] for t in after_kill["by_target"]} == {512: 3, 128: 1}
    rerun = json.loads(sections("--recut").stdout)
    assert rerun["recut"] == 3 and rerun["stale"] == 0
    clean = json.loads(sections("--recut", env={"RAG_STORE_PATH": str(tmp_path / "clean-store")}).stdout)
    assert clean["recut"] == 4 and clean["by_target"] == rerun["by_target"]

    def cut(path: Path) -> dict:
        with Pipeline.from_config(overrides={"store.path": str(path)}) as rag, rag.store(create=False) as store:
            docs = store.documents()
            found = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in docs.items()])
        return {s: [(x.first, x.last, x.target) for x in v] for s, v in found.items()}

    assert cut(store_dir) == cut(tmp_path / "clean-store")
