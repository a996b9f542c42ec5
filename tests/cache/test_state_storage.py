"""Saved states on disk: kept as q8_0 where asked (half the bytes, restored into an f16 engine), and
their size as the model's metadata predicts it (every layer kind, the sliding window's cells)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.engine import _llama
from pipeline.engine._llama import composing as mem
from pipeline.engine._llama import state_codec, state_format
from pipeline.engine.cache.sections import SectionStates
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.gguf.info import ModelInfo
from pipeline.engine.reuse.calibrate import compare
from pipeline.engine.reuse.compose import Piece, Seams, compose


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    from devtools.synthetic import write_moe_model

    return write_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> Path:
    from devtools.synthetic import write_gpt_oss_model

    return write_gpt_oss_model(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")


def load(path: Path, **kw):
    return _llama.load(path, n_ctx=kw.pop("n_ctx", 2048), n_batch=512, n_ubatch=512, threads=2, flash_attn=True,
                       n_seq_max=3, **kw)


def prefill(model, tokens, pos=0, seq=0):
    for lo in range(0, len(tokens), model.n_batch):
        mem.decode_outputs(model, np.asarray(tokens[lo:lo + model.n_batch], np.int32), pos + lo, seq=seq)


def text_tokens(model, n: int) -> list[int]:
    text = " ".join(f"Entry {i}: valve {i % 9} opened at {i * 7} kPa on line {i % 5}." for i in range(n))
    return model.tokenize(text)[:n]


# -- the codec ---------------------------------------------------------------------------------------


def test_a_state_encoded_as_q8_0_keeps_its_layout_at_about_half_the_bytes(moe):
    model = load(moe)
    try:
        prefill(model, text_tokens(model, 300))
        data = mem.state_bytes(model, 0)
        parts: list = []
        assert state_codec.encode(data, parts.append)
        encoded = b"".join(bytes(p) for p in parts)
        before, after = state_format.blocks(data), state_format.blocks(encoded)
        assert [b.type for b in before] == [state_codec.F16] * len(before)
        assert [b.type for b in after] == [state_codec.Q8_0] * len(before)
        assert [b.rows for b in after] == [b.rows for b in before]
        kv = sum(b.rows * b.row_bytes for b in before)
        assert len(data) - len(encoded) == kv - kv * 34 // 64  # only the keys and values shrink
        assert state_codec.stored_type(memoryview(encoded)) == state_codec.Q8_0
        decoded = state_codec.decode(encoded)
        assert len(decoded) == len(data) and state_format.positions(decoded).tolist() == list(range(300))
        for exact, back in zip(state_format.parse(data)[0][0].layers, state_format.parse(bytes(decoded))[0][0].layers):
            for e, d in ((exact.k, back.k), (exact.v, back.v)):
                e, d = e.astype(np.float32), d.astype(np.float32)
                assert np.linalg.norm(e - d) <= 0.01 * np.linalg.norm(e)  # q8_0's rounding, no more
    finally:
        model.close()


def test_ggml_and_the_numpy_fallback_round_alike():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(64 * 32) * rng.uniform(0.01, 40, 64).repeat(32)).astype(np.float16)
    x[:32] = 0  # a block of zeros (its scale is 0)
    ggml, ref = state_codec._arithmetic(), state_codec._Numpy()
    assert type(ggml).__name__ == "_Ggml"  # this build exports ggml's routines
    q = ggml.quantize(memoryview(x.tobytes()), x.size)
    assert q == ref.quantize(memoryview(x.tobytes()), x.size)
    a, b = bytearray(8 + 2 * x.size), bytearray(8 + 2 * x.size)
    ggml.dequantize_into(memoryview(q), a, 8, x.size)
    ref.dequantize_into(memoryview(q), b, 8, x.size)
    assert a == b and a[:8] == bytes(8)
    back = np.frombuffer(a, np.float16, x.size, 8).astype(np.float32)
    assert np.abs(back - x.astype(np.float32)).max() <= np.abs(x.astype(np.float32)).max() / 127


def test_a_state_q8_0_cannot_hold_is_saved_as_it_is(moe, tmp_path):
    """A V cache kept transposed (flash attention off) is not encoded: the file is llama.cpp's own."""
    model = _llama.load(moe, n_ctx=1024, n_batch=512, n_ubatch=512, threads=2, flash_attn=False)
    try:
        tokens = text_tokens(model, 200)
        prefill(model, tokens)
        assert not state_codec.encodable(mem.state_bytes(model, 0))
        cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
        entry = cache.save("ns", tokens, model, stored="q8_0")
        assert entry is not None and entry.bytes == ModelInfo.read(moe).state_bytes(200)  # f16, as computed
        model.clear()
        assert cache.load(entry, model)
    finally:
        model.close()


# -- through the prefix cache ------------------------------------------------------------------------


def test_section_states_kept_as_q8_0_restore_into_an_f16_engine(moe, tmp_path):
    """Stored as q8_0 (the file half the size, as the metadata predicts), restored into the f16 engine,
    decoding on from it gives what the exact state gives, but for q8_0's rounding."""
    info = ModelInfo.read(moe)
    model = load(moe)
    try:
        tokens = text_tokens(model, 400)
        prefill(model, tokens[:399])
        cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
        exact = cache.save("ns", tokens[:399], model)
        small = cache.save("q8", tokens[:399], model, stored="q8_0")
        assert exact.bytes == info.state_bytes(399) and small.bytes == info.state_bytes(399, "q8_0", "q8_0")
        assert small.bytes < 0.6 * exact.bytes
        logits = {}
        for name, entry in (("f16", exact), ("q8_0", small)):
            model.clear()
            assert cache.load(entry, model, seq=1) and model.seq_end(1) == 398
            mem.decode_outputs(model, [tokens[399]], 399, seq=1)
            logits[name] = mem.last_logits(model)
        assert compare([logits["f16"]], logits["q8_0"][None, :]).kl < 0.01
        assert cache.stats()["namespaces"]["q8"]["bytes"] == small.bytes
    finally:
        model.close()


def test_a_truncated_q8_0_file_is_refused_not_restored(moe, tmp_path):
    """(The cache checks size and checksum first; the model's own reader refuses what is cut short too.)"""
    model = load(moe)
    try:
        tokens = text_tokens(model, 300)
        prefill(model, tokens)
        path = tmp_path / "s.state"
        assert model.save_state(path, tokens, stored="q8_0")
        whole = path.read_bytes()
        for cut in (len(whole) - 100, 12 + 4 * 300 + 40, 20):
            path.write_bytes(whole[:cut])
            assert model.load_state(path, capacity=301, seq=1) is None
        path.write_bytes(whole)
        assert model.load_state(path, capacity=301, seq=1) == tokens and model.seq_end(1) == 299
    finally:
        model.close()


def test_section_states_have_a_namespace_of_their_own_per_stored_type(moe, tmp_path):
    model = load(moe)
    try:
        head, body = text_tokens(model, 48)[:16], text_tokens(model, 48)[16:]
        f16 = SectionStates(PrefixCache(tmp_path / "cache", max_bytes=2**30), "engine", head)
        q8 = SectionStates(PrefixCache(tmp_path / "cache", max_bytes=2**30, section_type="q8_0"), "engine", head)
        assert f16.namespace != q8.namespace
        prefill(model, head)
        from pipeline.engine.reuse.compose import compute

        compute(model, len(head), Piece(tuple(body)), q8, scratch=1)
        assert q8.saved == 1 and not f16.held([Piece(tuple(body))])[0] and q8.held([Piece(tuple(body))])[0]
        entry = q8.find(Piece(tuple(body)))
        assert entry.bytes == ModelInfo.read(moe).state_bytes(len(body), "q8_0", "q8_0")
    finally:
        model.close()


def test_a_composition_from_q8_0_states_is_close_to_one_from_f16_states(moe, tmp_path):
    """The K-shift moves restored (dequantised) cells like any others: composed from q8_0 states, the
    next-token distributions stay within q8_0's rounding of those composed from f16 states."""
    model = load(moe)
    try:
        tokens = text_tokens(model, 700)
        head, pieces, question = tokens[:20], [Piece(tuple(tokens[a:a + 200])) for a in (20, 220, 420)], tokens[620:660]
        rows = {}
        for stored in ("f16", "q8_0"):
            states = SectionStates(PrefixCache(tmp_path / stored, max_bytes=2**30, section_type=stored), "e", head)
            for _ in range(2):  # the first saves the states, the second restores every one
                model.clear()
                prefill(model, head)
                done = compose(model, head, pieces, states, Seams("first", 8))
            assert done.restored == 3
            mem.decode_outputs(model, question, 620, every=True)
            rows[stored] = mem.output_logits(model, len(question))
            states.close()
        got = compare(list(rows["f16"]), rows["q8_0"])
        assert got.kl < 0.01 and got.top1 >= 0.9
    finally:
        model.close()


# -- what a saved state takes, from the metadata ------------------------------------------------------


@pytest.mark.parametrize("stored", ["f16", "q8_0"])
def test_state_bytes_match_the_files_of_a_sliding_window_model(gpt_oss, tmp_path, stored):
    """gpt-oss: window layers (128 tokens) keep only the window's cells in a saved state, full layers every cell."""
    info = ModelInfo.read(gpt_oss)
    assert {lay.kind for lay in info.layers} == {"swa", "full"} and info.layers[0].window == 128
    model = load(gpt_oss, swa_full=True)
    try:
        cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
        for n in (100, 500):
            tokens = text_tokens(model, n)
            model.clear()
            prefill(model, tokens)
            entry = cache.save(f"n{n}", tokens, model, stored=stored)
            assert entry.bytes == info.state_bytes(n, stored, stored)
            memories = state_format.parse(state_codec.decode((cache.directory / entry.file).read_bytes()[4 * n + 4:]),
                                          values=False)
            assert [len(m[0].positions) for m in memories] == [n, min(n, 128)]
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["builtin:SmolLM2-135M-Instruct", "builtin:gemma-3-270m"])
def test_state_bytes_match_a_real_section_state(model_home, tmp_path, name):
    """SmolLM2 (every layer full) and Gemma 3 (five window layers of 512 to one full): the section state
    saved to disk has exactly the size the metadata predicts, f16 and q8_0."""
    from pipeline.models import resolve

    path = resolve(name, home=model_home)
    info = ModelInfo.read(path)
    model = load(path, swa_full=True)
    try:
        tokens = text_tokens(model, 800)
        head, body = tokens[:16], Piece(tuple(tokens[16:800]))
        prefill(model, head)
        from pipeline.engine.reuse.compose import compute

        for stored in ("f16", "q8_0"):
            states = SectionStates(PrefixCache(tmp_path / stored, max_bytes=2**31, section_type=stored), "e", head)
            compute(model, len(head), body, states, scratch=1)
            mem.seq_remove(model, 1)
            assert states.find(body).bytes == info.state_bytes(len(body), stored, stored)
            states.close()
    finally:
        model.close()


def test_the_footprint_table_sizes_published_shapes_as_the_cache_does():
    """benchmarks/state_footprint.py: Llama 3.1 8B's f16 state, 32 layers x 8 KV heads x 128 x K and V x 2
    bytes per token (and the file's framing); gpt-oss's window layers count 128 tokens a section; a
    hybrid model keeps no section states."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("state_footprint", root / "benchmarks" / "state_footprint.py")
    footprint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(footprint)
    info = {name: ModelInfo.from_metadata(meta, []) for name, meta in footprint.PUBLISHED.items()}
    llama = footprint.row("llama", info["Llama 3.1 8B (dense)"], 2048)
    per_token = 32 * 8 * 128 * 2 * 2
    assert llama["f16"]["bytes_per_token"] * 2048 == 12 + 4 * 2048 + 16 + 24 * 32 + 2048 * (12 + per_token)
    assert round(llama["q8_0"]["bytes_per_token"] / llama["f16"]["bytes_per_token"], 2) == 0.53
    oss = info["gpt-oss-20b (MoE, 128-token windows)"]
    assert [lay.kind for lay in oss.layers[:2]] == ["swa", "full"]
    window = oss.state_bytes(2048) - oss.state_bytes(1024)  # only the full layers grow past the window
    assert window == 1024 * (4 + 12 + 12 * 8 * 64 * 2 * 2)
    assert not footprint.row("qwen3.6", info["Qwen3.6-35B-A3B (hybrid)"], 2048)["composes"]


def test_the_types_a_section_state_is_kept_in():
    from pipeline.engine.cache.sections import kept_types

    assert kept_types("q8_0", "f16", "f16") == ("q8_0", "q8_0")
    assert kept_types("f16", "f16", "f16") == ("f16", "f16")
    assert kept_types("q8_0", "f16", "f16", flash_attn=False) == ("f16", "f16")  # V kept transposed
    assert kept_types("q8_0", "q4_0", "q4_0") == ("q4_0", "q4_0")  # the engine's own, already smaller


def test_a_library_session_keeps_its_section_states_as_q8_0_and_composes_from_them(tmp_path):
    """Through the public API (cache.section_type = "q8_0"): every section state on disk is q8_0 at the
    size the metadata predicts, and a later question in a new process is composed from them."""
    from support.fakes import HashEmbedder

    from pipeline import Pipeline
    from devtools.synthetic import write_moe_model
    from pipeline.engine.cache.sections import namespace

    model_path = write_moe_model(tmp_path / "moe.gguf", n_ctx_train=8192)
    docs = tmp_path / "shelf"
    docs.mkdir()
    for name, topic in (("a.md", "pump"), ("b.md", "valve"), ("c.md", "sensor"), ("d.md", "cable")):
        (docs / name).write_text("\n\n".join(f"Paragraph {i} of the {topic} manual: the {topic} unit {i} reports "
                                             f"level {i * 7}." for i in range(24)) + "\n")
    overrides = {"models.generator": str(model_path), "engine.n_ctx": 2048, "engine.threads": 1,
                 "ask.max_tokens": 6, "chunking.size": 64, "chunking.overlap": 8, "chunking.section_tokens": 128,
                 "cache.path": str(tmp_path / "cache"), "ask.compose": "on", "cache.section_type": "q8_0"}

    def session():
        return Pipeline.from_config(overrides=overrides, embedder=HashEmbedder())

    with session() as rag:
        rag.ingest([docs])
        first = rag.ask("What does pump unit 3 report?")
        ns = namespace(rag.engine.namespace, rag.runtime.layout().head_tokens, "q8_0")
        entries = rag.prefix_cache.entries(ns)
    info = ModelInfo.read(model_path)
    assert first.stats.cache == "composed" and len(entries) == first.stats.states_saved >= 2
    for e in entries:
        assert e.bytes == info.state_bytes(e.n_tokens, "q8_0", "q8_0")
        head = (tmp_path / "cache" / e.file).read_bytes()[12 + 4 * e.n_tokens - 8:]
        assert state_codec.stored_type(memoryview(head)) == state_codec.Q8_0
    with session() as rag:
        later = rag.ask("What level does pump unit 4 report?")
    assert later.stats.cache == "composed" and later.stats.composed_sections >= 1
