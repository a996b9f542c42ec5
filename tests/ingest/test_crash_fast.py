"""Crash safety with real processes and the fake embedder: ``kill -9`` mid-ingest and mid-replacement.

The store's commit protocol does not depend on the embedder; ``tests/support/fake_ingest.py`` runs the ingest
in its own process with a slowed fake so that the kill lands mid-way. ``test_crash.py`` (slow) does
the same through ``rag ingest`` on the real embedder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_crash import N_DOCS, _check_consistent, _committed, _corpus, _kill_after

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fake_ingest.py"
DELAY = "0.02"  # seconds per embedded chunk


def _spawn(root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(root), DELAY], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=dict(os.environ))


@pytest.mark.parametrize("committed,extra", [(0, 0.0), (2, 0.03)])
def test_kill_9_mid_ingest_then_resume(fake_pipeline, tmp_path, tmp_store, committed, extra):
    root = _corpus(tmp_path / "docs")
    _kill_after(_spawn(root), tmp_store, committed, extra)
    rag = fake_pipeline()
    partial = 0
    if (tmp_store / "catalog.sqlite").exists() and rag.status().exists:
        _check_consistent(rag, root)  # whatever is visible after the crash is whole
        partial = rag.status().documents
    report = rag.ingest([root])
    assert partial < N_DOCS, "the ingest finished before it was killed: nothing was tested"
    assert report.count("new") == N_DOCS - partial and report.count("unchanged") == partial
    _check_consistent(rag, root)
    st = rag.status()
    assert st.documents == N_DOCS and st.dense_chunks == st.chunks


@pytest.mark.slow
def test_kill_9_while_replacing_documents_keeps_old_or_new_never_both(fake_pipeline, tmp_path, tmp_store):
    root = _corpus(tmp_path / "docs")
    rag = fake_pipeline()
    rag.ingest([root])
    _corpus(root, version="v2")  # every file changes
    started = time.time()
    _kill_after(_spawn(root), tmp_store, 2, 0.03, since=started)
    _check_consistent(rag, root)
    assert _committed(tmp_store, started) < N_DOCS
    for hit in rag.search("Document paragraph quick brown fox", top_k=30):
        assert (" v1 " in hit.text) != (" v2 " in hit.text)
    report = rag.ingest([root])
    assert report.count("changed") >= 1 and report.count("changed") + report.count("unchanged") == N_DOCS
    _check_consistent(rag, root)
    assert all(" v2 " in h.text for h in rag.search("quick brown fox", top_k=30))


def test_a_second_lock_in_the_same_process_names_this_process_not_another(tmp_path):
    """Two Pipelines on one embedded store in one process: the second waits, then says who holds it."""
    from pipeline.errors import StoreBusyError
    from pipeline.store.lock import StoreLock

    with StoreLock(tmp_path, wait=0.2):
        with pytest.raises(StoreBusyError, match="another Pipeline in this process") as caught:
            StoreLock(tmp_path, wait=0.2).acquire()
    assert "another rag process" not in str(caught.value)
    with StoreLock(tmp_path, wait=0.2):  # released: free again
        pass
