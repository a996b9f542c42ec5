"""The store when its disk is full or its Chroma server is stopped: exit 4 with a message that says so,
never a traceback and never a hang. Real full disks (a small tmpfs), a real Chroma server stopped with
SIGSTOP, and fault-injecting twins for machines where a tmpfs cannot be mounted."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from support.full_disk import small_disk
from pipeline import disk
from pipeline.errors import StoreError
from pipeline.store import failures


def rag(*args, env, timeout=180):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=timeout)


def _outcome(ran) -> tuple[int, str]:
    assert "Traceback" not in ran.stderr, ran.stderr
    last = (ran.stderr.strip().splitlines() or [""])[-1]
    if ran.returncode:
        assert last.startswith("Error: "), ran.stderr
    return ran.returncode, last


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory, model_home):
    """A store holding the test corpus, built once on an ordinary disk."""
    from conftest import CORPUS

    root = tmp_path_factory.mktemp("ref")
    docs = root / "docs"
    docs.mkdir()
    for name, text in CORPUS.items():
        (docs / name).write_text(text)
    env = {"RAG_HOME": str(model_home), "RAG_STORE_PATH": str(root / "store")}
    assert rag("ingest", str(docs), env=env).returncode == 0
    return root / "store"


def test_reading_a_store_on_a_full_disk_is_exit_4_not_a_traceback(tmp_path, reference_store, model_home):
    seen = {}
    with small_disk(tmp_path / "disk") as disk:
        for free_kb in (0, 8, 24, 40, 56, 80, 160, 1024):
            shutil.rmtree(disk.path / "store", ignore_errors=True)
            disk.empty()
            shutil.copytree(reference_store, disk.path / "store")
            disk.fill(free=free_kb * 1024)
            env = {"RAG_HOME": str(model_home), "RAG_STORE_PATH": str(disk.path / "store"),
                   "RAG_CACHE_ENABLED": "false"}
            for command in (["status"], ["search", "--json", "tomato"]):
                code, last = _outcome(rag(*command, env=env))
                assert code in (0, 4), last
                if code == 4:
                    assert "is full" in last and "Nothing committed was lost" in last, last
                seen[(free_kb, command[0])] = code
    assert seen[(0, "status")] == seen[(0, "search")] == 4  # the fault was there
    assert seen[(1024, "status")] == seen[(1024, "search")] == 0  # and with room, the store reads


def test_chroma_failing_on_open_or_read_is_a_store_error(fake_pipeline, corpus, monkeypatch):
    """The twin of the full-disk test: the errors embedded Chroma raises there, injected."""
    import chromadb
    from chromadb.api.models.Collection import Collection
    from chromadb.errors import InternalError

    rag = fake_pipeline()
    rag.ingest([corpus])
    full = InternalError("error returned from database: (code: 13) database or disk is full")

    def raise_full(*a, **kw):
        raise full

    with monkeypatch.context() as m:
        m.setattr(chromadb, "PersistentClient", raise_full)
        with pytest.raises(StoreError, match="is full"):
            fake_pipeline().status()
    with monkeypatch.context() as m:
        m.setattr(Collection, "count", raise_full)
        with pytest.raises(StoreError, match="is full"):
            rag.status()
    with monkeypatch.context() as m:
        from pipeline.store import exact

        m.setattr(exact, "EXACT_LIMIT", 0)  # a search too large for the catalog's vectors: Chroma's index answers
        m.setattr(Collection, "query", lambda *a, **kw: (_ for _ in ()).throw(InternalError("segment gone")))
        with pytest.raises(StoreError, match="reading the store .* failed: segment gone"):
            rag.search("tomato")
    assert rag.search("tomato")  # nothing was lost


def test_a_full_disk_is_named_whatever_words_chroma_uses(tmp_path, monkeypatch):
    """Chroma's compaction reports a full disk as "Failed to apply logs to the metadata segment"."""
    compaction = Exception("Error in compaction: Failed to apply logs to the metadata segment")
    store = tmp_path / "store"
    store.mkdir()
    assert "is full" not in str(failures.storage_error(compaction, store))  # plenty of room: not the disk
    real = os.statvfs

    def nearly_full(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 2, 2, st.f_files, st.f_ffree, st.f_favail,
                                  st.f_flag, st.f_namemax))
    monkeypatch.setattr(disk.os, "statvfs", nearly_full)
    err = failures.storage_error(compaction, store)
    assert "is full" in str(err) and "Failed to apply logs" in str(err)
    assert "is full" in str(failures.storage_error(OSError(errno.ENOSPC, "No space left on device"), store))


def test_a_full_disk_during_ingest_says_the_disk_is_full(tmp_path, model_home):
    """Small chunks fill the disk with Chroma's records first: its compaction fails, in its own words."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"doc{i}.md").write_text(f"# Report {i}\n\n" + " ".join(
            f"Sensor {i}-{j} read {j * 37 % 1000} units at hour {j % 24}." for j in range(400)))
    with small_disk(tmp_path / "disk", size="8m") as disk:
        disk.fill(free=1500 * 1024)
        env = {"RAG_HOME": str(model_home), "RAG_STORE_PATH": str(disk.path / "store"),
               "RAG_CACHE_ENABLED": "false", "RAG_CHUNKING_SIZE": "32", "RAG_CHUNKING_OVERLAP": "0"}
        code, last = _outcome(rag("ingest", str(docs), env=env, timeout=600))
    assert code == 4 and "is full" in last and "Nothing committed was lost" in last, last


def test_a_stopped_chroma_server_fails_within_store_timeout(tmp_path, model_home):
    from conftest import CORPUS
    from devtools.servers import ChromaServer

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in CORPUS.items():
        (docs / name).write_text(text)
    server = ChromaServer(tmp_path / "chroma").start()
    env = {"RAG_HOME": str(model_home), "RAG_STORE_PATH": str(tmp_path / "store"), "RAG_STORE_URL": server.url,
           "RAG_STORE_TIMEOUT": "2"}
    try:
        assert rag("ingest", str(docs), env=env).returncode == 0
        os.kill(server.proc.pid, signal.SIGSTOP)  # frozen: it accepts connections and never answers
        t0 = time.monotonic()
        code, last = _outcome(rag("status", env=env, timeout=120))  # counts the server's vectors
        assert code == 4 and "store.timeout" in last and "2 s" in last, last
        assert time.monotonic() - t0 < 60
        # A search this small is ranked from the catalog's vectors: it needs no answer from the server.
        found = rag("search", "tomato", "--json", env=env, timeout=120)
        assert found.returncode == 0, found.stderr
        assert json.loads(found.stdout)["hits"][0]["source"].endswith("page.html")
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
