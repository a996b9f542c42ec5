"""``kill -9`` a real ``rag summarize`` mid-map, mid-reduce and between documents; rerun; same output.

The job runner's crash point (``RAG_TEST_KILL_AFTER_COMMITS=N``, see :mod:`pipeline._testhooks`)
makes the process SIGKILL itself right after its Nth commit, so each kill lands at an
exact point of the job. Every rerun must add exactly the commits that were missing
(nothing finished is recomputed or rewritten), and the final files must hold the same
documents, prompts, methods and counts as an uninterrupted run in another store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

KILL_HOOK = "RAG_TEST_KILL_AFTER_COMMITS"  # the crash point after each committed unit or result

# A small context so that the long document needs several sections; chunks small enough to fit one.
N_CTX = 224
MAX_TOKENS = "5"
# Layouts hold back the larger of ask.max_tokens and summarize.max_tokens (up to a quarter of the context).
ENV = {"RAG_ENGINE_N_CTX": str(N_CTX), "RAG_CHUNKING_SIZE": "48", "RAG_CHUNKING_OVERLAP": "8",
       "RAG_CACHE_MIN_TOKENS": "16", "RAG_ASK_MAX_TOKENS": MAX_TOKENS, "RAG_SUMMARIZE_MAX_TOKENS": MAX_TOKENS,
       # Exact prefill: a composed map prompt would depend on the section states a killed run left.
       "RAG_ASK_COMPOSE": "off"}
PROMPTS = ["-p", "Summarise in one sentence.", "-p", "Name the topics."]


def write_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    topics = ["tomatoes and sunlight", "llama.cpp prefill batches", "Chroma persistent clients",
              "the Rhine river in spring", "prime numbers below fifty", "violins and their strings"]
    parts = [f"Part {i + 1} is about {t}. " + " ".join(f"Fact {j} on {t} says the value is {i * 10 + j}."
                                                   for j in range(7)) for i, t in enumerate(topics)]
    (root / "a_long.md").write_text("# Long notes\n\n" + "\n\n".join(parts) + "\n")
    (root / "b_short.txt").write_text("The error code ERR_SOCKET_ZX81 appears when the server is unreachable.\n")
    return root


def run_summarize(docs: Path, base: Path, *, kill: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != KILL_HOOK}
    env.update(ENV)
    env.update({"RAG_STORE_PATH": str(base / "store"), "RAG_CACHE_PATH": str(base / "cache")})
    if kill is not None:
        env[KILL_HOOK] = str(kill)
    return subprocess.run([sys.executable, "-m", "pipeline", "summarize", str(docs), *PROMPTS, "--max-tokens",
                           MAX_TOKENS, "--out", str(base / "md"), "--jsonl", str(base / "out.jsonl"), "--json"],
                          env=env, capture_output=True, text=True, timeout=900)


def commits(base: Path) -> list[tuple[str, str, float]]:
    """Every commit in the job database as (kind, source or doc key, time), in commit order."""
    db = sqlite3.connect(base / "store" / "jobs.sqlite")
    try:
        rows = [(k, d, t) for k, d, t in db.execute("SELECT kind, doc_key, finished_at FROM units")]
        rows += [("result", s, t) for s, t in db.execute("SELECT source, finished_at FROM results")]
    finally:
        db.close()
    return sorted(rows, key=lambda r: r[2])


def unit_texts(base: Path) -> dict[str, str]:
    db = sqlite3.connect(base / "store" / "jobs.sqlite")
    try:
        return dict(db.execute("SELECT key, text FROM units"))
    finally:
        db.close()


def shape(base: Path) -> list[dict]:
    """The JSONL records without their generated text: what a resumed job must reproduce exactly."""
    rows = [json.loads(line) for line in (base / "out.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "summary"} for r in rows]


def outputs(base: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in sorted((base / "md").iterdir())}
    files["out.jsonl"] = (base / "out.jsonl").read_bytes()
    return files


def test_kill_9_mid_map_mid_reduce_and_between_documents_then_resume_without_recomputing(tmp_path, store_dir):
    docs = write_corpus(tmp_path / "docs")
    ref = run_summarize(docs, tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    report = json.loads(ref.stdout)
    assert report["methods"] == {"map-reduce": 2, "whole": 2}
    sequence = commits(tmp_path / "ref")
    kinds = [k for k, _, _ in sequence]
    assert len(sequence) == report["units_computed"] + 4  # every unit, then 2 documents x 2 prompts

    # The long document, several times the context, went map-reduce; every run of its sections was
    # summarised for each prompt, and reduce steps (one level or more, as the partials' lengths need) combined them.
    from pipeline import Pipeline

    with Pipeline.from_config() as rag:
        assert rag.engine.count_tokens((docs / "a_long.md").read_text()) >= 3 * N_CTX
    long = [s for s in report["summaries"] if s["source"].endswith("a_long.md")]
    assert [s["method"] for s in long] == ["map-reduce"] * 2
    n_sections = long[0]["sections"]
    assert n_sections >= 4 and all(s["sections"] == n_sections for s in long)
    assert all(s["reduce_steps"] >= 1 and s["levels"] >= 1 for s in long)
    n_maps = kinds.count("map")
    # map steps run over runs of consecutive sections that fit one prompt: one per run and prompt
    assert n_maps % 2 == 0 and 4 <= n_maps // 2 <= n_sections and kinds.count("reduce") == sum(s["reduce_steps"] for s in long)
    long_doc_key = sequence[0][1]
    mid_map = 3
    mid_reduce = kinds.index("reduce") + 1  # the first reduce step done, its result and the others not
    between = max(i for i, k in enumerate(kinds) if k == "result" and sequence[i][1].endswith("a_long.md")) + 1
    assert mid_map < n_maps < mid_reduce < between < len(sequence)
    assert sequence[between][1] != long_doc_key and sequence[between][0] == "whole"  # next: the short document

    crash = tmp_path / "crash"
    done = 0
    kept: dict[str, str] = {}
    for point in (mid_map, mid_reduce, between):
        proc = run_summarize(docs, crash, kill=point - done)
        assert proc.returncode == -9, proc.stderr
        assert len(commits(crash)) == point  # nothing committed before was computed again
        now = unit_texts(crash)
        assert {k: now[k] for k in kept} == kept  # a committed unit is never rewritten
        kept, done = now, point
    final = run_summarize(docs, crash)
    assert final.returncode == 0, final.stderr
    resumed = json.loads(final.stdout)
    assert len(commits(crash)) == len(sequence)
    remaining_units = sum(1 for k in kinds[between:] if k != "result")
    assert resumed["units_computed"] == resumed["generate_calls"] == remaining_units
    assert resumed["results_reused"] == 2  # the long document's two summaries came from the database
    assert {k: unit_texts(crash)[k] for k in kept} == kept
    # The same units, documents, prompts and methods as an uninterrupted run. The texts are greedy
    # answers, and the same as its answers only where llama.cpp computes the same bits: a unit computed
    # after a restart starts from a restored state rather than the memory a long run kept.
    assert shape(crash) == shape(tmp_path / "ref")
    assert set(outputs(crash)) == set(outputs(tmp_path / "ref"))
    assert all(r["summary"] for r in map(json.loads, (crash / "out.jsonl").read_text().splitlines()))
    before = outputs(crash)
    again = run_summarize(docs, crash)  # a finished job: nothing computed, the same bytes
    assert again.returncode == 0 and json.loads(again.stdout)["units_computed"] == 0
    assert outputs(crash) == before
