"""Prefix-cache faults cost time, never an answer: a damaged index, a read-only directory, a cache path
that is a file, a busy index, files orphaned by a lost index. ``rag cache stats`` and ``clear`` still work.

The cache-level tests need no model; the answer-level ones run a tiny generated model in llama.cpp (the
real engine, so the real save and restore paths) with the fake embedder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.engine.cache import directory as cache_dir
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.cache.index import INDEX_NAME
from pipeline.engine.cache.keys import block_hash, chain_hashes, full_hash, token_bytes
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TOKENS = list(range(1000, 1600))


def fake_entry(cache: PrefixCache, n: int = 300, *, ns: str = "ns", name: str | None = None) -> str:
    """Index a prefix of :data:`TOKENS` with a state file that is only bytes (enough for lookups)."""
    data = token_bytes(TOKENS[:n])
    name = name or f"fake{n}.state"
    (cache.directory / name).write_bytes(b"x" * 100)
    with contextlib.closing(sqlite3.connect(cache.directory / INDEX_NAME)) as db, db:
        db.execute("INSERT INTO entries (namespace, n_tokens, full_hash, block_hash, file, bytes, digest, created, "
                   "last_used, hits) VALUES (?, ?, ?, ?, ?, 100, 'x', 1, 1, 0)",
                   (ns, n, full_hash(data), block_hash(n, chain_hashes(data)), name))
    return name


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def damage(index: Path) -> None:
    index.write_bytes(b"this is not an SQLite database, it was overwritten" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)


# --------------------------------------------------------------------------- the cache alone


def test_a_damaged_index_is_rebuilt_on_open_and_its_orphans_swept(tmp_path):
    directory = tmp_path / "cache"
    with PrefixCache(directory, max_bytes=2**30) as cache:
        old = fake_entry(cache, 300)
        young = fake_entry(cache, 400)
        assert cache.lookup("ns", TOKENS).n_tokens == 400
    age(directory / old, 3600)
    damage(directory / INDEX_NAME)
    with PrefixCache(directory, max_bytes=2**30) as cache:
        assert not cache.unavailable
        (note,) = cache.take_notes()
        assert "was damaged" in note and "rebuilt empty" in note and "1 orphaned state file(s) removed" in note
        assert cache.lookup("ns", TOKENS) is None and cache.stats()["entries"] == 0
        assert not (directory / old).exists() and (directory / young).exists()  # a minute's grace
        assert cache.take_notes() == []


def test_damage_seen_mid_run_is_rebuilt_and_costs_one_miss(tmp_path, monkeypatch):
    from pipeline.engine.cache.index import CacheIndex

    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    fake_entry(cache, 300)
    assert cache.lookup("ns", TOKENS).n_tokens == 300
    # Damaged under an open connection (after a checkpoint, so that closing it cannot write the pages
    # back), which SQLite may not notice at once: its WAL index still answers. The query that does notice
    # raises:
    with contextlib.closing(sqlite3.connect(cache.directory / INDEX_NAME)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    damage(cache.directory / INDEX_NAME)
    with monkeypatch.context() as m:
        m.setattr(CacheIndex, "candidates", lambda *a: (_ for _ in ()).throw(
            sqlite3.DatabaseError("database disk image is malformed")))
        assert cache.lookup("ns", TOKENS) is None and "lookup failed" in cache.last_error
    assert any("rebuilt empty" in n for n in cache.take_notes())
    assert cache.stats()["entries"] == 0 and cache.lookup("ns", TOKENS) is None and cache.last_error == ""
    cache.close()


def test_a_cache_path_that_is_a_file_makes_the_cache_unavailable_not_an_error(tmp_path):
    path = tmp_path / "cache"
    path.write_text("not a directory")
    cache = PrefixCache(path, max_bytes=2**30)
    assert "is not a directory" in cache.unavailable
    assert cache.lookup("ns", TOKENS) is None
    assert cache.save("ns", TOKENS, model=None) is None and "unavailable" in cache.last_error
    with pytest.raises(ConfigError, match="is not a directory"):
        cache.stats()
    with pytest.raises(ConfigError, match="is not a directory"):
        cache.clear()
    assert path.read_text() == "not a directory"  # never touched
    cache.close()


def test_a_busy_index_makes_a_miss(tmp_path):
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30, timeout=0.1)
    fake_entry(cache, 300)
    other = sqlite3.connect(cache.directory / INDEX_NAME, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another process in the middle of a long write
    try:
        assert cache.lookup("ns", TOKENS[:200]) is None and "locked" in cache.last_error
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert cache.lookup("ns", TOKENS).n_tokens == 300 and cache.last_error == ""
    cache.close()


def test_orphans_of_a_lost_index_are_swept_at_most_once_an_hour(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    with PrefixCache(directory, max_bytes=2**30) as cache:
        names = [fake_entry(cache, n) for n in (300, 400)]
    for name in names:
        age(directory / name, 3600)
    (directory / INDEX_NAME).unlink()  # the index is lost: the state files are orphans
    with PrefixCache(directory, max_bytes=2**30) as cache:
        assert cache.take_notes() == [f"the prefix cache index {directory / INDEX_NAME} was missing: rebuilt empty, "
                                      "2 orphaned state file(s) (0.0 MB) removed (their prefixes are computed again "
                                      "and saved)"]
        assert not any((directory / n).exists() for n in names)
        gone = fake_entry(cache, 500)
        (directory / gone).unlink()  # a row whose file vanished
        orphan = directory / "deadbeef-0000.state"
        orphan.write_bytes(b"x")
        age(orphan, 3600)
    with PrefixCache(directory, max_bytes=2**30) as cache:  # swept a moment ago: not again
        assert orphan.exists() and cache.stats()["entries"] == 1
    monkeypatch.setattr(cache_dir, "SWEEP_INTERVAL", 0.0)
    with PrefixCache(directory, max_bytes=2**30) as cache:
        assert not orphan.exists() and cache.stats()["entries"] == 0


def test_a_lost_index_is_said_and_its_orphans_are_removed_at_once(tmp_path):
    """States saved a moment ago and orphaned by a deleted index stay outside cache.max_gb until the next
    sweep unless they are removed when the new index is made; a temporary file may be a save in flight."""
    directory = tmp_path / "cache"
    with PrefixCache(directory, max_bytes=2**30) as cache:
        names = [fake_entry(cache, n) for n in (300, 400, 500)]
        old = cache.index_created
    in_flight = directory / ".cafe-0000.state.123.tmp"
    in_flight.write_bytes(b"x")
    for p in directory.glob(INDEX_NAME + "*"):
        p.unlink()
    with PrefixCache(directory, max_bytes=2**30) as cache:
        notes = cache.take_notes()
        assert len(notes) == 1 and notes[0].startswith(f"the prefix cache index {directory / INDEX_NAME} was "
                                                       "missing: rebuilt empty, 3 orphaned state file(s)")
        assert not any((directory / n).exists() for n in names) and in_flight.exists()
        assert cache.stats()["entries"] == 0 and cache.index_created > old > 0
    with PrefixCache(directory, max_bytes=2**30) as cache:  # the same index, opened again: nothing to say
        assert cache.take_notes() == [] and cache.index_created > old


READ_ONLY_CHECK = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.errors import EngineError
    cache = PrefixCache(sys.argv[1], max_bytes=2**30)
    assert not cache.unavailable and cache.read_only, cache.unavailable
    assert any("read-only" in n for n in cache.take_notes())
    entry = cache.lookup("ns", list(range(1000, 1600)))
    assert entry is not None and entry.n_tokens == 300, cache.last_error
    assert cache.save("ns", [1, 2, 3], model=None) is None and "read-only" in cache.last_error
    assert cache.stats()["entries"] == 1
    try:
        cache.clear()
    except EngineError as exc:
        assert "read-only" in str(exc)
    else:
        raise AssertionError("clear() on a read-only cache did not refuse")
    print("read-only ok")
""")


def test_a_read_only_cache_directory_still_serves_its_states(tmp_path):
    """As a user who cannot write the directory (as root, whom permissions do not stop, through ``nobody``)."""
    directory = Path(tempfile.mkdtemp(prefix="rag-ro-cache-"))  # outside tmp_path, which only root may enter
    try:
        with PrefixCache(directory, max_bytes=2**30) as cache:
            fake_entry(cache, 300)
        os.chmod(directory, 0o555)
        cmd = [sys.executable, "-c", READ_ONLY_CHECK, str(directory), str(ROOT)]
        kwargs: dict = {}
        if os.geteuid() == 0:
            cmd[0] = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
            kwargs = dict(preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)), cwd="/")
        out = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        assert out.returncode == 0 and "read-only ok" in out.stdout, out.stderr
    finally:
        os.chmod(directory, 0o755)
        shutil.rmtree(directory)


# --------------------------------------------------------------------------- rag cache stats / clear


def run(*args):
    return CliRunner().invoke(cli, list(args))


def test_cache_stats_and_clear_work_on_a_damaged_index(tmp_store, tmp_path):
    directory = tmp_path / "cache"  # RAG_CACHE_PATH (tmp_store)
    with PrefixCache(directory, max_bytes=2**30) as cache:
        fake_entry(cache, 300)
    damage(directory / INDEX_NAME)
    out = run("cache", "stats", "--json")
    assert out.exit_code == 0, out.output
    stats = json.loads(out.stdout)
    assert stats["entries"] == 0 and "rebuilt empty" in out.stderr
    damage(directory / INDEX_NAME)
    out = run("cache", "clear", "--yes")
    assert out.exit_code == 0 and "deleted 0 cached prefix states" in out.stdout
    assert not list(directory.glob("*.state"))
    assert json.loads(run("cache", "stats", "--json").stdout)["entries"] == 0


def test_cache_commands_on_a_path_that_is_a_file_say_so(tmp_store, tmp_path, monkeypatch):
    path = tmp_path / "a-file"
    path.write_text("x")
    monkeypatch.setenv("RAG_CACHE_PATH", str(path))
    for args in (("cache", "stats"), ("cache", "clear", "--yes")):
        out = run(*args)
        assert out.exit_code == 2 and "is not a directory" in out.output and "Traceback" not in out.output



def _cache_stats_is_exit_4(directory: Path) -> None:
    for args in (("cache", "stats"), ("cache", "stats", "--json"), ("cache", "clear", "--yes")):
        out = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "RAG_CACHE_PATH": str(directory)})
        assert out.returncode == 4, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and "full" in lines[0], out.stderr
        assert "Traceback" not in out.stderr


def test_cache_stats_on_a_real_full_disk_with_no_cache_folder_yet_is_exit_4(tmp_store, tmp_path):
    from support.full_disk import small_disk

    with small_disk(tmp_path / "disk", size="1m") as disk:
        disk.fill(free=0)
        _cache_stats_is_exit_4(disk.path / "cache")


def test_cache_stats_when_its_index_cannot_be_made_for_lack_of_space_is_exit_4(tmp_store, tmp_path, monkeypatch):
    """The twin of the real full disk: SQLite's own words, injected."""
    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(cache_dir, "CacheIndex", full)
    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    for args in (("cache", "stats"), ("cache", "clear", "--yes")):
        out = run(*args)
        assert out.exit_code == 4 and "full" in out.output and "Traceback" not in out.output, out.output

# --------------------------------------------------------------------------- answers


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from devtools.synthetic import write_moe_model

    return write_moe_model(tmp_path_factory.mktemp("model") / "tiny-moe.gguf", n_ctx_train=4096)


@pytest.fixture
def asker(fake_pipeline, tiny_model, corpus):
    """ask(**overrides): a new pipeline (a new process, as far as the cache knows) answering one question
    about one document with the tiny model, greedy."""
    fake_pipeline().ingest([corpus / "guide.md"])

    def ask(**overrides):
        from support.fakes import HashEmbedder
        from pipeline import Pipeline

        settings = {"models.generator": str(tiny_model), "engine.n_ctx": 2048, "engine.threads": 1,
                    "ask.max_tokens": 6, "cache.min_tokens": 16, **overrides}
        with Pipeline.from_config(overrides=settings, embedder=HashEmbedder()) as rag:
            return rag.ask("What does --n-cpu-moe do?", doc=corpus / "guide.md")

    return ask


def test_a_damaged_index_costs_one_uncached_answer(asker, tmp_path):
    plain = asker(**{"cache.enabled": False})
    first = asker()
    assert first.stats.cache == "miss" and first.text == plain.text
    damage(tmp_path / "cache" / INDEX_NAME)
    hurt = asker()
    assert hurt.text == plain.text and hurt.stats.cache == "miss" and hurt.stats.cached_tokens == 0
    assert any("was damaged" in n and "rebuilt empty" in n for n in hurt.notes)
    healed = asker()  # the rebuilt index holds the state saved by the answer before
    assert healed.stats.cache == "disk" and healed.text == plain.text


def test_a_cache_path_that_is_a_file_costs_time_not_the_answer(asker, tmp_path):
    plain = asker(**{"cache.enabled": False})
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    answer = asker(**{"cache.path": str(path)})
    assert answer.text == plain.text and answer.stats.cache == "none"
    assert any("prefix cache is unavailable" in n and "is not a directory" in n for n in answer.notes)


def test_warm_refuses_an_unusable_cache(fake_pipeline, tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(ConfigError, match="cannot save states.*is not a directory"):
        fake_pipeline(cache__path=str(path)).warm()


def test_clear_deletes_entries_states_and_left_over_temporary_files(tmp_path):
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        fake_entry(cache, 300)
        (cache.directory / "cafe-0000.state").write_bytes(b"orphan")
        (cache.directory / ".cafe-0001.state.1.tmp").write_bytes(b"torn")
        assert cache.clear() == 1
        assert not [p for p in cache.directory.iterdir() if p.suffix in (".state", ".tmp")]
        assert cache.stats()["entries"] == 0
