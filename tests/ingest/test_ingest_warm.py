"""``ingest.warm = "auto"`` (the default; the suite's fixtures set it off for speed): after an ingest,
a collection larger than the context gets its composition calibrated and every section's state saved,
so the first question is already composed; nothing is done where the collection fits the context,
composition is off or over its budget, the model cannot shift, or the states would crowd the cache.
Generated models and the fakes' hash embedder, then the CLI on the real default models."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from support.fakes import HashEmbedder
from devtools.synthetic import write_model, write_moe_model
from pipeline import Pipeline
from pipeline.cli import cli
from pipeline.config import Config
from pipeline.engine.context_lock import CancelToken
from pipeline.errors import Cancelled
from pipeline.schemas import validate, versioned

TOPICS = [("a-pumps.md", "pump"), ("b-valves.md", "valve"), ("c-sensors.md", "sensor"), ("d-cables.md", "cable")]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return write_moe_model(tmp_path_factory.mktemp("moe") / "moe.gguf", n_ctx_train=8192)


def write_shelf(root, paragraphs: int = 24):
    root.mkdir()
    for name, topic in TOPICS:
        paras = [f"Paragraph {i} of the {topic} manual: the {topic} unit {i} reports level {i * 7} "
                 f"and code {topic[:3].upper()}-{i:03d}." for i in range(paragraphs)]
        (root / name).write_text("\n\n".join(paras) + "\n")
    return root


def pipeline(model, tmp_path, **kw) -> Pipeline:
    settings = {"models.generator": str(model), "engine.n_ctx": 2048, "engine.threads": 1, "ask.max_tokens": 6,
                "chunking.size": 64, "chunking.overlap": 8, "chunking.section_tokens": 128,
                "cache.path": str(tmp_path / "cache"), "ask.compose_max_kl": 100.0, **kw}
    return Pipeline.from_config(overrides=settings, embedder=HashEmbedder())


def states(tmp_path) -> int:
    return sum(1 for _ in (tmp_path / "cache").rglob("*.state"))


def test_the_default_is_auto():
    assert Config().ingest.warm == "auto"


def test_a_shelf_larger_than_the_context_is_calibrated_and_warmed_so_the_first_question_composes(moe, tmp_path):
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path) as rag:
        rag.ingest([docs])
        seen = []
        report = rag.warm_auto(progress=lambda p: seen.append((p.stage, p.done, p.total, p.unit)))
    assert report["warmed"] is True and "larger than the context" in report["reason"]
    assert report["sections"] >= 8 and report["saved"] + report["cached"] == report["chosen"] == report["sections"]
    assert report["left"] == 0 and report["room_bytes"] > 0
    c = report["calibration"]
    assert c["allowed"] is True and c["tokens"] >= 32 and c["prompts"] == 3 and len(c["kls"]) == 3
    assert c["kl"] == pytest.approx(sum(c["kls"]) / 3, abs=1e-4) and c["kl_spread"] >= 0
    # Progress from the first step, in tokens, through the calibration, to the end of the states.
    assert seen[0][1] == 0 and all(unit == "tokens" for *_, unit in seen)
    assert any(stage.startswith("calibrating composition") for stage, *_ in seen)
    assert seen[-1][0] == "done" and seen[-1][1] == seen[-1][2] > report["tokens"]
    assert all(done <= total for _, done, total, _ in seen)
    with pipeline(moe, tmp_path) as rag:  # a new process: the first question, every state on disk
        first = rag.ask("What does pump unit 3 report?")
        assert rag.calibration()["allowed"] is True
    st = first.stats
    assert st.mode == "sections" and st.cache == "composed"
    assert st.composed_sections == len(st.sections) >= 2 and st.states_saved == 0
    assert st.prefill_tokens < st.prompt_tokens // 4  # only the seams and the question

    with pipeline(moe, tmp_path) as rag:  # again: nothing new to save, no second calibration
        again = rag.warm_auto()
    assert again["warmed"] is True and again["prefilled_tokens"] == 0 and again["saved"] == 0
    assert again["calibration"]["measured_at"] == report["calibration"]["measured_at"]


def test_nothing_is_done_where_the_collection_fits_the_context(moe, tmp_path):
    docs = write_shelf(tmp_path / "shelf", paragraphs=2)
    with pipeline(moe, tmp_path) as rag:
        rag.ingest([docs])
        report = rag.warm_auto()
    assert report == {"warmed": False, "reason": report["reason"]} and "fits the context" in report["reason"]
    assert states(tmp_path) == 0


@pytest.mark.parametrize("setting, expected", [
    ({"ask.compose": "off"}, 'ask.compose is "off"'),
    ({"cache.enabled": False}, "the prefix cache cannot save states"),
])
def test_nothing_is_done_where_states_would_not_be_used_or_kept(moe, tmp_path, setting, expected):
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path, **setting) as rag:
        rag.ingest([docs])
        report = rag.warm_auto()
    assert report["warmed"] is False and expected in report["reason"]
    assert not (tmp_path / "cache").exists() or states(tmp_path) == 0


def test_a_model_that_cannot_shift_is_left_alone(tmp_path):
    hybrid = write_model("qwen35moe", tmp_path / "hybrid.gguf", n_ctx_train=8192)
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(hybrid, tmp_path) as rag:
        rag.ingest([docs])
        report = rag.warm_auto()
    assert report["warmed"] is False and "cannot be shifted" in report["reason"]
    assert states(tmp_path) == 0


def test_over_the_budget_only_the_calibration_is_spent(moe, tmp_path):
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path, **{"ask.compose_max_kl": 0.0}) as rag:
        rag.ingest([docs])
        report = rag.warm_auto()
        sections = rag.sections().sections
    assert report["warmed"] is False and "over the quality budget" in report["reason"]
    assert report["calibration"]["allowed"] is False
    assert report["calibration"]["sections"] < sections  # the calibration's own sections, not the shelf's


@pytest.mark.slow
def test_cli_ingest_warms_by_default_and_the_first_ask_is_composed(store_dir, tmp_path, monkeypatch):
    """The real default models at a 1K context: the ingest's own messages and JSON, then ``rag ask``."""
    monkeypatch.delenv("RAG_INGEST_WARM")
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    monkeypatch.setenv("RAG_ASK_MAX_TOKENS", "8")
    monkeypatch.setenv("RAG_ASK_COMPOSE_MAX_KL", "100")  # a test of the mechanism, not of SmolLM2's quality
    docs = write_shelf(tmp_path / "shelf", paragraphs=16)
    runner = CliRunner()
    out = runner.invoke(cli, ["ingest", str(docs)])
    assert out.exit_code == 0, out.output
    assert "composition calibrated" in out.output and "questions are composed" in out.output
    assert "section states: " in out.output and "sections of 4 documents" in out.output
    assert "calibrating composition (prompt 1 of 3)" in out.output  # said from its first step

    ran = runner.invoke(cli, ["ask", "What does pump unit 3 report?", "--json"])
    assert ran.exit_code == 0, ran.output
    st = json.loads(ran.stdout)["stats"]
    # Every part of the prompt before the question was saved ahead: composed from section states, or a prefix
    # the calibration prefilled exactly (the same sections in the same order), restored whole.
    assert (st["cache"], st["plan"]) in (("composed", "composed"), ("disk", "exact")) and st["states_saved"] == 0
    assert st["prefill_tokens"] < st["prompt_tokens"] // 4

    (docs / "e-pipes.md").write_text("\n\n".join(f"Pipe {i} holds {i * 3} litres." for i in range(60)) + "\n")
    data = json.loads(runner.invoke(cli, ["ingest", str(docs), "--json"]).stdout)
    validate("ingest", versioned(data))
    warm = data["warm"]  # only the new document's sections computed; the calibration kept
    assert warm["warmed"] is True and 0 < warm["saved"] < warm["chosen"] and warm["cached"] > 0

    out = runner.invoke(cli, ["ingest", str(docs), "--no-warm", "--json"])
    assert out.exit_code == 0 and "warm" not in json.loads(out.stdout)


def test_a_generator_that_does_not_load_leaves_the_ingest_standing(tmp_path):
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(tmp_path / "missing.gguf", tmp_path) as rag:
        report = rag.ingest([docs])
        warm = rag.warm_auto()
        assert rag.status().documents == 4
    assert report.chunks > 0
    assert warm["warmed"] is False and warm["failed"] is True
    assert warm["reason"].startswith("section states not saved: ") and "missing.gguf" in warm["reason"]


def test_a_full_cache_disk_stops_the_states_not_the_ingest(moe, tmp_path, monkeypatch):
    import errno

    import pipeline.engine.cache.prefix_cache as store

    docs = write_shelf(tmp_path / "shelf")
    real, writes = store.write_state, []

    def write_state(*args, **kwargs):  # the calibration's states fit; the fourth state after it does not
        writes.append(args[1])
        if len(writes) > 8:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "write_state", write_state)
    with pipeline(moe, tmp_path) as rag:
        rag.ingest([docs])
        warm = rag.warm_auto()
    assert warm["warmed"] is False and warm["failed"] is True and "is full" in warm["reason"]
    assert "rag warm --sections` again" in warm["reason"]
    monkeypatch.setattr(store, "write_state", real)  # room again: the next ingest saves what is missing
    with pipeline(moe, tmp_path) as rag:
        again = rag.warm_auto()
    assert again["warmed"] is True and 0 < again["saved"] < again["sections"]


@pytest.mark.slow
def test_ctrl_c_while_saving_states_keeps_the_ingest_and_exits_0(store_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("RAG_INGEST_WARM")

    from pipeline.cli.warming import WarmLine

    def interrupted(self, progress):  # Ctrl-C while the bar is drawn, on the command's own thread
        raise KeyboardInterrupt

    monkeypatch.setattr(WarmLine, "show", interrupted)
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")  # a shelf larger than the context: there is work to stop
    docs = write_shelf(tmp_path / "shelf", paragraphs=16)
    out = CliRunner().invoke(cli, ["ingest", str(docs)])
    assert out.exit_code == 0, out.output
    assert "stopping: the documents are ingested; the states saved so far are kept" in out.output
    assert "cancelled" in out.output and "the next `rag ingest`) saves the rest" in out.output
    status = json.loads(CliRunner().invoke(cli, ["status", "--json"]).stdout)
    assert status["documents"] == 4


def test_questions_come_first_while_section_states_are_saved(moe, tmp_path):
    """A question asked while the states are saved runs between two sections, not after the last."""
    docs = write_shelf(tmp_path / "shelf", paragraphs=48)
    with pipeline(moe, tmp_path, **{"ask.compose": "on"}) as rag:
        rag.ingest([docs])
        engine = rag.runtime.engine
        events: list[str] = []
        asker: list[threading.Thread] = []

        def question() -> None:
            answer = rag.ask("What does valve unit 5 report?")
            events.append(f"answer {answer.stats.cache}")

        def progress(p) -> None:
            if not (p.stage.startswith("saving") and p.done):
                return
            events.append("section")
            if not asker:  # after the first section: a question arrives and waits for the engine
                asker.append(threading.Thread(target=question))
                asker[0].start()
                deadline = time.monotonic() + 60
                while engine.lock.queued == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)

        report = rag.warm_sections(progress=progress)
        asker[0].join()
    assert report["saved"] + report["cached"] == report["sections"] > 8
    answered = next(i for i, e in enumerate(events) if e.startswith("answer"))
    assert events[answered] == "answer composed"
    assert 1 <= answered < len(events) - 2  # states were still being saved after the answer


def test_cancelling_keeps_the_states_saved_and_the_next_run_saves_the_rest(moe, tmp_path):
    docs = write_shelf(tmp_path / "shelf")
    token = CancelToken()
    with pipeline(moe, tmp_path, **{"ask.compose": "on"}) as rag:
        rag.ingest([docs])
        with pytest.raises(Cancelled):
            rag.warm_sections(progress=lambda p: token.cancel() if p.done else None, cancel=token)
        kept = states(tmp_path)
        assert kept >= 1
        report = rag.warm_sections()
        answer = rag.ask("What does pump unit 3 report?")  # the engine is whole after the cancel
    assert 1 <= report["cached"] < report["sections"] and report["saved"] + report["cached"] == report["sections"]
    assert states(tmp_path) > kept and answer.stats.cache == "composed"


def test_the_servers_writer_saves_section_states_after_a_job_and_the_next_job_comes_first(moe, tmp_path):
    from pipeline.serve.writer import IngestWriter

    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path, **{"ingest.warm": "auto"}) as rag:
        writer = IngestWriter(rag)
        job = writer.submit([docs], prune=False)
        writer.wait_idle()
        assert job.state == "done" and job.warm["state"] == "done" and job.warm["warmed"] is True
        assert job.warm["saved"] + job.warm["cached"] == job.warm["sections"] > 0
        assert job.to_dict()["warm"] == job.warm

        import pipeline.warm.sections as warming

        blocked = threading.Event()
        slow = _warm_until_cancelled(warming, blocked)  # the next warm runs until it is cancelled

        warming.warm_auto = slow
        (docs / "e-pipes.md").write_text("\n\n".join(f"Pipe {i} holds {i * 3} litres." for i in range(40)) + "\n")
        second = writer.submit([docs], prune=False)
        assert blocked.wait(60)
        third = writer.submit([docs], prune=False)  # cancels the second job's warm, runs, then warms
        writer.wait_idle()
        assert second.state == "done" and "cancelled" in second.warm["reason"]
        assert third.state == "done" and third.warm["warmed"] is True and third.warm["saved"] > 0

        writer.stop_warming()  # the server stops: a job still runs, and warms nothing after
        fourth = writer.submit([docs], prune=False)
        writer.wait_idle()
        assert fourth.state == "done" and fourth.warm is None


def test_a_question_asked_while_composition_is_calibrated_runs_first(moe, tmp_path):
    """The calibration's exact prefill gives way to a question, then is taken up again: the warm goes on."""
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path) as rag:
        rag.ingest([docs])
        engine = rag.runtime.engine
        real, prefills, asker = engine.prefill, [], []

        def question() -> None:
            rag.ask("What does valve unit 5 report?")

        def prefill(tokens, *, start=0):
            prefills.append(threading.current_thread() is threading.main_thread())
            if not asker:  # the calibration's first piece: a question arrives and waits for the engine
                asker.append(threading.Thread(target=question))
                asker[0].start()
                deadline = time.monotonic() + 20
                while engine.lock.queued == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
            return real(tokens, start=start)

        engine.prefill = prefill
        report = rag.warm_auto(cancel=CancelToken())  # giving way does not cancel the caller's token
        asker[0].join()
    assert prefills[0] is True and prefills[1] is False  # the question's prefill came next, not the calibration's
    assert report["warmed"] is True and report["calibration"]["allowed"] is True
    assert report["saved"] + report["cached"] == report["sections"] >= 8


def test_a_shelf_larger_than_the_cache_room_gets_the_most_useful_states_first(moe, tmp_path):
    """Never all or nothing: with room for about half the states, those the last question packed come first,
    the rest are left (and said) for the questions that need them; that question is then fully composed."""
    docs = write_shelf(tmp_path / "shelf", paragraphs=48)
    question = "What does sensor unit 40 report?"
    with pipeline(moe, tmp_path) as rag:
        rag.ingest([docs])
        asked = rag.ask(question)  # not calibrated yet: exact, and its pack goes to the history
        pack = sum(rag.runtime.engine.section_state_bytes(s["tokens"]) for s in asked.stats.sections)
    assert asked.stats.mode == "sections" and asked.stats.cache != "composed"
    room = 2.5 * pack * 1.3  # for the asked pack and a little more, far from the whole shelf
    gb = room / 0.8 / 2**30  # SECTIONS_SHARE of the budget
    with pipeline(moe, tmp_path, **{"cache.max_gb": gb}) as rag:
        report = rag.warm_auto()
        sections = rag.sections().sections
    assert report["warmed"] is True and 0 < report["chosen"] < report["sections"] == sections
    assert report["left"] == report["sections"] - report["chosen"] and report["left_tokens"] > 0
    assert "room for about" in report["left_reason"] and report["room_bytes"] <= 2**30 * gb
    with pipeline(moe, tmp_path, **{"cache.max_gb": gb}) as rag:
        again = rag.ask(question)
    st = again.stats
    assert st.cache == "composed" and st.composed_sections == len(st.sections) and st.states_saved == 0


def _warm_until_cancelled(warming, blocked):
    """A stand-in for ``warming.warm_auto`` that puts the real one back, sets ``blocked``, then runs until
    its warming is cancelled (at most a minute)."""
    real = warming.warm_auto

    def slow(rt, *, progress=None, cancel=None):
        warming.warm_auto = real
        blocked.set()
        deadline = time.monotonic() + 60
        while not cancel.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        raise Cancelled("cancelled")
    return slow


def test_a_job_into_another_collection_shares_the_one_warming(moe, tmp_path):
    """A server's collections share one engine, and so one warming: a job into another collection
    cancels the warming of the server's own (what it saved stays) and warms its own collection after it."""
    import pipeline.warm.sections as warming
    from pipeline.serve.writer import IngestWriter

    docs = write_shelf(tmp_path / "shelf")
    real, blocked = warming.warm_auto, threading.Event()
    slow = _warm_until_cancelled(warming, blocked)  # the first warm runs until it is cancelled

    with pipeline(moe, tmp_path, **{"ingest.warm": "auto"}) as rag:
        writer = IngestWriter(rag)
        warming.warm_auto = slow
        try:
            first = writer.submit([docs], prune=False)
            assert blocked.wait(60)
            other = rag.for_collection("other")
            assert other.warming is rag.warming is first.warming
            second = writer.submit([docs], prune=False, rag=other)
            writer.wait_idle()
        finally:
            warming.warm_auto = real
        assert first.state == "done" and "cancelled" in first.warm["reason"]
        assert second.state == "done" and second.collection == "other" and second.warm["warmed"] is True
        assert rag.warming is other.warming is second.warming
        assert other.status().documents == len(TOPICS) == rag.status().documents


def test_the_library_warms_after_an_ingest_as_the_cli_does_and_a_question_runs_first(moe, tmp_path):
    """Pipeline.ingest applies ingest.warm itself, in the background: its report's warming shows the progress
    and the outcome, a question asked meanwhile is answered, and once it is done the next question is
    composed, as after `rag ingest`."""
    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path, **{"ingest.warm": "auto"}) as rag:
        report = rag.ingest([docs])
        job = report.warming
        assert job is not None and rag.warming is job and job.setting == "auto"
        meanwhile = rag.ask("What does valve unit 5 report?")  # runs first: not kept waiting for the states
        warmed = job.wait()
        assert job.done and job.to_dict()["state"] == "done"
        after = rag.ask("What does pump unit 3 report?")
    assert meanwhile.text is not None
    assert warmed["warmed"] is True and warmed["calibration"]["allowed"] is True
    assert after.stats.cache == "composed" and after.stats.states_saved == 0
    with pipeline(moe, tmp_path, **{"ingest.warm": "auto"}) as rag:
        assert rag.ingest([docs], warm=False).warming is None  # off for this call
        job = rag.ingest([docs]).warming
    assert job.done  # closing the pipeline stopped it (or it had finished): nothing runs after close


def test_a_warm_cut_for_a_larger_context_says_what_to_do(moe, tmp_path):
    """Sections cut for a larger context do not fit a smaller one: `rag warm --sections` says so in words, and
    the ingest's warming skips with the same words (a question falls back to passages)."""
    from pipeline.errors import ConfigError

    docs = write_shelf(tmp_path / "shelf")
    with pipeline(moe, tmp_path, **{"chunking.section_tokens": 0, "engine.n_ctx": 8192}) as rag:
        rag.ingest([docs])  # sections cut for 8K: a quarter of it each
    small = {"chunking.section_tokens": 0, "engine.n_ctx": 1024, "ask.compose": "on"}
    with pipeline(moe, tmp_path, **small) as rag, pytest.raises(ConfigError) as caught:
        rag.warm_sections()
    assert "cut for a larger context" in str(caught.value) and "rag sections --recut" in str(caught.value)
    with pipeline(moe, tmp_path, **small) as rag:
        report = rag.warm_auto()
    assert report["warmed"] is False and "rag sections --recut" in report["reason"]
