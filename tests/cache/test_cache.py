"""The prefix KV cache on real llama.cpp: exact answers from restored states, damage detected, LRU, indexed lookup."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from devtools.synthetic import write_moe_model
from pipeline.config import EngineConfig
from pipeline.engine.cache.index import INDEX_NAME, CacheIndex
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.cache.keys import BLOCK, SHORT_BLOCK_HASH, block_hash, chain_hashes, full_hash, namespace, \
    token_bytes
from pipeline.engine.local import Engine
from pipeline.models import file_identity

SETTINGS = EngineConfig(n_ctx=1024, threads=2)
QUESTION = "Question: which colour is the lighthouse on the northern island, and who painted it? Answer:"


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> Path:
    return write_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture(scope="module")
def smol_path(model_home) -> Path:
    from pipeline.models import resolve

    return resolve("builtin:SmolLM2-135M-Instruct", home=model_home, fetch=False)


def ns_of(path: Path) -> str:
    s = SETTINGS
    return namespace(file_identity(path), n_ctx=s.n_ctx, type_k=s.type_k, type_v=s.type_v, flash_attn=s.flash_attn)


def passage(n_sentences: int) -> str:
    return " ".join(f"Note {i}: the lighthouse on island {i % 7} was painted {('red', 'white', 'blue')[i % 3]} "
                    f"by {('Ada', 'Ben', 'Cleo', 'Dan')[i % 4]}." for i in range(n_sentences))


def prompt_parts(eng: Engine, n_sentences: int) -> tuple[list[int], list[int]]:
    """(reusable prefix, question suffix) tokens; the prefix ends where the question starts."""
    text = eng.chat("Answer from the documents.", "Documents:\n" + passage(n_sentences) + "\n\n" + QUESTION)
    cut = text.index(QUESTION)
    # the whole text is the template's rendering: its markup must become control tokens
    return eng.bos + eng.tokenize(text[:cut], special=True), eng.tokenize(text[cut:], special=True)


def answer(eng: Engine, tokens: list[int], n: int = 10):
    """Greedy answer tokens of ``tokens`` (reusing whatever prefix the engine's KV holds) and the stats."""
    gen = eng.generate(tokens, max_tokens=n, temperature=0.0, repeat_penalty=1.0)
    gen.read()
    return eng.held_tokens[len(tokens):], gen.stats


def seq_end(eng: Engine) -> int:
    return eng.llm.seq_end()


def trim(eng: Engine, n: int) -> None:
    assert eng.keep(n)


def restored(eng: Engine, cache: PrefixCache, ns: str, tokens: list[int]) -> int:
    """Look up and load the longest saved prefix of ``tokens`` into ``eng``; the tokens it covers."""
    entry = cache.lookup(ns, tokens)
    if entry is None or not eng.restore(cache, entry, tokens):
        eng.reset()
        return 0
    return entry.n_tokens


# --------------------------------------------------------------------------- exact answers


@pytest.mark.parametrize("model", [pytest.param("smollm2", marks=pytest.mark.slow), "moe"])
def test_restored_prefix_gives_the_same_answer(model, moe_path, request, tmp_path):
    path = request.getfixturevalue("smol_path") if model == "smollm2" else moe_path
    ns = ns_of(path)
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    saver = Engine(path, SETTINGS)
    prefix, suffix = prompt_parts(saver, 15 if model == "smollm2" else 4)
    prompt = prefix + suffix
    assert 256 < len(prefix) < 320 and len(prompt) < 400

    saver.prefill(prefix)
    t0 = time.perf_counter()
    entry = cache.save(ns, prefix, saver.llm)
    save_seconds = time.perf_counter() - t0
    assert entry is not None and entry.n_tokens == len(prefix), cache.last_error
    assert (tmp_path / "cache" / entry.file).stat().st_size == entry.bytes
    # the same prefix again: no second file, the entry is returned
    assert cache.save(ns, prefix, saver.llm).id == entry.id and cache.stats()["entries"] == 1

    saver.reset()  # the reference: no cache at all
    expected, st = answer(saver, prompt)
    assert st.cached_tokens == 0 and st.prefill_tokens == len(prompt)
    assert len(expected) > 0
    saver.close()

    # A fresh engine and a second handle on the directory, as another process would have.
    other = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    fresh = Engine(path, SETTINGS)
    assert restored(fresh, other, ns, prompt) == len(prefix), other.last_error
    assert seq_end(fresh) == len(prefix) - 1
    got, st = answer(fresh, prompt)
    assert got == expected
    assert st.cached_tokens == len(prefix) and st.prefill_tokens == len(suffix)
    s = other.stats()
    assert s["hits"] == 1 and s["tokens_reused"] == len(prefix) and s["entry_hits"] == 1
    if model == "smollm2":
        per_token = entry.bytes / entry.n_tokens
        assert 20_000 < per_token < 26_000  # ~23 KB/token, f16 KV
        print(f"\nSmolLM2 {entry.n_tokens} tokens: {entry.bytes / 1e6:.1f} MB, {per_token:.0f} B/token, "
              f"save {save_seconds * 1000:.1f} ms, load {other.last_load_seconds * 1000:.1f} ms")
    fresh.close()


def test_state_saved_after_trimming_an_answer(saved, moe_path):
    """Saving off the TTFT path: answer first, cut the KV back to the prefix, then save (the
    ``saved`` fixture does exactly that); the restored state answers as a plain run did."""
    cache, ns, entry, tokens, expected = saved
    eng = Engine(moe_path, SETTINGS)
    assert restored(eng, cache, ns, tokens) == entry.n_tokens
    assert answer(eng, tokens)[0] == expected
    # A sequence that does not end where the prefix ends is refused, not saved wrongly.
    longer = tokens[:entry.n_tokens + 3]
    assert cache.save(ns, longer[:-1], eng.llm) is None and cache.last_error
    eng.close()


# --------------------------------------------------------------------------- damage


@pytest.fixture
def saved(moe_path, tmp_path):
    """A cache with one saved prefix, the prompt, and the answer computed without the cache."""
    ns = ns_of(moe_path)
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    eng = Engine(moe_path, SETTINGS)
    prefix, suffix = prompt_parts(eng, 3)
    expected, _ = answer(eng, prefix + suffix)
    trim(eng, len(prefix))
    entry = cache.save(ns, prefix, eng.llm)
    assert entry is not None
    eng.close()
    return cache, ns, entry, prefix + suffix, expected


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 16] = bytes(b ^ 0x5A for b in data[mid:mid + 16])
    path.write_bytes(data)


def damage_truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1000)


@pytest.mark.parametrize("damage, why", [(damage_flip, "checksum"), (damage_truncate, "bytes")])
def test_damaged_state_is_detected_deleted_and_the_answer_still_right(saved, moe_path, damage, why):
    cache, ns, entry, prompt, expected = saved
    path = cache.directory / entry.file
    damage(path)
    eng = Engine(moe_path, SETTINGS)
    found = cache.lookup(ns, prompt)
    assert found is not None and found.id == entry.id
    assert cache.load(found, eng.llm) is False
    assert why in cache.last_error
    assert not path.exists() and cache.stats()["entries"] == 0 and cache.stats()["failures"] == 1
    assert seq_end(eng) == -1  # the sequence is empty
    assert cache.lookup(ns, prompt) is None
    got, st = answer(eng, prompt)
    assert got == expected and st.cached_tokens == 0
    eng.close()


def test_state_holding_other_tokens_is_rejected_after_restore(saved, moe_path):
    """A file that passes the checks but holds another prefix: llama.cpp restores it, the tokens tell."""
    cache, ns, entry, prompt, expected = saved
    eng = Engine(moe_path, SETTINGS)
    other = eng.tokenize(passage(4)[::-1])[:200]
    eng.prefill(other)
    intruder = cache.save(ns, other, eng.llm)
    eng.reset()
    src = cache.directory / intruder.file
    with sqlite3.connect(cache.directory / INDEX_NAME) as db:  # point the entry at the intruder's file
        db.execute("UPDATE entries SET bytes = ?, digest = ? WHERE id = ?",
                   (intruder.bytes, intruder.digest, entry.id))
    os.replace(src, cache.directory / entry.file)
    found = cache.lookup(ns, prompt)
    assert cache.load(found, eng.llm) is False and "tokens" in cache.last_error
    assert seq_end(eng) == -1
    assert answer(eng, prompt)[0] == expected
    eng.close()


def test_missing_file_is_a_miss(saved, moe_path):
    cache, ns, entry, prompt, _ = saved
    (cache.directory / entry.file).unlink()
    eng = Engine(moe_path, SETTINGS)
    assert cache.load(cache.lookup(ns, prompt), eng.llm) is False
    assert cache.stats()["entries"] == 0
    eng.close()


# --------------------------------------------------------------------------- eviction, stats, clear


def test_lru_eviction_respects_max_bytes(moe_path, tmp_path):
    ns = ns_of(moe_path)
    eng = Engine(moe_path, SETTINGS)
    lists = [eng.tokenize(f"List {i}. " + passage(4))[:200] for i in range(4)]
    assert len({tuple(t) for t in lists}) == 4
    eng.prefill(lists[0])
    size = eng.llm.state_size() + 12 + 4 * 200
    cache = PrefixCache(tmp_path / "cache", max_bytes=int(size * 2.5))

    def put(tokens):
        eng.reset()
        eng.prefill(tokens)
        e = cache.save(ns, tokens, eng.llm)
        assert e is not None, cache.last_error
        return e

    a = put(lists[0])
    b = put(lists[1])
    eng.reset()
    assert cache.load(cache.lookup(ns, lists[0] + [1]), eng.llm)  # a is now used after b
    c = put(lists[2])
    files = {e.file for e in cache.entries()}
    assert files == {a.file, c.file}
    assert not (cache.directory / b.file).exists()
    s = cache.stats()
    assert s["entries"] == 2 and s["bytes"] <= s["max_bytes"] and s["evictions"] == 1 and s["saves"] == 3
    assert s["bytes"] == a.bytes + c.bytes and s["tokens"] == 400
    assert s["bytes_per_token"] == round((a.bytes + c.bytes) / 400, 1)
    assert s["namespaces"][ns]["entries"] == 2 and s["hits"] == 1

    # A state larger than the whole cap is not kept and evicts nothing.
    eng.reset()
    eng.prefill(lists[3] + eng.tokenize(passage(12)))
    big = eng.held_tokens
    assert cache.save(ns, big, eng.llm) is None and "larger" in cache.last_error
    assert {e.file for e in cache.entries()} == {a.file, c.file}

    assert cache.forget("another-namespace") == 0
    assert cache.clear() == 2
    s = cache.stats()
    assert s["entries"] == 0 and s["bytes"] == 0 and s["hits"] == 0
    assert sorted(p.name for p in cache.directory.iterdir() if p.suffix in (".state", ".tmp")) == []
    eng.close()


def test_namespace_keys():
    a = namespace("model-x", n_ctx=1024, type_k="f16", type_v="f16", flash_attn=True)
    assert a == namespace("model-x", flash_attn=True, type_v="f16", type_k="f16", n_ctx=1024)
    assert a != namespace("model-x", n_ctx=2048, type_k="f16", type_v="f16", flash_attn=True)
    assert a != namespace("model-x", n_ctx=1024, type_k="q8_0", type_v="f16", flash_attn=True)
    assert a != namespace("model-x", n_ctx=1024, type_k="f16", type_v="f16", flash_attn=False)
    assert a != namespace("model-y", n_ctx=1024, type_k="f16", type_v="f16", flash_attn=True)


def test_model_identity_follows_content(moe_path, tmp_path):
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(moe_path.read_bytes())
    assert file_identity(copy) == file_identity(moe_path)
    other = write_moe_model(tmp_path / "seed1.gguf", seed=1)
    assert file_identity(other) != file_identity(moe_path)


# --------------------------------------------------------------------------- indexed lookup


def test_lookup_is_indexed_and_fast_with_many_entries(tmp_path):
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**40)
    tokens = list(range(1000, 6000))  # 5000 tokens, 19 full blocks
    data = token_bytes(tokens)
    chain = chain_hashes(data)
    rows = []
    for i in range(2000):  # fake rows: random keys, no files, 10 namespaces
        h = hashlib.sha256(str(i).encode()).hexdigest()
        rows.append((f"ns{i % 10}", 300 + i, h, h, f"fake{i}.state", 1000, "x", 1.0, 1.0, 0))
    for n in (700, 3000):  # two real prefixes of the query, in ns0
        rows.append(("ns0", n, full_hash(data[:4 * n]), block_hash(n, chain), f"real{n}.state", 1000, "x",
                     1.0, 1.0, 0))
    with sqlite3.connect(cache.directory / INDEX_NAME) as db:
        db.executemany("INSERT INTO entries (namespace, n_tokens, full_hash, block_hash, file, bytes, digest, "
                       "created, last_used, hits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        keys = [SHORT_BLOCK_HASH] + chain
        plan = db.execute("EXPLAIN QUERY PLAN " + CacheIndex.lookup_sql(len(keys)),
                          ("ns0", *keys, len(tokens) - 1)).fetchall()
    details = " | ".join(r[-1] for r in plan)
    assert "entries_lookup" in details and "SEARCH" in details, details
    assert "SCAN entries" not in details, details

    t0 = time.perf_counter()
    for _ in range(20):
        found = cache.lookup("ns0", tokens)
    per_lookup = (time.perf_counter() - t0) / 20
    assert found is not None and found.n_tokens == 3000 and found.file == "real3000.state"
    assert cache.lookup("ns0", tokens[:2999] + [7]).n_tokens == 700
    assert per_lookup < 0.02, per_lookup
    assert len(chain) == len(tokens) // BLOCK
    # the fake entry has no file: loading it is a miss that removes the row
    assert cache.load(found, None) is False and cache.stats()["entries"] == 2001
