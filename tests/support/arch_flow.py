"""The product's main path on one generated architecture, for the per-architecture test modules.

``rag ingest`` -> ``rag ask`` with the collection whole -> a second, different question (a new
engine: it restores the documents' state from disk and prefills only itself) -> the first
question again (token for token the first answer) -> ``rag summarize`` -> ``rag ask`` over
sections (a context too small for the collection) -> a second *process* asking the first
question, restoring the state the first process saved.

The generated models' text is noise: the checks are on behaviour and counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from pipeline.cli import cli

TOPICS = ("pump", "valve", "sensor")
QUESTIONS = ("Which pump unit reports level 14?", "What code does the valve manual give for unit 2?")


def write_docs(folder: Path, paragraphs: int = 6) -> Path:
    """Three short manuals of numbered paragraphs (about 400 tokens each for a byte vocabulary)."""
    folder.mkdir(parents=True, exist_ok=True)
    for topic in TOPICS:
        paras = [f"The {topic} unit {i} reports level {i * 7} and code {topic[:3].upper()}-{i:03d}."
                 for i in range(paragraphs)]
        (folder / f"{topic}s.md").write_text(f"# {topic.title()} manual\n\n" + "\n\n".join(paras) + "\n")
    return folder


def settings_env(monkeypatch, model: Path, *, n_ctx: int = 4096) -> dict[str, str]:
    """The environment of every command: the generated generator, short answers, small sections."""
    env = {"RAG_MODELS_GENERATOR": str(model), "RAG_ENGINE_N_CTX": str(n_ctx), "RAG_ASK_MAX_TOKENS": "4",
           "RAG_SUMMARIZE_MAX_TOKENS": "4", "RAG_CACHE_MIN_TOKENS": "32", "RAG_CHUNKING_SIZE": "64",
           "RAG_CHUNKING_OVERLAP": "8", "RAG_CHUNKING_SECTION_TOKENS": "128", "RAG_ENGINE_THREADS": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def cli_json(*args: str) -> dict:
    out = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def ask(question: str, *args: str) -> dict:
    return cli_json("ask", question, *args)


def second_process_ask(question: str) -> dict:
    """``rag ask --json`` in a new Python process, with this test's environment."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", "ask", question, "--json"], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def run_main_path(model: Path, tmp_path: Path, monkeypatch) -> dict:
    """Run the whole path on ``model``, asserting as it goes; returns the answers by step for more checks."""
    settings_env(monkeypatch, model)
    docs = write_docs(tmp_path / "docs")
    ingest = CliRunner().invoke(cli, ["ingest", str(docs)], catch_exceptions=False)
    assert ingest.exit_code == 0, ingest.output

    first = ask(QUESTIONS[0])
    st = first["stats"]
    assert st["mode"] == "whole" and st["cache"] == "miss" and st["states_saved"] >= 1, st
    assert len(st["sections"]) == len(TOPICS)  # every document, whole

    other = ask(QUESTIONS[1])["stats"]  # a new engine: the documents' state comes from disk
    assert other["mode"] == "whole" and other["cache"] == "disk", other
    prefix = sum(x["tokens"] for x in other["sections"])
    assert other["cached_tokens"] > prefix  # the head and every document
    question_tokens = other["prefill_tokens"]  # only the question and the template's tail: a byte a token
    assert question_tokens == other["prompt_tokens"] - other["cached_tokens"] < len(QUESTIONS[1]) + 64, other

    again = ask(QUESTIONS[0])
    assert again["stats"]["cache"] == "disk" and again["text"] == first["text"]  # token-exact from the state

    jsonl = tmp_path / "summaries.jsonl"
    summ = CliRunner().invoke(cli, ["summarize", "--jsonl", str(jsonl)], catch_exceptions=False)
    assert summ.exit_code == 0, summ.output
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sorted(Path(r["source"]).name for r in rows) == sorted(f"{t}s.md" for t in TOPICS)

    sections = ask(QUESTIONS[0], "--ctx", "1024")["stats"]
    assert sections["mode"] == "sections" and 0 < len(sections["sections"]) < 3 * len(TOPICS), sections

    later = second_process_ask(QUESTIONS[0])
    assert later["stats"]["cache"] == "disk" and later["stats"]["prefill_tokens"] < len(QUESTIONS[0]) + 64, later
    assert later["text"] == first["text"]
    return {"first": first, "again": again, "later": later, "sections": sections}
