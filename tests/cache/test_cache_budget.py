"""The prefix cache's budget and eviction: a cap that follows the disk, the least useful states first."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline import disk
from pipeline.config import load_config
from pipeline.engine import _llama
from pipeline.engine._llama import composing as mem
from pipeline.engine.cache import capacity
from pipeline.engine.cache.index import CacheIndex
from pipeline.engine.cache.sections import SectionStates
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.reuse.compose import Piece, compute
from pipeline.errors import ConfigError

GiB, MiB = 2**30, 2**20


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    from devtools.synthetic import write_moe_model

    return write_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture
def model(moe):
    m = _llama.load(moe, n_ctx=1024, n_batch=512, n_ubatch=512, threads=2, flash_attn=True, n_seq_max=3)
    yield m
    m.close()


class FakeDisk:
    """A file system of ``size`` bytes whose free space is what the cache directory's files and ``others``
    leave of ``room``: what ``os.statvfs`` reports for any path while it is installed."""

    def __init__(self, directory: Path, *, size: int, room: int):
        self.directory, self.size, self.room, self.others = directory, size, room, 0

    def used_by_cache(self) -> int:
        return sum(p.stat().st_size for p in self.directory.glob("*.state")) if self.directory.exists() else 0

    def statvfs(self, path):
        free = max(0, self.room - self.others - self.used_by_cache())
        return os.statvfs_result((4096, 1, self.size, free, free, 1000, 1000, 1000, 0, 255))


def put(cache: PrefixCache, model, ns: str, n: int = 200, salt: int = 0):
    tokens = [(salt * 31 + i * 7) % 250 + 5 for i in range(n)]
    model.clear()
    mem.decode_outputs(model, np.asarray(tokens, np.int32), 0)
    entry = cache.save(ns, tokens, model)
    assert entry is not None, cache.last_error
    return entry, tokens


# -- the cap -----------------------------------------------------------------------------------------


def test_the_automatic_cap_is_half_the_disk_room_less_a_margin(tmp_path, monkeypatch):
    fake = FakeDisk(tmp_path, size=100 * GiB, room=60 * GiB)
    monkeypatch.setattr(disk.os, "statvfs", fake.statvfs)
    # margin: a tenth of 100 GiB (more than 2 GiB); half of the free 60 GiB plus the 4 GiB the cache holds, less it
    assert capacity.cap(tmp_path, 4 * GiB) == (60 * GiB + 4 * GiB - 10 * GiB) // 2
    assert capacity.cap(tmp_path, 4 * GiB, max_bytes=3 * GiB) == 3 * GiB  # a cap that is set wins
    small = FakeDisk(tmp_path, size=8 * GiB, room=GiB)
    monkeypatch.setattr(disk.os, "statvfs", small.statvfs)
    assert capacity.cap(tmp_path, 0) == 0  # less room than the 2 GiB margin: nothing is saved


def test_an_automatic_cache_follows_its_disk(model, tmp_path, monkeypatch):
    """The cap stays put while the cache fills (what it holds counts as room), shrinks when other files
    fill the disk (the next save evicts down to it) and grows when they go; a set cap ignores the disk."""
    directory = tmp_path / "cache"
    fake = FakeDisk(directory, size=20 * GiB, room=2 * GiB + MiB)  # margin 2 GiB: half of 1 MiB is the cap
    monkeypatch.setattr(disk.os, "statvfs", fake.statvfs)
    cache = PrefixCache(directory, max_bytes=0)
    assert cache.auto and cache.budget_bytes() == MiB // 2 == cache.room()
    first, tokens = put(cache, model, "ns", salt=0)
    assert cache.budget_bytes() == MiB // 2
    assert cache.room() == MiB // 2  # never restored: a new state would replace it
    model.clear()
    assert cache.load(first, model)
    assert cache.room() == MiB // 2 - first.bytes  # restored: new states would not evict it
    for i in range(1, 12):
        put(cache, model, "ns", salt=i)
    st = cache.stats()
    assert st["budget"] == "auto" and st["max_bytes"] == MiB // 2
    assert st["evictions"] > 0 and st["bytes"] <= MiB // 2 < st["bytes"] + first.bytes
    assert first.file in {e.file for e in cache.entries()}  # the one restored outlives the others
    fake.others = MiB // 2  # another program takes half the room: the cap halves, the next save evicts
    assert cache.budget_bytes() == MiB // 4
    newest, _ = put(cache, model, "ns", salt=50)
    assert cache.stats()["bytes"] <= MiB // 4
    assert {first.file, newest.file} <= {e.file for e in cache.entries()}
    fake.others = 0
    assert cache.budget_bytes() == MiB // 2
    fixed = PrefixCache(directory, max_bytes=3 * MiB)
    assert not fixed.auto and fixed.budget_bytes() == 3 * MiB and fixed.stats()["budget"] == "fixed"


def test_cache_max_gb_zero_is_the_default_and_means_auto(tmp_path, monkeypatch):
    assert load_config(environ={}).cache.max_gb == 0
    assert load_config(environ={"RAG_CACHE_MAX_GB": "0"}).cache.max_gb == 0
    assert load_config(environ={"RAG_CACHE_MAX_GB": "2.5"}).cache.max_gb == 2.5
    with pytest.raises(ConfigError, match="cache.max_gb must be between 0 and"):
        load_config(environ={"RAG_CACHE_MAX_GB": "-1"})
    with pytest.raises(ConfigError, match='cache.section_type must be "f16" or "q8_0"'):
        load_config(environ={"RAG_CACHE_SECTION_TYPE": "q4_0"})


# -- the least useful first --------------------------------------------------------------------------


def test_a_used_state_outlives_a_newer_one_never_used(model, tmp_path):
    """LRU would evict A (saved first, last used before B was saved); A was restored three times and B
    never, so B goes."""
    a, tokens_a = put(PrefixCache(tmp_path / "probe", max_bytes=2**30), model, "ns")
    cache = PrefixCache(tmp_path / "cache", max_bytes=int(a.bytes * 2.5))
    a, tokens_a = put(cache, model, "ns", salt=1)
    for _ in range(3):
        model.clear()
        assert cache.load(cache.lookup("ns", tokens_a + [1]), model)
    time.sleep(0.01)
    b, _ = put(cache, model, "ns", salt=2)
    assert b.last_used > cache.entries()[-1].last_used  # B is the more recent
    c, _ = put(cache, model, "ns", salt=3)
    assert {e.file for e in cache.entries()} == {a.file, c.file}
    assert not (cache.directory / b.file).exists()


def test_prefix_and_section_states_share_one_policy(model, tmp_path):
    """A section state restored by several questions outlives prefix states saved after it and never used."""
    head = [5, 6, 7, 8]
    section = Piece(tuple((i * 11) % 250 + 5 for i in range(200)))
    probe, _ = put(PrefixCache(tmp_path / "probe", max_bytes=2**30), model, "ns")
    cache = PrefixCache(tmp_path / "cache", max_bytes=int(probe.bytes * 2.5))
    states = SectionStates(cache, "engine", head)
    model.clear()
    mem.decode_outputs(model, np.asarray(head, np.int32), 0)
    compute(model, len(head), section, states, scratch=1)
    for _ in range(3):
        mem.seq_remove(model, 1)
        assert states.restore(section, model, 1, len(head))
    prefixes = [put(cache, model, "ns", salt=i)[0] for i in range(3)]
    kept = {e.file for e in cache.entries()}
    assert states.find(section).file in kept and prefixes[0].file not in kept and prefixes[-1].file in kept
    states.close()


def test_eviction_weighs_uses_against_time_unused(tmp_path):
    """Worth per byte = (uses + 1) x tokens / bytes, halved per day unused: ordered on a real index."""
    index = CacheIndex(tmp_path / "index.sqlite")
    now = 1_000_000_000.0
    day = capacity.HALF_LIFE

    def add(name, *, hits, age, tokens=1000, size=1000):
        with index.write() as db:
            i = index.insert(db, namespace="ns", n_tokens=tokens, full_hash=name, block_hash=name, file=name,
                             size=size, digest="", now=now - age)
            db.execute("UPDATE entries SET hits = ? WHERE id = ?", (hits, i))

    add("used-often-long-ago", hits=5, age=10 * day)  # 6 x 2^-10: the least worth
    add("new-never-used", hits=0, age=0)  # 1
    add("used-often-yesterday", hits=5, age=day)  # 6 x 1/2 = 3
    add("never-used-an-hour-ago", hits=0, age=3600)  # just under 1
    add("q8-never-used-an-hour-ago", hits=0, age=3600, size=530)  # the same tokens in half the bytes: ~1.9
    order = []
    with index.write() as db:
        for cap in (4530, 3530, 2530, 1530, 1000):
            order += index.evict(db, cap, keep=None, now=now)
    assert order == ["used-often-long-ago", "never-used-an-hour-ago", "new-never-used", "q8-never-used-an-hour-ago"]
    index.close()


def test_states_of_one_kind_saved_moments_apart_go_oldest_first_whatever_their_length(tmp_path):
    """A state's fixed overhead makes a longer state a hair denser: that must not outrank age, or a warm
    that saves its most useful sections first would lose them first to the sections it saves after."""
    index = CacheIndex(tmp_path / "index.sqlite")
    now = 1_000_000_000.0
    for name, tokens, age in (("first-shorter", 523, 2.0), ("then-longer", 556, 1.0), ("last", 540, 0.0)):
        with index.write() as db:
            index.insert(db, namespace="ns", n_tokens=tokens, full_hash=name, block_hash=name, file=name,
                         size=12 + 4 * tokens + 40 + tokens * 288, digest="", now=now - age)
    with index.write() as db:
        order = index.evict(db, 0, keep=None, now=now)
    assert order == ["first-shorter", "then-longer", "last"]
    index.close()


def test_cache_stats_show_the_budget_in_force(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    from pipeline.cli import cli

    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    fake = FakeDisk(tmp_path / "cache", size=100 * GiB, room=30 * GiB)
    monkeypatch.setattr(disk.os, "statvfs", fake.statvfs)
    runner = CliRunner()
    auto = json.loads(runner.invoke(cli, ["cache", "stats", "--json"]).output)
    assert auto["budget"] == "auto" and auto["max_bytes"] == (30 - 10) * GiB // 2
    monkeypatch.setenv("RAG_CACHE_MAX_GB", "3")
    fixed = json.loads(runner.invoke(cli, ["cache", "stats", "--json"]).output)
    assert fixed["budget"] == "fixed" and fixed["max_bytes"] == 3 * GiB
