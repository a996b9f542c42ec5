"""Kill -9 while section states are written: during ``warm_sections`` (after a state is saved, crash point
``SECTION_SAVED``) and during a composed answer (after a section is placed, ``COMPOSING``; see
:mod:`pipeline._testhooks`). The next run uses what was saved or discards it, and answers as a run
that was never interrupted: never a wrong answer."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

from support.composing import TOPICS, ingest, moe, pipeline, settings, shelf  # noqa: F401 - fixtures

TESTS = Path(__file__).resolve().parents[1]  # tests/: the helpers' package
QUESTION = "Which valve has code VAL-020, and what does sensor unit 9 report?"

SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from support.fakes import HashEmbedder
from pipeline import Pipeline
overrides, what = json.loads(sys.argv[1]), sys.argv[2]
with Pipeline.from_config(overrides=overrides, embedder=HashEmbedder()) as rag:
    out = rag.warm_sections() if what == "warm" else rag.ask({question!r}).to_dict()
print(json.dumps(out))
"""


def run(model, tmp_path: Path, what: str, *, kill: tuple[str, int] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_TEST_KILL_")}
    if kill is not None:
        env["RAG_TEST_KILL_" + kill[0]] = str(kill[1])
    code = SCRIPT.format(tests=str(TESTS), question=QUESTION)
    return subprocess.run([sys.executable, "-c", code, json.dumps(settings(model, tmp_path)), what], env=env,
                          capture_output=True, text=True, timeout=600)


def reference(model, tmp_path: Path) -> str:
    """The answer of a run never interrupted, composed with a cache of its own."""
    with pipeline(model, tmp_path, **{"cache.path": str(tmp_path / "reference-cache")}) as rag:
        return rag.ask(QUESTION).text


@pytest.mark.slow
def test_kill_during_warm_sections_keeps_what_was_saved(moe, tmp_path, shelf):  # noqa: F811
    ingest(moe, tmp_path, shelf)
    killed = run(moe, tmp_path, "warm", kill=("SECTION_SAVED", 3))
    assert killed.returncode == -9, killed.stderr
    with pipeline(moe, tmp_path) as rag:
        resumed = rag.warm_sections()
    assert resumed["cached"] == 3 and resumed["saved"] == resumed["sections"] - 3
    with pipeline(moe, tmp_path) as rag:
        answer = rag.ask(QUESTION)
    assert answer.stats.composed_sections == len(answer.stats.sections) and answer.stats.states_saved == 0
    assert answer.text == reference(moe, tmp_path)


@pytest.mark.slow
def test_kill_during_a_composed_answer_never_gives_a_wrong_one(moe, tmp_path, shelf):  # noqa: F811
    ingest(moe, tmp_path, shelf)
    killed = run(moe, tmp_path, "ask", kill=("COMPOSING", 2))  # two sections placed (and saved), then killed
    assert killed.returncode == -9, killed.stderr
    done = run(moe, tmp_path, "ask")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    st = answer["stats"]
    assert st["cache"] == "composed" and st["composed_sections"] == 2  # what the killed run saved
    assert answer["text"] == reference(moe, tmp_path)
    again = run(moe, tmp_path, "ask")
    assert json.loads(again.stdout)["stats"]["composed_sections"] == len(st["sections"])
    assert json.loads(again.stdout)["text"] == answer["text"]
