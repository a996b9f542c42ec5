"""The engine on real llama.cpp: offload settings, clamping, memory checks, timings, prefix reuse."""

from __future__ import annotations

import dataclasses

import pytest

from devtools.synthetic import tensor_names, write_moe_model
from pipeline.engine import loading
from pipeline.engine._llama import LlamaLog
from pipeline.config import EngineConfig
from pipeline.engine.local import Engine
from pipeline.errors import EngineError
from pipeline.engine.offload import planned_tensors


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return write_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", n_layers=4, n_ctx_train=65536)


def settings(**kw) -> EngineConfig:
    return dataclasses.replace(EngineConfig(n_ctx=2048, n_batch=512, n_ubatch=256, threads=1), **kw)


@pytest.mark.parametrize("kw", [
    {"n_cpu_moe": 2, "cpu_moe_from": "last"},
    {"n_cpu_moe": 1, "cpu_moe_from": "first"},
    {"cpu_moe": True},
    {"override_tensors": r"blk\.0\.ffn_down_exps=CPU", "n_cpu_moe": 1},
])
def test_offload_settings_reach_llama_cpp(moe_path, kw):
    eng = Engine(moe_path, settings(**kw))
    expected = planned_tensors(tensor_names(moe_path), eng.overrides)
    assert expected and not eng.use_mmap  # overridden experts load without mmap
    with LlamaLog() as log:
        eng.llm
    assert log.overridden() == expected
    out = eng.generate(eng.bos + eng.tokenize("hello world"), max_tokens=4)
    out.read()
    assert out.stats.decode_tokens >= 0 and out.stats.prompt_tokens > 0
    eng.close()


def test_last_n_takes_the_last_layers(moe_path):
    eng = Engine(moe_path, settings(n_cpu_moe=2, cpu_moe_from="last"))
    layers = {name.split(".")[1] for name in planned_tensors(tensor_names(moe_path), eng.overrides)}
    assert layers == {"2", "3"}


def test_stats_come_from_llama_cpp_timings(moe_path):
    eng = Engine(moe_path, settings())
    tokens = eng.bos + eng.tokenize("a b c d e f g " * 60)
    gen = eng.generate(tokens, max_tokens=8)
    gen.read()
    st = gen.stats
    assert st.prompt_tokens == len(tokens) and st.prefill_tokens == len(tokens) and st.cached_tokens == 0
    assert st.prefill_seconds > 0 and st.prefill_tokens_per_second > 0
    assert 0 < st.ttft_seconds and st.load_seconds > 0
    eng.close()


@pytest.mark.slow
def test_prefix_reuse_in_process_is_lossless(model_home):
    from pipeline.models import resolve

    path = resolve("builtin:SmolLM2-135M-Instruct", home=model_home, fetch=False)
    eng = Engine(path, settings(n_ctx=1024))
    head = eng.bos + eng.tokenize(eng.chat("Be brief.", "Documents:\n\n[1] The sky on Mars is butterscotch by day.\n\n"),
                                  special=True)
    q1 = head + eng.tokenize("Question: what colour is the Martian sky?<|im_end|>\n<|im_start|>assistant\n", special=True)
    q2 = head + eng.tokenize("Question: what colour is the sky on Mars?<|im_end|>\n<|im_start|>assistant\n", special=True)
    cold = eng.generate(q2, max_tokens=12)
    cold_text = cold.read()
    eng.generate(q1, max_tokens=12).read()
    warm = eng.generate(q2, max_tokens=12)
    assert warm.read() == cold_text
    assert warm.stats.cached_tokens >= len(head) and warm.stats.cache == "memory"
    assert warm.stats.prefill_tokens == len(q2) - warm.stats.cached_tokens
    eng.close()


def test_context_above_training_is_clamped_with_a_note(moe_path):
    eng = Engine(moe_path, settings(n_ctx=131072))
    assert eng.n_ctx == 65536 and "trained context 65536" in eng.notes[0]
    assert Engine(moe_path, settings(n_ctx=131072, rope_scaling="yarn")).n_ctx == 131072
    assert Engine(moe_path, settings(n_ctx=0)).n_ctx == 65536


def test_a_context_that_cannot_fit_names_the_setting(moe_path, monkeypatch):
    monkeypatch.setattr(loading, "detect_ram", lambda available=False: 4 * 2**20)
    eng = Engine(moe_path, settings(n_ctx=65536, type_k="f32", type_v="f32"))
    with pytest.raises(EngineError, match="lower engine.n_ctx.*q8_0"):
        eng.llm


def test_kv_estimate_matches_the_model(moe_path):
    info = Engine(moe_path, settings()).info
    assert (info.n_layers, info.n_ctx_train, info.n_experts, info.n_head_kv) == (4, 65536, 8, 2)
    # 4 layers x 2 KV heads x 16 dims x (K + V) x 2 bytes per f16 element
    assert info.kv_bytes(1000, "f16", "f16") == 1000 * 4 * 2 * 16 * 2 * 2


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_kv_estimate_is_what_llama_cpp_allocates(tmp_path, kv):
    """The memory check's KV size against llama.cpp's own (a dry run: nothing allocated)."""
    from pipeline.engine._llama import load

    path = write_moe_model(tmp_path / "m.gguf", n_layers=4, head_dim=32)  # q8_0 needs heads of 32k values
    with LlamaLog(chain=False) as log:
        load(path, n_ctx=4096, flash_attn=True, type_k=kv, type_v=kv, threads=1,
             model_params={"no_alloc": True}).close()
    (line,) = log.grep(r"llama_kv_cache: size")
    mib = float(line.split("=")[1].split("MiB")[0])
    assert Engine(path, settings()).info.kv_bytes(4096, kv, kv) == pytest.approx(mib * 2**20, abs=0.01 * 2**20)


def test_prompt_longer_than_context_is_refused(moe_path):
    eng = Engine(moe_path, settings(n_ctx=256, n_batch=256, n_ubatch=256))
    with pytest.raises(EngineError, match="the context holds 256"):
        eng.generate(list(range(10, 300)), max_tokens=1)


@pytest.mark.parametrize("qtype", ["q8_0", "f16"])
def test_timing_model_for_the_gpu_benchmark_loads_and_prefills(tmp_path, qtype):
    from devtools.synthetic import write_timing_moe_model

    path = write_timing_moe_model(tmp_path / f"timing-{qtype}.gguf", qtype=qtype, n_embd=64, head_dim=32,
                                  expert_ff=64, n_ctx_train=4096)
    eng = Engine(path, settings(n_ctx=1024, n_cpu_moe=2))
    gen = eng.generate([10 + i % 240 for i in range(390)], max_tokens=2)  # ids within the 262-token vocab
    gen.read()
    assert gen.stats.prefill_tokens == 390 and gen.stats.prefill_tokens_per_second > 0
    eng.close()


def test_llama_cpp_warnings_stay_off_stderr_and_its_errors_reach_it(capfd):
    """llama-cpp-python's callback reads the levels in an older order and printed every warning (Gemma's
    "using full-size SWA cache" on each question); the process's callback is ours, and prints errors."""
    import ctypes

    import llama_cpp.llama_cpp as c

    from pipeline.engine._llama import log

    installed, data = c.llama_log_callback(), ctypes.c_void_p()
    c.llama_log_get(ctypes.byref(installed), ctypes.byref(data))
    assert ctypes.cast(installed, ctypes.c_void_p).value == ctypes.cast(log._default.callback, ctypes.c_void_p).value
    log._default._on_log(log.LOG_WARN, b"llama_kv_cache_iswa: using full-size SWA cache\n", None)
    log._default._on_log(log.LOG_CONT, b"(continued warning)\n", None)
    log._default._on_log(log.LOG_ERROR, b"gguf_init: failed to read magic\n", None)
    for cancelled in (b"process_ubatch: failed to compute graph, compute status: 1\n",
                      b"llama_decode: failed to decode, ret = 2\n"):  # a cancel is not an error
        log._default._on_log(log.LOG_ERROR, cancelled, None)
    log._default._on_log(log.LOG_ERROR, b"llama_decode: failed to decode, ret = -1\n", None)
    err = capfd.readouterr().err
    assert "SWA" not in err and "continued" not in err and "failed to read magic" in err
    assert "status: 1" not in err and "ret = 2" not in err and "ret = -1" in err
