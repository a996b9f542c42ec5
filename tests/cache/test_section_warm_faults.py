"""`rag warm --sections` against a careless world: a cache disk that fills, state files deleted, cut
short or flipped, two warms at once, a cache index deleted. Generated models and the fakes' hash
embedder (no provisioned model); a real full disk where a tmpfs can be mounted, and beside it a twin
that injects the same failure."""

from __future__ import annotations

import errno
import json
import os
import threading

import pytest
from click.testing import CliRunner

from support.full_disk import small_disk
from pipeline.errors import DiskFullError
from support.composing import TOPICS, ingest, moe, pipeline, settings, shelf  # noqa: F401  (fixtures)

QUESTION = "Which valve has code VAL-020, and what does sensor unit 9 report?"


class _Writes(list):
    """The state files written (their names); after ``fail_after`` of them, every write fails as on a
    full disk (``fail_after = None``: room again)."""

    def __init__(self, fail_after: int | None):
        super().__init__()
        self.fail_after = fail_after


def _writes(monkeypatch, *, fail_after: int | None) -> _Writes:
    import pipeline.engine.cache.prefix_cache as store

    real = store.write_state
    calls = _Writes(fail_after)

    def write_state(*args, **kwargs):
        calls.append(args[1])
        if calls.fail_after is not None and len(calls) > calls.fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "write_state", write_state)
    return calls


def _section_entries(rag):
    """The section states of the collection's head, oldest first (the order warm saved them)."""
    from pipeline.engine.cache.sections import namespace

    ns = namespace(rag.engine.namespace, rag.runtime.layout().head_tokens, rag.prefix_cache.section_type)
    return sorted(rag.prefix_cache.entries(ns), key=lambda e: e.created)


# -- a cache disk that fills -------------------------------------------------------------------------


def test_a_full_disk_stops_warm_at_the_first_state_it_cannot_save(moe, tmp_path, shelf, monkeypatch):
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        rag.warm_sections()  # the head's state is kept, the sections' are forgotten
        rag.prefix_cache.forget(_section_entries(rag)[0].namespace)
    seen = []
    calls = _writes(monkeypatch, fail_after=3)
    with pipeline(moe, tmp_path) as rag, pytest.raises(DiskFullError) as caught:
        rag.warm_sections(progress=lambda p: seen.append(p.done) if p.done > (seen[-1] if seen else 0) else None)
    message = str(caught.value)
    assert caught.value.exit_code == 4
    cache = tmp_path / "cache"
    assert message.startswith(f"the disk holding the prefix cache {cache} is full (No space left on device")
    assert "3 section state(s) saved now" in message and "rag warm --sections` again" in message
    assert len(calls) == 4 and len(seen) == 3  # stopped at the first failure: no section prefilled after it
    n = int(message.split(" without a state")[0].split(" of ")[-1])
    calls.fail_after = None  # room again: the rerun saves only what is missing
    with pipeline(moe, tmp_path) as rag:
        again = rag.warm_sections()
    assert (again["saved"], again["cached"], again["not_saved"]) == (n - 3, 3, 0) and again["sections"] == n


def test_a_full_disk_is_exit_4_for_rag_warm_sections(moe, tmp_path, shelf, monkeypatch):
    from pipeline.cli import cli

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        rag.warm_sections()
        rag.prefix_cache.forget()
    for key, value in settings(moe, tmp_path).items():
        monkeypatch.setenv("RAG_" + key.replace(".", "_").upper(), str(value))
    _writes(monkeypatch, fail_after=1)
    result = CliRunner().invoke(cli, ["warm", "--sections"])
    assert result.exit_code == 4, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("Error: the disk holding the prefix cache") and "is full" in lines[-1]
    assert sum(line.startswith("Error:") for line in lines) == 1 and "could not save" not in result.output


def test_warm_on_a_real_full_disk_says_so_and_exits_4(moe, tmp_path, shelf, monkeypatch):
    from pipeline.cli import cli

    ingest(moe, tmp_path / "x", shelf)
    with small_disk(tmp_path / "disk", size="16m") as disk:
        cache = disk.path / "cache"
        fixed = {"cache.path": str(cache), "cache.max_gb": 1}  # a cap above the disk: the disk fills first
        with pipeline(moe, tmp_path, **fixed) as rag:
            first = rag.warm_sections()
            state = first["bytes_written"] // first["saved"]
            rag.prefix_cache.forget()
        disk.fill(free=int(2.5 * state) + (64 << 10))
        for key, value in settings(moe, tmp_path, **fixed).items():
            monkeypatch.setenv("RAG_" + key.replace(".", "_").upper(), str(value))
        result = CliRunner().invoke(cli, ["warm", "--sections"])
        assert result.exit_code == 4, result.output
        assert result.output.strip().splitlines()[-1].startswith(f"Error: the disk holding the prefix cache {cache} "
                                                                 "is full")
        saved = len(list(cache.glob("*.state")))
        assert 1 <= saved < first["sections"]
        disk.empty()
        again = json.loads(CliRunner().invoke(cli, ["warm", "--sections", "--json"]).output)
    assert again["cached"] >= saved - 1 and again["saved"] + again["cached"] == again["sections"]


def test_a_question_whose_states_cannot_be_saved_says_so_once(moe, tmp_path, shelf, monkeypatch):
    ingest(moe, tmp_path, shelf)
    calls = _writes(monkeypatch, fail_after=0)
    with pipeline(moe, tmp_path) as rag:
        answer = rag.ask(QUESTION)
    st = answer.stats
    assert st.cache == "composed" and st.states_saved == 0 and len(st.sections) >= 3
    full = [n for n in st.notes if "is full" in n]
    assert len(full) == 1, st.notes
    assert full[0].startswith(f"{len(st.sections)} section states not saved: the disk holding the prefix cache")
    assert len(calls) <= 2  # the head's state and one section's: no other write is tried


# -- state files deleted, cut short, flipped --------------------------------------------------------


def _tokens_of(path) -> tuple[int, ...]:
    """The tokens a section state file holds (llama.cpp's sequence state header: magic, version, count)."""
    import struct

    data = path.read_bytes()
    n = struct.unpack_from("<I", data, 8)[0]
    return struct.unpack_from(f"<{n}i", data, 12)


@pytest.mark.parametrize("fault", ["deleted", "truncated", "flipped"])
def test_warm_checks_each_state_and_saves_the_bad_ones_again(moe, tmp_path, shelf, fault):
    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        first = rag.warm_sections()
        entries = _section_entries(rag)
    n = first["sections"]
    assert len(entries) == n
    for e in entries[1:4]:
        path = tmp_path / "cache" / e.file
        if fault == "deleted":
            path.unlink()
        elif fault == "truncated":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    with pipeline(moe, tmp_path) as rag:
        report = rag.warm_sections()
        again = rag.warm_sections()
    assert (report["saved"], report["cached"], report["repaired"]) == (3, n - 3, 3)
    assert "3 section state(s) were missing or damaged: saved again" in report["notes"]
    assert (again["saved"], again["cached"], again["repaired"]) == (0, n, 0)
    with pipeline(moe, tmp_path) as rag:
        st = rag.ask(QUESTION).stats
    assert st.composed_sections == len(st.sections) and st.sections_lost == []


def test_the_packers_probe_does_not_count_a_state_whose_file_is_gone(moe, tmp_path, shelf):
    from pipeline.engine.cache.sections import SectionStates
    from pipeline.records import Piece

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        rag.warm_sections()
        entries = _section_entries(rag)
        pieces = [Piece(_tokens_of(rag.prefix_cache.directory / e.file)) for e in entries]
        (rag.prefix_cache.directory / entries[2].file).unlink()
        states = SectionStates(rag.prefix_cache, rag.engine.namespace, rag.runtime.layout().head_tokens)
        try:
            held = states.held(pieces)
        finally:
            states.close()
        assert len(rag.prefix_cache.entries(states.namespace)) == len(entries)  # a probe: nothing dropped
    assert held == [i != 2 for i in range(len(entries))]


# -- two warms at once --------------------------------------------------------------------------------


def test_a_second_warm_waits_for_the_first_and_its_counts_add_up(moe, tmp_path, shelf, monkeypatch):
    """The first warm is held after its first save until the second has found the warm lock taken
    (no timing: each step waits for the one before); the second then finds every state the first saved."""
    import fcntl

    import pipeline.engine.cache.directory as directory
    import pipeline.engine.cache.prefix_cache as store

    ingest(moe, tmp_path, shelf)
    first_saved, second_blocked, go = threading.Event(), threading.Event(), threading.Event()
    locked = set()  # the threads holding the warm lock
    reports: dict[str, dict] = {}
    errors = []
    real_write = store.write_state

    def write_state(*args, **kwargs):
        written = real_write(*args, **kwargs)
        name = threading.current_thread().name
        if name == "first" and name in locked and not first_saved.is_set():  # a section state, lock held
            first_saved.set()
            go.wait(600)
        return written

    class Flock:
        def __getattr__(self, name):
            return getattr(fcntl, name)

        @staticmethod
        def flock(fd, op):
            try:
                done = fcntl.flock(fd, op)
                locked.add(threading.current_thread().name)
                return done
            except BlockingIOError:
                if threading.current_thread().name == "second":
                    second_blocked.set()
                raise

    monkeypatch.setattr(store, "write_state", write_state)
    monkeypatch.setattr(directory, "fcntl", Flock())

    def warm(name: str) -> None:
        try:
            with pipeline(moe, tmp_path) as rag:
                reports[name] = rag.warm_sections()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            first_saved.set()  # never leave the other thread waiting
            go.set()

    first = threading.Thread(target=warm, args=("first",), name="first")
    first.start()
    assert first_saved.wait(600)
    second = threading.Thread(target=warm, args=("second",), name="second")
    second.start()
    assert second_blocked.wait(600)
    go.set()
    first.join(600)
    second.join(600)
    assert not errors, errors
    n = reports["first"]["sections"]
    assert (reports["first"]["saved"], reports["first"]["cached"]) == (n, 0)
    assert (reports["second"]["saved"], reports["second"]["cached"], reports["second"]["not_saved"]) == (0, n, 0)
    assert reports["second"]["prefilled_tokens"] == 0
    assert "waited for another process warming the same section states" in reports["second"]["notes"]


# -- a cache index deleted ------------------------------------------------------------------------------


def test_sections_lost_with_a_deleted_index_are_said_so_not_evicted(moe, tmp_path, shelf):
    from pipeline.engine.cache.sections import LOST

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        warmed = rag.warm_sections()
    orphans = list((tmp_path / "cache").glob("*.state"))
    assert len(orphans) > warmed["sections"]
    for p in (tmp_path / "cache").glob("index.sqlite*"):
        p.unlink()
    with pipeline(moe, tmp_path) as rag:
        st = rag.ask(QUESTION).stats
        left = [p for p in orphans if p.exists()]
    assert st.cache == "composed" and st.composed_sections == 0
    assert st.sections_lost == [LOST] * len(st.sections)
    assert f"{len(st.sections)} sections: lost with the cache index" in st.reuse_lost
    assert any(n.startswith("the prefix cache index") and f"{len(orphans)} orphaned state file(s)" in n
               for n in st.notes), st.notes
    assert left == []  # removed at once, not left outside cache.max_gb until a sweep


def test_a_warm_that_waits_for_another_says_so_and_can_be_cancelled_meanwhile(moe, tmp_path, shelf):
    """A second warming of the same states waits for the first: its progress says what it waits for (and
    whose), from the moment it waits, and a cancel stops the wait at once."""
    from pipeline.engine.cache.sections import namespace
    from pipeline.engine.context_lock import CancelToken
    from pipeline.errors import Cancelled

    ingest(moe, tmp_path, shelf)
    with pipeline(moe, tmp_path) as rag:
        ns = namespace(rag.engine.namespace, rag.runtime.layout().head_tokens, rag.prefix_cache.section_type)
        held, release = threading.Event(), threading.Event()

        def other() -> None:  # another process's warm, as far as the lock file can tell
            with rag.prefix_cache.exclusive(f"sections-{ns[:32]}.lock"):
                held.set()
                release.wait(120)

        holder = threading.Thread(target=other)
        holder.start()
        assert held.wait(60)
        stages: list[str] = []
        token = CancelToken()

        def progress(p) -> None:
            stages.append(p.stage)
            if p.stage.startswith("waiting for another"):
                token.cancel()

        with pytest.raises(Cancelled):
            rag.warm_sections(progress=progress, cancel=token)
        assert any(s.startswith(f"waiting for another rag process (pid {os.getpid()})") for s in stages)
        release.set()
        holder.join(60)
        report = rag.warm_sections()  # the lock free: it saves everything
    assert report["saved"] + report["cached"] == report["sections"]
