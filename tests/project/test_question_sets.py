"""The question sets under benchmarks/eval: each loads as `rag eval` reads it, and the held-out and
man-page sets keep the promises the docs make of them (frozen with their date and passage; an
evidence phrase that points at exactly one place of its manual)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeline.retrieval.evaluate import load_questions

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "benchmarks" / "eval"
SETS = sorted(EVAL.glob("*.jsonl"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


@pytest.fixture(scope="module")
def heldout():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import heldout
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return heldout


@pytest.mark.parametrize("path", SETS, ids=[p.name for p in SETS])
def test_every_set_loads_with_unique_ids(path):
    questions = load_questions(path)
    ids = [q.id for q in questions]
    assert len(ids) == len(set(ids)) and len(ids) >= 14


def test_every_set_is_run_and_only_the_two_manuals_are_held_out(heldout):
    listed = {qfile.name: development for _, qfile, _, development in heldout.QUESTION_SETS}
    assert set(listed) == {p.name for p in SETS}
    assert {name for name, dev in listed.items() if not dev} == {"heldout-gnuplot.jsonl", "heldout-asymptote.jsonl"}


@pytest.mark.parametrize("name", ["heldout-gnuplot.jsonl", "heldout-asymptote.jsonl", "manpages.jsonl"])
def test_frozen_sets_carry_their_date_and_passage(name):
    for line in _lines(EVAL / name):
        assert line["_written"][:4] == "2026" and line["_passage"].strip(), line["id"]


def test_man_page_evidence_points_at_one_place_and_most_questions_are_paraphrased(heldout):
    texts = {p.name: _norm(p.read_text(encoding="utf-8")) for p in (EVAL / "manpages").glob("*.txt")}
    lines = _lines(EVAL / "manpages.jsonl")
    for line in lines:
        text = texts[line["source"]]
        assert text.count(_norm(line["evidence"])) == 1, line["id"]
        assert _norm(line["evidence"]) in _norm(line["_passage"]) and _norm(line["_passage"]) in text, line["id"]
    shared = [heldout.content_words(x["question"]) & heldout.content_words(x["_passage"]) for x in lines]
    assert sum(len(s) <= 1 for s in shared) >= len(lines) * 2 // 3



def test_the_section_size_benchmark_chooses_on_development_sets_and_recuts_from_stored_chunks(
        heldout, make_pipeline, tmp_path):
    """By default it runs only development sets (held-out ones are added to report, never to choose);
    a store it copies has its sections cut again at the size under test from the stored chunks, and
    packing uses them, while the original keeps its own."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import section_size
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert set(section_size.DEVELOPMENT) == {n for n, _, _, dev in heldout.QUESTION_SETS if dev}
    assert set(section_size.HELD_OUT) == {"gnuplot", "asymptote"}
    assert not set(section_size.DEVELOPMENT) & set(section_size.HELD_OUT)

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "manual.md").write_text("# Pump manual\n\n" + "\n\n".join(
        f"Paragraph {i}: pump unit {i} reports a pressure of {i * 7} bar after the morning check." for i in range(120)))
    small = {"store__path": str(tmp_path / "store"), "chunking__size": 64, "chunking__overlap": 8,
             "chunking__section_tokens": 256, "cache__enabled": False}

    def targets(store_path):
        with make_pipeline(**{**small, "store__path": str(store_path)}).store() as store:
            found = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in store.documents().items()])
        return {x.target for secs in found.values() for x in secs}

    make_pipeline(**small).ingest([docs])
    assert targets(tmp_path / "store") == {256}
    section_size.recut_copy(tmp_path / "store", tmp_path / "copy", 512)
    assert targets(tmp_path / "copy") == {512}
    copy = make_pipeline(**{**small, "store__path": str(tmp_path / "copy"), "chunking__section_tokens": 512})
    prompt = copy.prompt("What pressure does pump unit 7 report?")
    assert prompt.sections and {p.section.target for p in prompt.sections} == {512}
    assert targets(tmp_path / "copy") == {512} and targets(tmp_path / "store") == {256}


def test_the_man_page_shelf_renders_once_and_names_what_it_left_off(heldout, tmp_path, monkeypatch):
    monkeypatch.setattr(heldout, "SHELF_MANPAGES", ("ls", "no-such-page-anywhere"))
    said = []
    folder = heldout.man_shelf(cache=tmp_path, log=said.append)
    assert [f.name for f in folder.glob("*.txt")] == ["ls.txt"]
    assert "--all" in (folder / "ls.txt").read_text() and "\b" not in (folder / "ls.txt").read_text()
    assert said == ["warning: man pages not on this system, left off the shelf: no-such-page-anywhere"]
    monkeypatch.setattr(heldout, "SHELF_MANPAGES", ("cp",))
    assert heldout.man_shelf(cache=tmp_path, log=said.append) == folder and not (folder / "cp.txt").exists()
