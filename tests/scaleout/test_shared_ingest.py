"""Many processes, one collection: ``rag ingest`` processes writing at once, and questions while
they write, through a real Chroma server and a real PostgreSQL (see ``support/servers.py``).

The ingests run as their own processes (``tests/support/fake_ingest.py``, the fake embedder: the
store's protocol does not depend on the embedder). ``RAG_TEST_KILL_BEFORE_COMMIT`` stops one
of them with SIGKILL exactly mid-document: its vectors written, its commit not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import chromadb
import pytest

from support.servers import chroma_url, pg_cluster, pg_url  # noqa: F401  (fixtures)

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fake_ingest.py"

# Real servers (chroma run, a PostgreSQL cluster) and real processes: not the fakes-only fast subset.
pytestmark = pytest.mark.slow
FOLDERS = "abcde"


def _corpus(root: Path) -> Path:
    """Five folders of three documents, several chunks each (the words differ per document)."""
    for f in FOLDERS:
        (root / f).mkdir(parents=True, exist_ok=True)
        for i in range(3):
            body = "\n\n".join(f"Folder {f} document {i} paragraph {j}: topic{f}{i} the quick brown fox "
                               f"jumps over marker{f}{i}x{j} while the prefill runs {j * 64} tokens."
                               for j in range(30))
            (root / f / f"doc{i}.md").write_text(f"# {f.upper()} {i}\n\n{body}\n")
    return root


def _env(url: str, catalog_url: str, store: Path, collection: str = "default", **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_TEST_")}
    env.update(RAG_STORE_URL=url, RAG_STORE_CATALOG_URL=catalog_url, RAG_STORE_PATH=str(store),
               RAG_STORE_COLLECTION=collection, **extra)
    return env


def _spawn(roots: list[Path], env: dict, delay: str = "0.01") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), ",".join(map(str, roots)), delay],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _state(chroma: str, catalog_url: str, collection: str) -> dict:
    """Everything stored for ``collection``: catalog documents and chunks, and the server's vectors."""
    import psycopg

    with psycopg.connect(catalog_url) as conn:
        docs = sorted(conn.execute("SELECT source, content_hash, n_chunks, n_tokens FROM documents"
                                   " WHERE collection = %s", (collection,)).fetchall())
        chunks = sorted(conn.execute("SELECT chunk_id, source, idx, text FROM chunks WHERE collection = %s",
                                     (collection,)).fetchall())
        sections = sorted(conn.execute("SELECT source, idx, first_chunk, last_chunk FROM sections"
                                       " WHERE collection = %s", (collection,)).fetchall())
        pending = conn.execute("SELECT source FROM pending WHERE collection = %s", (collection,)).fetchall()
    col = chromadb.HttpClient(host="127.0.0.1", port=int(chroma.rsplit(":", 1)[1])).get_collection(collection)
    vectors = col.get(include=["metadatas"])
    return {"docs": docs, "chunks": chunks, "sections": sections, "pending": pending,
            "vector_ids": sorted(vectors["ids"]), "vector_count": col.count()}


QUERIES = ("markerc1x7 topicc1", "quick brown fox folder e", "topica0 paragraph 12", "markerd2x29")


def _hits(fake_pipeline, collection: str, **retrieval) -> dict:
    rag = fake_pipeline(store__collection=collection,
                        **{f"retrieval__{k}": v for k, v in retrieval.items()})
    return {q: [(h.source.split("/docs/")[1], h.page, h.text) for h in rag.search(q, top_k=8)] for q in QUERIES}


def test_four_ingests_at_once_equal_one_and_survive_a_kill_9(fake_pipeline, tmp_path, chroma_url, pg_url,
                                                            monkeypatch):
    root = _corpus(tmp_path / "docs")
    store = tmp_path / "unused-store-dir"
    monkeypatch.setenv("RAG_STORE_URL", chroma_url)
    monkeypatch.setenv("RAG_STORE_CATALOG_URL", pg_url)

    # The reference: one process, everything, in a collection of its own on the same servers.
    single = _spawn([root], _env(chroma_url, pg_url, store, "single"), delay="0")
    assert single.wait(120) == 0, single.stdout.read().decode()

    # Four at once on overlapping folders; the fourth is killed mid-document (during its 2nd write:
    # its vectors are in Chroma, its commit is not). Only it covers folder e, so at least two of e's
    # three documents are left to its rerun, whichever files it started with (processes start at a
    # random place in their list).
    d = {f: root / f for f in FOLDERS}
    plans = [[d["a"], d["b"]], [d["b"], d["c"]], [d["c"], d["d"]], [d["e"], d["d"], d["a"]]]
    procs = [_spawn(p, _env(chroma_url, pg_url, store, **({"RAG_TEST_KILL_BEFORE_COMMIT": "2"} if i == 3 else {})))
             for i, p in enumerate(plans)]
    codes = [p.wait(300) for p in procs]
    outputs = [p.stdout.read().decode() for p in procs]
    assert codes == [0, 0, 0, -9], outputs

    after_kill = _state(chroma_url, pg_url, "default")
    reference = _state(chroma_url, pg_url, "single")
    sources = {r[0] for r in after_kill["docs"]}
    everything = {r[0] for r in reference["docs"]}
    missing = everything - sources
    assert sources < everything and len(missing) >= 2
    assert all(Path(s).parent == d["e"] for s in missing)  # the others finished everything they cover
    # The journal remembers the half-written document, unless another process covering it wrote it
    # after the kill (the server released the killed one's lock) and cleared the entry.
    pending = [p for (p,) in after_kill["pending"]]
    assert len(pending) <= 1 and all(Path(p).parent in (d["e"], d["d"], d["a"]) for p in pending)
    assert all(p in missing for p in pending)
    # What is committed is whole: every committed chunk has its vector, and no chunk twice.
    committed_ids = [c[0] for c in after_kill["chunks"]]
    assert len(committed_ids) == len(set(committed_ids)) == sum(r[2] for r in after_kill["docs"])
    assert set(committed_ids) <= set(after_kill["vector_ids"])
    orphans = set(after_kill["vector_ids"]) - set(committed_ids)  # the killed write's, invisible to search
    assert all(any(i.startswith(_id_prefix(Path(p))) for p in pending) for i in orphans)
    assert bool(orphans) == bool(pending)

    # The killed process's run again: it finishes the journal's cleanup and its own work.
    rerun = _spawn(plans[3], _env(chroma_url, pg_url, store), delay="0")
    assert rerun.wait(120) == 0
    out = rerun.stdout.read().decode()
    assert f"{len(missing)} new" in out and f"{9 - len(missing)} unchanged" in out, out

    final = _state(chroma_url, pg_url, "default")
    assert final["pending"] == []
    assert final["docs"] == reference["docs"]
    assert final["chunks"] == [(i, s, x, t) for i, s, x, t in reference["chunks"]]
    assert final["sections"] == reference["sections"]
    assert final["vector_ids"] == [c[0] for c in final["chunks"]] and final["vector_count"] == len(final["chunks"])
    # Searches agree with the single process's collection: dense alone, full-text alone, and fused.
    for mode in ({"lexical": False}, {"dense": False}, {}):
        assert _hits(fake_pipeline, "default", **mode) == _hits(fake_pipeline, "single", **mode), mode
    lexical = _hits(fake_pipeline, "default", dense=False)
    assert lexical["markerc1x7 topicc1"][0][0] == "c/doc1.md"


def _id_prefix(source: Path) -> str:
    import hashlib

    return hashlib.sha1(str(source).encode()).hexdigest()[:16]


def test_search_and_ask_answer_while_an_ingest_runs(fake_pipeline, tmp_path, chroma_url, pg_url, monkeypatch):
    """An app asking questions of a collection that a nightly ingest is writing, at the same time."""
    root = _corpus(tmp_path / "docs")
    monkeypatch.setenv("RAG_STORE_URL", chroma_url)
    monkeypatch.setenv("RAG_STORE_CATALOG_URL", pg_url)
    first = _spawn([root / "a"], _env(chroma_url, pg_url, tmp_path / "s"), delay="0")
    assert first.wait(120) == 0
    ingest = _spawn([root], _env(chroma_url, pg_url, tmp_path / "s"), delay="0.05")  # ~20 s of work
    rag = fake_pipeline()
    try:
        answered = 0
        seen_docs = set()
        deadline = time.monotonic() + 60
        while ingest.poll() is None and time.monotonic() < deadline:
            hits = rag.search("topica1 quick brown fox")
            assert hits and hits[0].source == str(root / "a" / "doc1.md")
            answer = rag.ask("What does paragraph 3 of folder a document 1 say?")
            assert answer.text and answer.sources
            seen_docs.add(rag.status().documents)
            answered += 1
            time.sleep(0.3)
        assert ingest.poll() is None or answered >= 3, "the ingest ended before any question: nothing was tested"
        assert answered >= 3 and len(seen_docs) >= 2, (answered, seen_docs)  # documents arrived meanwhile
    finally:
        if ingest.poll() is None:
            ingest.wait(120)
    assert ingest.returncode == 0, ingest.stdout.read().decode()
    assert rag.status().documents == 15
    assert rag.search("markere2x5")[0].source == str(root / "e" / "doc2.md")


def test_ingests_of_the_same_folder_split_the_work(tmp_path, chroma_url, pg_url):
    """Two processes over the same 15 files: each file is embedded by exactly one of them."""
    import re

    root = _corpus(tmp_path / "docs")
    procs = [_spawn([root], _env(chroma_url, pg_url, tmp_path / "s"), delay="0.01") for _ in range(2)]
    assert [p.wait(300) for p in procs] == [0, 0]
    outs = [p.stdout.read().decode() for p in procs]
    new = [int(re.search(r"(\d+) new", o).group(1)) for o in outs]
    unchanged = [int(re.search(r"(\d+) unchanged", o).group(1)) for o in outs]
    assert sum(new) == 15 and min(new) > 0, outs
    assert [n + u for n, u in zip(new, unchanged)] == [15, 15], outs
    state = _state(chroma_url, pg_url, "default")
    assert len(state["docs"]) == 15 and state["vector_count"] == len(state["chunks"])


def _rag(*args: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True,
                          timeout=600, **kw)


def test_cli_search_ask_and_summarize_while_rag_ingest_runs(store_dir, tmp_path, chroma_url, pg_url):
    """The real CLI and the default models: ``rag search`` and ``rag ask`` answer from a collection that a
    ``rag ingest`` process is writing at that moment; ``rag summarize`` keeps its job state in PostgreSQL."""
    import json

    import psycopg

    env = _env(chroma_url, pg_url, store_dir, RAG_CACHE_PATH=str(tmp_path / "cache"))
    small = tmp_path / "small"
    small.mkdir()
    (small / "notes.md").write_text("# Notes\n\nThe error code ERR_SOCKET_ZX81 appears when the Chroma server "
                                    "is unreachable. Restart the server with chroma run.\n")
    done = _rag("ingest", str(small), env=env)
    assert done.returncode == 0, done.stderr
    big = tmp_path / "big"
    big.mkdir()
    for i in range(40):
        (big / f"doc{i:02d}.md").write_text(f"# Report {i}\n\n" + "\n\n".join(
            f"Section {j} of report {i}: measurement {i * 100 + j} shows the pump pressure rising while the "
            f"valve number {j} stays closed and the operator logs the reading." for j in range(40)) + "\n")
    ingest = subprocess.Popen([sys.executable, "-m", "pipeline", "ingest", str(big)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        search = _rag("search", "ERR_SOCKET_ZX81", "--json", env=env)
        assert search.returncode == 0, search.stderr
        assert json.loads(search.stdout)["hits"][0]["source"] == str(small / "notes.md")
        ask = _rag("ask", "What does ERR_SOCKET_ZX81 mean?", "--mode", "passages", "-k", "2", "--ctx", "1024",
                   "--max-tokens", "8", "--json", env=env)
        assert ask.returncode == 0, ask.stderr
        answer = json.loads(ask.stdout)
        assert answer["text"].strip() and str(small / "notes.md") in [s["source"] for s in answer["sources"]]
        assert ingest.poll() is None, "the ingest ended before the questions: nothing was tested (enlarge the corpus)"
    finally:
        out = ingest.communicate(timeout=600)[0].decode()
    assert ingest.returncode == 0, out
    status = json.loads(_rag("status", "--json", env=env).stdout)
    assert status["documents"] == 41 and status["dense_chunks"] == status["chunks"]
    summary = _rag("summarize", str(small / "notes.md"), "--max-tokens", "5", "--ctx", "1024", "--json", env=env)
    assert summary.returncode == 0, summary.stderr
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT source FROM results").fetchall() == [(str(small / "notes.md"),)]
    assert not (store_dir / "jobs.sqlite").exists() and not (store_dir / "catalog.sqlite").exists()
