"""The reuse plan binds: one planner answers "may this compose, and how", and every path carries its answer
out as planned (the engine, several prompts decoded together, warming, the calibration's two sides, the
status and the section size). Generated models and the fakes' hash embedder."""

from __future__ import annotations

import pytest

from support.composing import TOPICS, ingest, moe, pipeline, shelf  # noqa: F401 - fixtures
from devtools.synthetic import write_model
from pipeline.engine.reuse.budget import Refusal
from pipeline.engine.reuse.kinds import ATTENTION, RECURRENT
from pipeline.engine.reuse.plan import Need
from pipeline.engine.reuse.sections import SectionReuse


def test_the_engine_carries_out_the_plan_it_was_given(moe, tmp_path, shelf, monkeypatch):
    """What the planner answered is what runs: the composition it planned (the same object), with the seams
    it chose; the stats carry the plan's way and its predicted seconds beside the measured ones."""
    ingest(moe, tmp_path, shelf)
    planned, ran = [], []
    real_plan, real_run = SectionReuse.plan, SectionReuse.run

    def plan(self, shape, memory):
        planned.append(real_plan(self, shape, memory))
        return planned[-1]

    def run(self, plan, shape, *args, **kw):
        ran.append(plan)
        return real_run(self, plan, shape, *args, **kw)

    monkeypatch.setattr(SectionReuse, "plan", plan)
    monkeypatch.setattr(SectionReuse, "run", run)
    with pipeline(moe, tmp_path) as rag:
        answer = rag.ask("What does pump unit 3 report?")
    st = answer.stats
    assert st.cache == "composed" and st.plan == "composed" and len(ran) == 1 and ran[0] is planned[-1]
    assert st.recomputed_tokens == len(ran[0].seams) > 0  # the seams it planned, no more, no fewer
    assert st.predicted_seconds > 0 and st.predicted_exact_seconds > 0 and st.ttft_seconds > 0
    assert answer.to_dict()["stats"]["plan"] == "composed"


def test_exact_needs_are_never_composed_and_compose_needs_always_are(moe, tmp_path, shelf):
    """A calibration's exact side and a warmed prefix need exact prefill; its measured side needs
    composition even where the calibration (not taken yet) would refuse it."""
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path, **{"ask.compose": "auto"}) as rag:
        prompt = rag.prompt("What does valve unit 5 report?")
        engine = rag.runtime.engine
        assert prompt.shape.sections is not None and prompt.shape is prompt.shape  # built once, with the prompt
        planner, memory = engine.planner, engine.memory
        answer = planner.plan(prompt.shape, memory, need=Need.ANSWER, probe=True)
        assert answer.composed is None and answer.refusal is Refusal.NOT_CALIBRATED and answer.calibrate
        assert planner.plan(prompt.shape, memory, need=Need.EXACT, probe=True).composed is None
        measured = planner.plan(prompt.shape, memory, need=Need.COMPOSED, probe=True)
        assert measured.composed is not None and not measured.calibrate
        assert set(measured.seconds) == {"exact", "composed"} and measured.predicted_seconds == measured.seconds[
            "composed"]


def test_several_prompts_with_section_states_are_composed_not_prefilled_exactly(moe, tmp_path, shelf):
    """With several sequences per decode, prompts the planner composes are answered as planned (each keeping
    the sections the one before composed), not prefilled exactly to be decoded together."""
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path, **{"engine.n_seq_max": 4}) as rag:
        rag.warm_sections()
        answers = rag.ask_many(["What does pump unit 3 report?", "What does pump unit 3 report, in short?"])
    stats = [a.stats for a in answers]
    assert [s.cache for s in stats] == ["composed", "composed"] and [s.plan for s in stats] == ["composed"] * 2
    assert stats[0].composed_sections == len(stats[0].sections) and stats[0].states_saved == 0
    assert stats[1].prefill_tokens < stats[0].prefill_tokens  # the second kept what the first composed


def test_a_models_kind_is_read_from_its_header_before_it_loads_and_from_llama_cpp_after(tmp_path):
    hybrid = write_model("qwen35moe", tmp_path / "hybrid.gguf", n_ctx_train=8192)
    moe_model = write_model("qwen3moe", tmp_path / "moe.gguf", n_ctx_train=8192)
    from pipeline.config import EngineConfig
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.engine.local import Engine
    from pipeline.engine.reuse.budget import ComposeMode, ComposePolicy

    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        on = ComposePolicy(mode=ComposeMode.ON)
        h = Engine(hybrid, EngineConfig(n_ctx=512, threads=1), cache=cache, compose=on)
        m = Engine(moe_model, EngineConfig(n_ctx=512, threads=1), cache=cache, compose=on)
        assert h.memory_kind is RECURRENT and m.memory_kind is ATTENTION and "llm" not in h.__dict__
        assert h.composition_refusal() is Refusal.CANNOT_SHIFT and m.composition_refusal() is None
        assert h.n_seq_max == 1  # a recurrent memory shares no prefix between sequences
        try:
            h.llm, m.llm  # noqa: B018 - loaded: llama.cpp's word is the same
            assert h.memory_kind.name == "recurrent" and m.memory_kind.composes
        finally:
            h.close()
            m.close()


def test_the_status_and_the_section_size_ask_the_same_planner(tmp_path, monkeypatch):
    """`rag status` says why prompts are not composed without loading the model; the section size follows
    the same answer (a quarter of the context where prompts may be composed, else 512)."""
    from pipeline import Pipeline

    hybrid = write_model("qwen35moe", tmp_path / "hybrid.gguf", n_ctx_train=8192)
    moe_model = write_model("qwen3moe", tmp_path / "moe.gguf", n_ctx_train=8192)
    common = {"engine.n_ctx": 8192, "cache.path": str(tmp_path / "cache")}
    with Pipeline.from_config(overrides={"models.generator": str(hybrid), **common}) as rag:
        c = rag.calibration()
        assert c["allowed"] is False and "cannot be shifted" in c["reason"] and rag.section_tokens == 512
        assert not rag.runtime.has("engine")  # nothing loaded to say so
    with Pipeline.from_config(overrides={"models.generator": str(moe_model), **common}) as rag:
        c = rag.calibration()
        assert c["allowed"] is False and "not calibrated" in c["reason"] and rag.section_tokens == 2048
    with Pipeline.from_config(overrides={"models.generator": str(moe_model), "cache.enabled": False,
                                         **common}) as rag:
        assert rag.section_tokens == 512  # nothing to compose from without the prefix cache
    assert not (tmp_path / "cache").exists()  # a look creates nothing


def test_the_speeds_a_plan_is_predicted_by_are_kept_for_the_next_process(moe, tmp_path, shelf):
    """A new process (here: a new pipeline on the same cache) predicts from what the one before it measured,
    not from guesses: the seams' decode speed and the section states' placing speed of a composed answer."""
    from pipeline.engine.reuse.planner import Speeds

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        rag.warm_sections()
        answer = rag.ask("What does pump unit 3 report?")
        assert answer.stats.cache == "composed" and answer.stats.composed_sections > 0
        planner = rag.runtime.engine.planner
        measured = dict(planner.speeds.measured)
        namespace = rag.runtime.engine.namespace
    assert {"seams", "section_restore"} <= measured.keys()
    assert measured["seams"] != Speeds.SEAMS_SHARE * Speeds.GUESSES["prefill"]  # a measurement, not the guess
    with pipeline(moe, tmp_path) as rag:
        assert rag.runtime.calibrations.speeds(namespace) == measured
        shape = rag.prompt("What does valve unit 5 report?").shape
        engine = rag.runtime.engine
        plan = engine.planner.plan(shape, engine.memory, probe=True)
        assert engine.planner.speeds.measured == measured and not engine.planner.speeds.changed
        assert plan.composed is not None and plan.seconds["composed"] == pytest.approx(Speeds(measured).seconds(
            prefill=plan.composed.missing_tokens + (0 if plan.composed.head else shape.sections.head),
            restore_bytes=plan.composed.head.entry.bytes if plan.composed.head else 0,
            sections=plan.composed.restorable_tokens,
            seams=len(plan.composed.seams) + len(shape) - shape.sections.end))


def test_speeds_start_from_guesses_replace_them_once_measured_then_average():
    from pipeline.engine.reuse.planner import Speeds

    s = Speeds({"seams": -1.0, "prefill": float("nan"), "restore": "fast", "bogus": 5.0})  # a damaged record
    assert s.measured == {} and s.prefill == Speeds.GUESSES["prefill"] and s.seams == Speeds.SEAMS_SHARE * s.prefill
    s.saw(seam_tokens=100, seam_seconds=1.0)
    assert s.seams == 100.0 and s.changed  # the first measurement replaces the guess
    s.saw(seam_tokens=200, seam_seconds=1.0)
    assert s.seams == pytest.approx(0.7 * 100 + 0.3 * 200)
    s.saw(seam_tokens=4, seam_seconds=1.0)  # too few tokens to say anything
    assert s.seams == pytest.approx(130.0)
    assert s.seconds(prefill=500, seams=130, sections=50_000) == pytest.approx(1.0 + 1.0 + 1.0)


def test_kept_speeds_survive_a_damaged_calibrations_file(tmp_path):
    from pipeline.engine.cache.calibrations import FILE_NAME, Calibrations

    (tmp_path / FILE_NAME).write_bytes(b"not a database at all" * 100)
    kept = Calibrations(tmp_path)
    assert kept.speeds("ns") == {}  # a look never fails
    kept.keep_speeds("ns", {"seams": 120.0})
    assert Calibrations(tmp_path).speeds("ns") == {"seams": 120.0}
    kept.clear()
    assert Calibrations(tmp_path).speeds("ns") == {}
