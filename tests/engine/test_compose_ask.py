"""Composed prompts through the public API: a sections-mode question over a collection larger than the
context is built from section states (``ask.compose = "on"``), saving each section computed now, and a
later, different question prefills only its new sections, the seams and itself. Generated models and
the fakes' hash embedder: no provisioned model."""

from __future__ import annotations

import pytest

from devtools.synthetic import write_model
from pipeline.engine.cache.sections import NO_STATE
from support.composing import TOPICS, ingest, moe, pipeline, settings, shelf  # noqa: F401 - moe and shelf are fixtures


def test_a_later_different_question_is_composed_from_the_states_of_the_first(moe, tmp_path, shelf):
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        first = rag.ask("What does pump unit 3 report?")
    st = first.stats
    assert st.mode == "sections" and st.cache == "composed" and st.prompt_tokens < 2048
    n = len(st.sections)
    assert n >= 3 and st.states_saved == n and st.composed_sections == 0  # every section computed, saved
    assert st.sections_lost == [NO_STATE] * n and f"{n} sections: no state yet" in st.reuse_lost
    assert st.prefill_tokens == st.prompt_tokens - st.cached_tokens + st.recomputed_tokens

    with pipeline(moe, tmp_path) as rag:  # a new process: the states come from disk
        rag.ask("Which valve has code VAL-020?")  # other sections, computed and saved once
        third = rag.ask("What code does sensor unit 2 have?")
    with pipeline(moe, tmp_path) as rag:
        again = rag.ask("What level does pump unit 4 report, and which valve has code VAL-021?")
    s3 = again.stats
    assert s3.cache == "composed" and s3.composed_sections >= 2
    assert s3.cached_tokens >= s3.prompt_tokens // 2
    # What it prefilled: its sections without a state, the seams and the question, far less than the first.
    assert s3.prefill_tokens < first.stats.prefill_tokens / 2
    assert 0 < s3.recomputed_tokens <= 32 * s3.composed_sections
    assert third.stats.cache == "composed"


@pytest.fixture(params=["qwen3moe", "gpt-oss"])
def shiftable(request, moe, tmp_path):
    """A model that composes: the MoE one, and gpt-oss (sliding-window layers beside full attention)."""
    return moe if request.param == "qwen3moe" else write_model("gpt-oss", tmp_path / "gpt-oss.gguf", n_ctx_train=8192)


def test_whole_recompute_answers_as_exact_prefill_does(shiftable, tmp_path, shelf):
    moe = shiftable
    ingest(moe, tmp_path, shelf)
    question = "What does cable unit 5 report?"
    with pipeline(moe, tmp_path, **{"ask.compose": "off"}) as rag:
        exact = rag.ask(question)
    # (section states kept as computed: a first section restored from a q8_0 copy would not be exact)
    whole = {"ask.compose_seams": "whole", "cache.path": str(tmp_path / "states"), "cache.section_type": "f16"}
    with pipeline(moe, tmp_path, **whole) as rag:
        cold = rag.ask(question)  # every section computed on its own, saved, moved and recomputed
    with pipeline(moe, tmp_path, **whole) as rag:
        warm = rag.ask(question)  # every section restored from its state, moved and recomputed
    assert exact.stats.cache != "composed" and warm.stats.cache == "composed"
    n = len(warm.stats.sections)
    assert n >= 2 and warm.stats.composed_sections == n and cold.stats.composed_sections == 0
    assert warm.stats.recomputed_tokens == sum(x["tokens"] for x in warm.stats.sections[1:])
    assert cold.text == warm.text == exact.text


@pytest.mark.parametrize("arch", ["mamba", "qwen35moe"])  # recurrent; hybrid (Gated DeltaNet + attention)
def test_a_model_that_cannot_shift_falls_back_to_prefix_reuse_and_says_why(tmp_path, shelf, arch):
    mamba = write_model(arch, tmp_path / f"{arch}.gguf", n_ctx_train=8192)
    ingest(mamba, tmp_path, shelf)
    with pipeline(mamba, tmp_path) as rag:
        answer = rag.ask("What does pump unit 3 report?")
    st = answer.stats
    assert st.mode == "sections" and st.cache != "composed"
    assert st.composed_sections == 0 and st.recomputed_tokens == 0
    assert "cannot be shifted" in st.reuse_lost and "prefix" in st.reuse_lost
    assert any("cannot be shifted" in note for note in st.notes)


def test_json_and_stats_line_carry_the_composition(moe, tmp_path, shelf):
    from pipeline.schemas import validate

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        rag.ask("What does pump unit 3 report?")
        data = rag.ask("What level does pump unit 6 report?").to_dict()
    validate("ask", {"schema": 1, **data})
    assert data["stats"]["cache"] == "composed"
    assert {"composed_sections", "recomputed_tokens", "sections_lost"} <= set(data["stats"])


def test_warm_sections_saves_every_section_and_questions_then_prefill_only_seams(moe, tmp_path, shelf):
    ingest(moe, tmp_path, shelf)
    seen = []
    with pipeline(moe, tmp_path) as rag:
        report = rag.warm_sections(progress=lambda p: seen.append((p.done, p.total)))
        again = rag.warm_sections()
    n = report["sections"]
    assert report["documents"] == len(TOPICS) and n >= 2 * len(TOPICS)
    assert report["saved"] == report["chosen"] == n and report["cached"] == 0 and report["bytes_written"] > 0
    assert report["prefilled_tokens"] == report["tokens"] and seen[-1] == (report["tokens"],) * 2
    assert again["saved"] == 0 and again["cached"] == n and again["prefilled_tokens"] == 0
    with pipeline(moe, tmp_path) as rag:
        answer = rag.ask("Which valve has code VAL-020, and what does sensor unit 9 report?")
        head = len(rag.runtime.layout().head_tokens)
    st = answer.stats
    assert st.cache == "composed" and st.composed_sections == len(st.sections) and st.sections_lost == []
    assert st.states_saved == 0 and st.reuse_lost == ""
    # Everything before the question came from states (the head's too): it prefilled the seams and itself.
    assert st.cached_tokens == head + sum(x["tokens"] for x in st.sections)
    assert st.prefill_tokens == st.prompt_tokens - st.cached_tokens + st.recomputed_tokens


def test_rag_warm_sections_command(moe, tmp_path, shelf, monkeypatch):
    from click.testing import CliRunner

    from pipeline.cli import cli

    ingest(moe, tmp_path, shelf)
    for key, value in settings(moe, tmp_path).items():
        if key != "ask.compose":  # the command turns it on for its run
            monkeypatch.setenv("RAG_" + key.replace(".", "_").upper(), str(value))
    result = CliRunner().invoke(cli, ["warm", "--sections"])
    assert result.exit_code == 0, result.output
    assert "saved now, 0 saved before" in result.output and "MB written" in result.output
    assert "section states: saving section states" in result.output  # progress, off a terminal too
    data = __import__("json").loads(CliRunner().invoke(cli, ["warm", "--sections", "--json"]).output)
    assert data["saved"] == 0 and data["cached"] == data["sections"] > 0
    from pipeline.errors import ConfigError

    with pipeline(moe, tmp_path, **{"ask.compose": "off"}) as rag, pytest.raises(ConfigError, match="ask.compose"):
        rag.warm_sections()


def test_rag_warm_saves_section_states_when_questions_are_composed(moe, tmp_path, shelf):
    import jsonschema

    from pipeline.schemas import SCHEMAS

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        report = rag.warm()  # what `rag warm` and `rag ingest --warm` run
    states = report["section_states"]
    assert report["mode"] == "sections" and report["prefixes"] == []
    assert states["saved"] == states["sections"] > 0 and report["bytes_written"] == states["bytes_written"] > 0
    jsonschema.validate(report, SCHEMAS["ingest"]["properties"]["warm"])
    with pipeline(moe, tmp_path, **{"ask.compose": "off"}) as rag:
        assert rag.warm()["prefixes"]  # prefix states, as before


def test_summaries_map_step_is_composed_from_the_section_states_warm_saved(moe, tmp_path, shelf):
    """A manual about twice the context, after the four others: its map prompts number it [5], as the
    whole collection's `rag warm --sections` rendered its sections, so they find those states."""
    paras = [f"Step {i} of the pump service: open panel {i}, read gauge {i * 3} and log code PMP-{i:03d}."
             for i in range(110)]
    manual = shelf / "e-service.md"
    manual.write_text("\n\n".join(paras) + "\n")
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path, **{"ask.compose": "off"}) as rag:
        run = rag.summarize([manual])
        exact = list(run)
        exact_report = run.report
    with pipeline(moe, tmp_path) as rag:
        warmed = rag.warm_sections()
        run = rag.summarize([manual])
        composed = list(run)
        report = run.report
    assert [s.method for s in exact] == [s.method for s in composed] == ["map-reduce"]
    assert warmed["saved"] == warmed["sections"] > composed[0].sections >= 3
    # Every map prompt's sections came from their states (the first of each run is exact as saved).
    assert report.stats.composed_sections == composed[0].sections and exact_report.stats.composed_sections == 0
    assert report.stats.cached_tokens > report.stats.prompt_tokens // 2 > 0
    assert report.stats.prefill_tokens < exact_report.stats.prefill_tokens / 2
    assert composed[0].text and "sections from their states" in report.describe()
    # A composed job is another job: its units are never mixed with the exact one's.
    with pipeline(moe, tmp_path, **{"ask.compose": "off"}) as rag:
        again = rag.summarize([manual])
        assert [s.text for s in again] == [s.text for s in exact]
        assert again.report.results_reused == 1
