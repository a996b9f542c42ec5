"""`rag summarize` outputs and processes: a full disk under --jsonl or --out is one message (exit 4, as for
the store), an output path that cannot be used is bad input (exit 2), --jsonl is
replaced whole (a killed rerun leaves the previous file), output names never collide, and two
processes on one job share its units instead of each computing all of them."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from support.full_disk import small_disk
from pipeline.errors import DiskFullError, InputError
from pipeline._testhooks import PREFIX
from pipeline.summarize.outputs import Outputs, Summary, output_names
from support.summarize_fakes import FakeEngine, doc_chunks, fake_job


def rag(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def _summary(source: str, i: int = 1) -> Summary:
    return Summary(source, "h", "Summarise.", i, text=f"About {source}.", method="whole")


# -- names -------------------------------------------------------------------------------------------


def test_output_names_never_collide():
    names = output_names(["/x/p/q/r.md", "/x/p__q/r.md", "/x/s/r.md"])
    assert len(set(names.values())) == 3
    assert names["/x/s/r.md"] == "s__r.md"  # names that do not collide stay readable
    assert names == output_names(["/x/p/q/r.md", "/x/p__q/r.md", "/x/s/r.md"])  # stable from run to run


def test_two_documents_that_once_shared_an_output_file_get_one_each(tmp_path):
    sources = ["/x/p/q/r.md", "/x/p__q/r.md"]
    out = Outputs(out_dir=tmp_path / "md", jsonl=None, sources=sources, n_prompts=1)
    for s in sources:
        out.write(_summary(s))
    out.finish()
    files = sorted((tmp_path / "md").iterdir())
    assert len(files) == 2 and {f.read_text().split("- source: ")[1].split("\n")[0] for f in files} == set(sources)


# -- the JSON Lines file --------------------------------------------------------------------------------


class _FullDisk:
    """A file object on a disk with no room: writes are buffered, flush and close fail with ENOSPC."""

    def __init__(self):
        self.closed = False

    def write(self, text):
        return len(text)

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.closed = True
        raise OSError(errno.ENOSPC, "No space left on device")


def test_jsonl_on_a_full_disk_is_one_disk_full_error(tmp_path, monkeypatch):
    """The fault-injecting twin of the tmpfs test: the error is raised once (a full disk, exit 4, not bad
    input), and closing stays quiet."""
    import pipeline.summarize.outputs as summary

    monkeypatch.setattr(summary, "open", lambda *a, **kw: _FullDisk(), raising=False)
    (tmp_path / "s.jsonl").write_text("previous\n")
    out = Outputs(out_dir=None, jsonl=tmp_path / "s.jsonl", sources=["/d/a.md"], n_prompts=1)
    with pytest.raises(DiskFullError, match=r"^cannot write the output: the disk holding .* is full \(.*No space "
                                            r"left on device\)") as caught:
        out.write(_summary("/d/a.md"))
    assert caught.value.exit_code == 4
    assert caught.value.__suppress_context__  # one message, not a chain of tracebacks
    out.close()  # no second error
    out.finish()
    assert (tmp_path / "s.jsonl").read_text() == "previous\n"  # the previous file stays whole


def test_an_output_path_that_cannot_be_used_is_bad_input(tmp_path):
    (tmp_path / "a-file").write_text("x\n")
    with pytest.raises(InputError, match="cannot write the output") as caught:
        Outputs(out_dir=tmp_path / "a-file", jsonl=None, sources=["/d/a.md"], n_prompts=1)
    assert not isinstance(caught.value, DiskFullError) and caught.value.exit_code == 2


def test_outputs_on_a_real_full_disk_are_exit_4_with_one_line(tmp_path, store_dir):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Tomato plants need full sun and regular watering.\n")
    args = ["summarize", str(docs), "--max-tokens", "4", "--ctx", "1024"]
    with small_disk(tmp_path / "disk", size="1m") as disk:
        disk.fill(free=0)
        ran = rag(*args, "--jsonl", str(disk.path / "out" / "s.jsonl"))
        out_dir = rag(*args, "--out", str(disk.path / "md"))
    for r in (ran, out_dir):
        assert r.returncode == 4, r.stderr
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert lines[-1].startswith("Error: cannot write the output: the disk holding") and sum(
            ln.startswith("Error:") for ln in lines) == 1, r.stderr


def test_a_killed_rerun_leaves_the_previous_jsonl_whole(tmp_path, store_dir):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(8):
        (docs / f"n{i}.txt").write_text(f"Note {i}: the pump {i} runs at {i * 10 + 5} litres a minute.\n")
    jsonl = tmp_path / "s.jsonl"
    args = ["summarize", str(docs), "--max-tokens", "4", "--ctx", "1024", "--jsonl", str(jsonl)]
    assert rag(*args).returncode == 0
    complete = jsonl.read_bytes()
    assert len(complete.splitlines()) == 8
    killed = rag(*args, "--restart", env={PREFIX + "AFTER_COMMITS": "3"})  # SIGKILLed after its third commit
    assert killed.returncode == -9
    assert jsonl.read_bytes() == complete
    assert rag(*args).returncode == 0 and len(jsonl.read_bytes().splitlines()) == 8  # the next run finishes it


# -- two processes on one job ---------------------------------------------------------------------------


class _SlowEngine(FakeEngine):
    """The fake engine, taking a while per prompt: two workers are really at work at once."""

    def generate(self, tokens, **kw):
        time.sleep(0.05)
        return super().generate(tokens, **kw)


def test_two_workers_on_one_job_compute_each_unit_once(tmp_path):
    docs = {f"/d/doc{i}.txt": doc_chunks(12) for i in range(6)}
    alone, alone_jobs, alone_engine = fake_job(tmp_path / "alone", docs, n_ctx=160, prompts=("One.", "Two."))
    with alone_jobs:
        expected = {(s.source, s.prompt_index): s.text for s in alone.run()}
    units = len(alone_engine.prompts)
    assert units > 2 * len(docs)  # map-reduce: several units per document

    engines = [_SlowEngine(160), _SlowEngine(160)]
    results: list[dict] = [{}, {}]

    def work(i: int) -> None:  # a job store connection of its own, as a process has
        job, jobs, _ = fake_job(tmp_path / "shared", docs, n_ctx=160, prompts=("One.", "Two."), engine=engines[i])
        with jobs:
            results[i] = {(s.source, s.prompt_index): s.text for s in job.run()}

    (tmp_path / "shared").mkdir()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results[0] == results[1] == expected  # each reports every summary, the same ones
    computed = [len(engine.prompts) for engine in engines]
    assert sum(computed) == units, computed  # together they did the work once
    assert all(computed), computed  # and both took part


def test_two_rag_summarize_processes_share_a_job(tmp_path, store_dir):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"n{i}.txt").write_text(f"Note {i}: valve {i} opens at {i * 3 + 2} bar and shuts at {i + 9}.\n")
    args = ["summarize", str(docs), "--max-tokens", "8", "--ctx", "1024", "--json"]
    assert rag("ingest", str(docs)).returncode == 0
    env = {"RAG_STORE_WAIT": "120"}
    procs = [subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **env}) for _ in range(2)]
    reports = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [len(r["summaries"]) for r in reports] == [6, 6]
    assert sum(r["units_computed"] for r in reports) == 6, [r["units_computed"] for r in reports]
    texts = [{s["source"]: s["summary"] for s in r["summaries"]} for r in reports]
    assert texts[0] == texts[1]


def test_a_crashed_processs_claim_neither_delays_nor_reorders_the_rerun(tmp_path):
    import socket

    docs = {f"/d/doc{i}.txt": doc_chunks(12) for i in range(3)}
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process of this machine that has ended, holding a live lease on the second document
    with jobs:
        second = job.doc_key(job.documents[1])
        assert jobs.claim(job.job_id, [second], worker=f"{socket.gethostname()}:{gone.pid}:1", lease=600) == second
        t0 = time.monotonic()
        out = [s.source for s in job.run()]
    assert out == sorted(docs)  # the job's order, as an uninterrupted run writes it
    assert time.monotonic() - t0 < 30  # not the lease's 600 s
