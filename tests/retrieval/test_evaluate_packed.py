"""``rag eval --packed``: is the answer inside the prompt ``rag ask`` builds? (fakes: no model loads)

Whole mode packs every document, so every answer is in; sections mode packs the sections
retrieval ranks best, so an answer is in exactly when its section is chosen, whatever the
rank of any one chunk.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from support.fakes import EchoGenerator
from pipeline.cli import cli

TOPICS = ["giraffes sleep standing up for short naps", "zebras graze on tall grass at dawn",
          "owls hunt mice by sound in the dark", "salmon swim upstream to spawn in autumn",
          "bees dance to tell the hive where flowers are", "camels store fat in their humps",
          "penguins huddle together against the polar wind", "bats find insects by echolocation",
          "octopuses change colour to hide from sharks", "elephants remember water holes for decades"]


def shelf(folder):
    folder.mkdir()
    for i, topic in enumerate(TOPICS):
        filler = " ".join(f"{topic.split()[0]} note {j}." for j in range(12))
        (folder / f"animal{i:02d}.md").write_text(f"# Animal {i}\n\n{topic.capitalize()}. {filler}\n", encoding="utf-8")
    return folder


def questions(path):
    lines = [{"id": "hit", "question": "Where do owls hunt mice?", "source": "animal02.md",
              "evidence": "owls hunt mice by sound"},
             {"id": "miss", "question": "xylophone quartet rehearsal schedule", "source": "animal09.md",
              "evidence": "elephants remember water holes"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_sections_mode_holds_the_answer_only_when_its_section_is_packed(fake_pipeline, tmp_path):
    rag = fake_pipeline(generator=EchoGenerator(n_ctx=360), ask__max_tokens=16, chunking__section_tokens=64)
    rag.ingest([shelf(tmp_path / "docs")])
    report = rag.evaluate(questions(tmp_path / "q.jsonl"), settings=["hybrid"], packed=True)
    by_id = {r["id"]: r for r in report.packed}
    assert {r["mode"] for r in report.packed} == {"sections"}
    assert by_id["hit"]["in_prompt"] is True
    assert by_id["miss"]["in_prompt"] is False  # no word in common: the leading sections are packed
    assert report.to_dict()["packed"]["summary"]["share"] == 0.5
    # Measuring does not change what later questions get: no pack is remembered.
    assert rag.pack_history.recent(rag.engine.namespace, rag.config.store.collection) == []


def test_whole_mode_holds_every_answer(fake_pipeline, tmp_path):
    rag = fake_pipeline(generator=EchoGenerator(n_ctx=8192))
    rag.ingest([shelf(tmp_path / "docs")])
    report = rag.evaluate(questions(tmp_path / "q.jsonl"), settings=["dense"], packed=True)
    assert [(r["mode"], r["in_prompt"]) for r in report.packed] == [("whole", True), ("whole", True)]


def test_rag_eval_packed_prints_the_share_beside_the_table(fake_pipeline, tmp_path, monkeypatch):
    rag = fake_pipeline(generator=EchoGenerator(n_ctx=360), ask__max_tokens=16, chunking__section_tokens=64)
    rag.ingest([shelf(tmp_path / "docs")])
    from pipeline import Pipeline

    real = Pipeline.from_config

    def with_fakes(*args, **kwargs):  # the CLI builds its own pipeline: give it the same fakes
        return real(*args, **kwargs, embedder=rag.embedder, generator=rag.engine)

    monkeypatch.setattr(Pipeline, "from_config", with_fakes)
    monkeypatch.setenv("RAG_STORE_PATH", str(rag.config.store_path))
    monkeypatch.setenv("RAG_ASK_MAX_TOKENS", "16")
    monkeypatch.setenv("RAG_CHUNKING_SECTION_TOKENS", "64")
    result = CliRunner().invoke(cli, ["eval", str(questions(tmp_path / "q.jsonl")), "-s", "hybrid", "--packed",
                                      "--misses"])
    assert result.exit_code == 0, result.output
    assert "page in prompt (current config): 0.500 (1 of 2; prompts built as `rag ask` builds them: sections 2" \
        in result.output
    assert "not in prompt current config: [miss] xylophone quartet rehearsal schedule" in result.output
