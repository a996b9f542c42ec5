"""Composition decided per model by a measured quality budget (``ask.compose = "auto"``, the default): the
first question over a shelf larger than the context is exact, its answer calibrates composition on the
shelf's own sections, later questions are composed where the budget allows, and every step says why.
Generated models and the fakes' hash embedder, real llama.cpp and real caches."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.engine.cache.calibrations import Calibrations
from pipeline.engine.context_lock import CancelToken, ContextLock
from pipeline.engine.cache.calibrations import Calibration
from pipeline.engine.reuse.budget import ComposeMode, ComposePolicy, Refusal
from pipeline.engine.reuse.calibrate import compare
from pipeline.errors import Cancelled

from support.composing import ingest, moe, pipeline, settings, shelf  # noqa: F401 - fixtures

QUESTIONS = ["What does pump unit 3 report?", "What level does valve unit 6 report?",
             "Which sensor has code SEN-011?"]


def auto(model, tmp_path, **kw):
    return pipeline(model, tmp_path, **{"ask.compose": "auto", "ask.max_tokens": 12, **kw})


def test_the_first_question_is_exact_and_its_answer_calibrates_composition(moe, tmp_path, shelf):
    ingest(moe, tmp_path, shelf)
    with auto(moe, tmp_path, **{"ask.compose_max_kl": 100.0}) as rag:
        assert rag.calibration()["kl"] is None and not rag.calibration()["allowed"]
        first = rag.ask(QUESTIONS[0])
        rag.settle()
        c = rag.calibration()
        second = rag.ask(QUESTIONS[1])
    st = first.stats
    assert st.mode == "sections" and st.cache != "composed" and st.composed_sections == 0
    assert Refusal.NOT_CALIBRATED.value in st.reuse_lost  # says why it was not composed
    assert c["kl"] is not None and c["kl"] >= 0 and 0 <= c["top1"] <= 1 and c["tokens"] >= 2
    assert c["allowed"] and c["budget"] == 100.0 and c["mode"] == "auto" and c["model"] == moe.name
    # Allowed now: the next question is composed (its sections restored where the calibration saved them).
    assert second.stats.cache == "composed" and not any(Refusal.NOT_CALIBRATED.value in x
                                                         for x in second.stats.sections_lost)
    # A new process (a new pipeline) reads the calibration from the cache directory: composed at once.
    with auto(moe, tmp_path, **{"ask.compose_max_kl": 100.0}) as rag:
        third = rag.ask(QUESTIONS[2])
    assert third.stats.cache == "composed"


def test_a_budget_the_calibration_exceeds_keeps_prompts_exact_and_says_so(moe, tmp_path, shelf):
    ingest(moe, tmp_path, shelf)
    with auto(moe, tmp_path, **{"ask.compose_max_kl": 0.0, "ask.compose_seams": "none"}) as rag:
        rag.ask(QUESTIONS[0])
        rag.settle()
        c = rag.calibration()
        later = rag.ask(QUESTIONS[1])
    assert c["kl"] > 0 and not c["allowed"]  # nothing recomputed at the seams of a random model: it differs
    assert later.stats.cache != "composed" and Refusal.OVER_BUDGET.value in later.stats.reuse_lost


def test_with_every_moved_section_recomputed_the_calibration_measures_no_difference(moe, tmp_path, shelf):
    """The plumbing of the measurement: composition with whole seams is exact, so KL is 0 and top-1 is 1."""
    ingest(moe, tmp_path, shelf)
    with auto(moe, tmp_path, **{"ask.compose_seams": "whole", "cache.section_type": "f16"}) as rag:
        rag.ask(QUESTIONS[0])
        rag.settle()
        c = rag.calibration()
    assert c["kl"] < 1e-4 and c["top1"] == 1.0


def test_status_shows_the_calibration(moe, tmp_path, shelf, monkeypatch):
    ingest(moe, tmp_path, shelf)
    for key, value in settings(moe, tmp_path).items():
        if key not in ("ask.compose", "models.embedder"):
            monkeypatch.setenv("RAG_" + key.replace(".", "_").upper(), str(value))
    with auto(moe, tmp_path) as rag:
        rag.ask(QUESTIONS[0])
        rag.settle()
    runner = CliRunner()
    result = runner.invoke(cli, ["status", "--json"])
    assert result.exit_code == 0, result.output
    c = json.loads(result.output)["composition"]
    assert {"model", "kl", "top1", "tokens", "budget", "allowed"} <= set(c) and c["tokens"] >= 2
    assert c["budget"] == 0.05 and c["allowed"] == (c["kl"] <= 0.05)
    text = runner.invoke(cli, ["status"]).output
    assert "composition: auto" in text and "mean KL" in text


def test_warm_sections_calibrates_so_that_even_the_first_question_is_composed(moe, tmp_path, shelf):
    ingest(moe, tmp_path, shelf)
    with auto(moe, tmp_path, **{"ask.compose_max_kl": 100.0}) as rag:
        report = rag.warm_sections()
        first = rag.ask(QUESTIONS[0])
    assert report["calibration"]["tokens"] >= 2 and report["calibration"]["allowed"]
    assert first.stats.cache == "composed" and first.stats.sections_lost == []


def test_the_calibration_answer_is_decoded_as_questions_answers_are(moe, tmp_path, shelf, monkeypatch):
    """Without the answers' repeat penalty a small model's greedy answer soon repeats one line, positions
    that agree whatever the context: the calibration would measure composition closer to exact than the
    answers people read."""
    from pipeline.engine.local import Engine

    ingest(moe, tmp_path, shelf)
    penalties = []
    real = Engine.generate

    def spy(self, prompt, **kw):
        if kw.get("exact"):
            penalties.append(kw.get("repeat_penalty"))
        return real(self, prompt, **kw)

    monkeypatch.setattr(Engine, "generate", spy)
    with auto(moe, tmp_path, **{"ask.repeat_penalty": 1.3}) as rag:
        report = rag.warm_sections()
    assert report["calibration"] is not None and penalties == [1.3, 1.3, 1.3]  # each of its prompts


def test_a_question_that_arrives_during_a_calibration_is_not_kept_waiting(moe, tmp_path, shelf):
    """The calibration's turn is preemptible: a question queueing for the engine cancels it, and it is
    measured after a later answer instead."""
    ingest(moe, tmp_path, shelf)
    with auto(moe, tmp_path) as rag:
        rag.ask(QUESTIONS[0])  # leaves a calibration pending, started in the background
        engine = rag.engine
        answer = rag.ask(QUESTIONS[1])  # queues behind it (or runs first): either way it is answered
        assert answer.text
        rag.settle()
        assert engine.pending_calibration is None or rag.calibration()["kl"] is None


def test_a_preemptible_turn_gives_way_to_a_waiting_caller():
    lock = ContextLock(closed="closed")
    token = CancelToken()
    holding, waiter_done, stopped = threading.Event(), threading.Event(), []

    def background():
        with lock.hold(token, preemptible=True):
            holding.set()
            deadline = time.monotonic() + 5
            while not lock.stopping and time.monotonic() < deadline:  # asked to stop as soon as someone waits
                time.sleep(0.005)
            stopped.append(lock.stopping)

    def question():
        holding.wait(5)
        with lock.hold():
            waiter_done.set()

    threads = [threading.Thread(target=background), threading.Thread(target=question)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert stopped == [True] and waiter_done.is_set()
    assert not token.cancelled  # giving way is not the caller's cancel
    # A preemptible turn whose time comes while another caller waits behind it gives way at once.
    lock2 = ContextLock(closed="closed")
    release, got = threading.Event(), []

    def holder():
        with lock2.hold():
            release.wait(5)

    def preemptible():
        try:
            with lock2.hold(CancelToken(), preemptible=True):
                got.append("ran")
        except Cancelled:
            got.append("gave way")

    def later():
        with lock2.hold():
            got.append("question")

    h = threading.Thread(target=holder)
    h.start()
    while not lock2.busy:
        pass
    p = threading.Thread(target=preemptible)
    p.start()
    while lock2.queued < 1:
        pass
    q = threading.Thread(target=later)
    q.start()
    while lock2.queued < 2:
        pass
    release.set()
    for t in (h, p, q):
        t.join(5)
    assert got == ["gave way", "question"]


def test_compare_is_kl_and_top1_over_positions():
    exact = [np.array([2.0, 1.0, 0.0]), np.array([0.0, 3.0, 0.0])]
    same = compare(exact, np.stack(exact))
    assert same.kl == pytest.approx(0.0, abs=1e-12) and same.top1 == 1.0 and same.tokens == 2
    other = compare(exact, np.stack([np.array([0.0, 1.0, 2.0]), np.array([0.0, 3.0, 0.0])]))
    assert other.top1 == 0.5 and other.kl > 0.5


def test_the_policy_and_its_records():
    c = Calibration("m.gguf", "ns", "first 32", kl=0.04, top1=0.9, tokens=96, prompts=3, kls=(0.03, 0.04, 0.05))
    policy = ComposePolicy(mode=ComposeMode.AUTO, max_kl=0.05)
    assert policy.refusal(None) is Refusal.NOT_CALIBRATED
    assert policy.refusal(c) is None
    assert ComposePolicy(max_kl=0.01).refusal(c) is Refusal.OVER_BUDGET
    assert ComposePolicy(mode=ComposeMode.ON).refusal(None) is None
    assert ComposePolicy(mode=ComposeMode.OFF).refusal(c) is Refusal.OFF
    assert not policy.wants_calibration(c) and policy.wants_calibration(None)
    assert policy.wants_calibration(Calibration("m.gguf", "ns", "first 32", kl=0.04, top1=0.9, tokens=64))  # 1 prompt
    merged = Calibration("m.gguf", "ns", "first 32", kl=0.02, top1=1.0, tokens=16).merged(c)
    assert merged.tokens == 112 and merged.prompts == 4 and merged.kls == (0.02, 0.03, 0.04, 0.05)
    assert merged.kl == pytest.approx(0.035) and merged.spread == pytest.approx(0.0129099, abs=1e-6)  # per prompt
    assert merged.to_dict()["kl_range"] == [0.02, 0.05]
    older = Calibration("m.gguf", "ns", "first 32", kl=0.01, top1=1.0, tokens=64, method=c.method - 1)
    assert older.merged(c) == c  # measured differently: the new measurement alone


def test_calibrations_are_kept_per_namespace_and_seams_and_survive_a_damaged_file(tmp_path):
    store = Calibrations(tmp_path)
    assert store.get("ns", "first 32") is None and not (tmp_path / "calibrations.sqlite").exists()  # a look
    store.add(Calibration("m.gguf", "ns", "first 32", kl=0.04, top1=0.9, tokens=32))
    again = Calibrations(tmp_path).add(Calibration("m.gguf", "ns", "first 32", kl=0.02, top1=1.0, tokens=32))
    assert again.tokens == 64 and Calibrations(tmp_path).get("ns", "first 32").kl == pytest.approx(0.03)
    assert Calibrations(tmp_path).get("ns", "first 8") is None and Calibrations(tmp_path).get("other", "first 32") is None
    (tmp_path / "calibrations.sqlite").write_bytes(b"not a database" * 100)
    assert Calibrations(tmp_path).get("ns", "first 32") is None  # damaged: read as nothing measured
    kept = Calibrations(tmp_path).add(Calibration("m.gguf", "ns", "first 32", kl=0.01, top1=1.0, tokens=8))
    assert kept.tokens == 8 and Calibrations(tmp_path).get("ns", "first 32").tokens == 8
    memory_only = Calibrations(None)
    memory_only.add(Calibration("m.gguf", "ns", "s", kl=0.1, top1=0.5, tokens=4))
    assert memory_only.get("ns", "s").kl == 0.1 and memory_only.all()[0].namespace == "ns"


def test_a_record_measured_the_old_way_counts_as_none_and_is_replaced(tmp_path):
    """Calibrations measured before answers were decoded with the repeat penalty judged composition on
    repeated lines: they are measured again, not merged with."""
    from pipeline.engine.cache.calibrations import METHOD

    old = Calibration("m.gguf", "ns", "first 32", kl=0.01, top1=1.0, tokens=64, method=METHOD - 1)
    Calibrations(tmp_path).add(old)
    assert Calibrations(tmp_path).get("ns", "first 32") is None and Calibrations(tmp_path).all() == []
    assert ComposePolicy().wants_calibration(Calibrations(tmp_path).get("ns", "first 32"))
    new = Calibrations(tmp_path).add(Calibration("m.gguf", "ns", "first 32", kl=0.09, top1=0.8, tokens=32))
    assert new.tokens == 32 and new.kl == 0.09 and new.method == METHOD  # replaced, not merged
    kept = Calibrations(tmp_path).get("ns", "first 32")
    assert kept is not None and kept.kl == 0.09 and kept.method == METHOD
    legacy = tmp_path / "legacy"  # a record written before records said how they were measured
    legacy.mkdir()
    Calibrations(legacy).add(old)
    import sqlite3

    db = sqlite3.connect(legacy / "calibrations.sqlite")
    text = db.execute("SELECT record FROM calibrations").fetchone()[0]
    d = json.loads(text)
    del d["method"]
    with db:
        db.execute("UPDATE calibrations SET record = ?", (json.dumps(d),))
    db.close()
    assert Calibrations(legacy).get("ns", "first 32") is None
