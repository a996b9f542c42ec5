"""Expert offload: the override lists of pipeline.engine.offload, checked against real llama.cpp.

The llama.cpp tests load a generated 4-layer, 8-expert qwen3moe model (about 1 MB)
and compare the tensors the loader logs as overridden with what
``planned_tensors`` predicts.
"""

from __future__ import annotations

import ctypes
import re

import pytest

from pipeline.errors import ConfigError
from pipeline.engine.offload import (
    CPU,
    EXPERT_PATTERN,
    Override,
    cpu_moe,
    layer_experts_pattern,
    n_cpu_moe,
    parse_override,
    planned_tensors,
)

N_LAYERS = 4
EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def _experts(*layers: int) -> set[str]:
    return {f"blk.{i}.{k}.weight" for i in layers for k in EXPERT_KINDS}


def _names(n_layers: int) -> list[str]:
    from devtools.synthetic import moe_tensor_shapes

    shapes = moe_tensor_shapes(
        n_layers=n_layers, n_embd=8, n_head=2, n_head_kv=1, head_dim=4, n_experts=2, expert_ff=4, n_vocab=262
    )
    return [name for name, _ in shapes]


# --------------------------------------------------------------------------- pure


def test_n_cpu_moe_first_and_last() -> None:
    names = _names(N_LAYERS)
    assert set(planned_tensors(names, n_cpu_moe(2, N_LAYERS))) == _experts(0, 1)
    assert set(planned_tensors(names, n_cpu_moe(2, N_LAYERS, which="last"))) == _experts(2, 3)
    assert planned_tensors(names, n_cpu_moe(0, N_LAYERS)) == {}
    assert set(planned_tensors(names, n_cpu_moe(9, N_LAYERS))) == _experts(0, 1, 2, 3)  # clamped
    assert [o.pattern for o in n_cpu_moe(2, N_LAYERS)] == [rf"blk\.0{EXPERT_PATTERN}", rf"blk\.1{EXPERT_PATTERN}"]
    assert all(o.buffer == CPU for o in n_cpu_moe(3, N_LAYERS))
    with pytest.raises(ConfigError):
        n_cpu_moe(-1, N_LAYERS)
    with pytest.raises(ConfigError):
        n_cpu_moe(1, N_LAYERS, which="middle")  # type: ignore[arg-type]


def test_layer_1_does_not_match_layers_10_to_19() -> None:
    names = _names(20)
    assert set(planned_tensors(names, [Override(layer_experts_pattern(1), CPU)])) == _experts(1)
    assert set(planned_tensors(names, n_cpu_moe(2, 20, which="last"))) == _experts(18, 19)
    assert set(planned_tensors(names, cpu_moe())) == _experts(*range(20))
    # only expert tensors: not the router, not the norms
    assert not any("gate_inp" in n or "norm" in n for n in planned_tensors(names, cpu_moe()))


def test_parse_override() -> None:
    assert parse_override(r"blk\.1\.ffn_down_exps=CPU") == [Override(r"blk\.1\.ffn_down_exps", "CPU")]
    assert parse_override(r"exps=CUDA0,blk\.0\.=CPU") == [Override("exps", "CUDA0"), Override(r"blk\.0\.", "CPU")]
    assert parse_override("a=b=c") == [Override("a", "b=c")]  # split on the first '=', as llama.cpp
    for bad in ("noequals", "=CPU", "x=", "a=CPU,,b=CPU"):
        with pytest.raises(ConfigError):
            parse_override(bad)
    with pytest.raises(ConfigError, match=re.escape(r"'blk\.(1'")):
        parse_override(r"blk\.(1=CPU")
    with pytest.raises(ConfigError):
        Override("[", CPU)


def test_first_match_wins() -> None:
    names = _names(N_LAYERS)
    plan = planned_tensors(names, [Override(r"blk\.1\.ffn_up", "CUDA0"), Override("exps", CPU)])
    assert plan["blk.1.ffn_up_exps.weight"] == "CUDA0"
    assert plan["blk.1.ffn_down_exps.weight"] == CPU
    assert set(plan) == _experts(0, 1, 2, 3)
    # search, not full match
    assert planned_tensors(["blk.0.attn_q.weight"], [Override("attn_q", CPU)]) == {"blk.0.attn_q.weight": CPU}


# --------------------------------------------------------------------------- llama.cpp

import llama_cpp  # noqa: E402  (the test reads llama.cpp's own log callback below)

from devtools.synthetic import tensor_names, write_moe_model  # noqa: E402
from pipeline.engine._llama import LOG_DEBUG, LlamaLog, TensorOverrides, load  # noqa: E402
from pipeline.errors import EngineError  # noqa: E402


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory):
    path = write_moe_model(tmp_path_factory.mktemp("moe") / "moe.gguf", n_layers=N_LAYERS, n_experts=8)
    return path, tensor_names(path)


def _greedy_tokens(model, prompt: str, n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt``, through the boundary's own decode and sampler."""
    import numpy as np

    model.clear()
    tokens = model.tokenize(prompt, add_bos=True)
    model.decode(np.asarray(tokens, dtype=np.int32), 0)
    sampler = model.sampler(temperature=0.0, repeat_penalty=1.0, seed=0)
    out: list[int] = []
    try:
        while len(out) < n:
            token = sampler.sample()
            out.append(token)
            model.decode_token(token, len(tokens) + len(out) - 1)
    finally:
        sampler.close()
    return out


SETTINGS = {
    "none": [],
    "n_cpu_moe_2_first": n_cpu_moe(2, N_LAYERS),
    "n_cpu_moe_2_last": n_cpu_moe(2, N_LAYERS, which="last"),
    "cpu_moe": cpu_moe(),
    "ot_regex": parse_override(r"blk\.1\.ffn_down_exps=CPU"),
    "ot_two_and_first_match": parse_override(r"blk\.3\.=CPU,exps=CPU"),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_llama_cpp_overrides_exactly_the_planned_tensors(moe_model, setting, capfd) -> None:
    path, names = moe_model
    overrides = SETTINGS[setting]
    expected = planned_tensors(names, overrides)
    with LlamaLog() as log:
        model = load(path, overrides=overrides, n_ctx=256, threads=2, threads_batch=2)
    try:
        assert log.overridden() == expected
        assert log.grep(r"load_tensors|model buffer size"), "the capture saw no loader output"
        if expected:
            levels = {r.level for r in log.records if "buffer type overridden" in r.text}
            assert levels == {LOG_DEBUG}
        tokens = _greedy_tokens(model, "The quick brown fox", 4)
        assert len(tokens) == 4 and all(0 <= t < model.n_vocab for t in tokens)
    finally:
        model.close()
    assert capfd.readouterr().err == ""  # the capture chained to llama-cpp-python's quiet logger


def test_overridden_experts_give_the_same_tokens(moe_model) -> None:
    path, _ = moe_model
    model = load(path, overrides=cpu_moe(), n_ctx=256, threads=2)
    plain = load(path, n_ctx=256, threads=2)
    try:  # same weights, same greedy tokens with or without the experts overridden
        assert _greedy_tokens(model, "hello there", 4) == _greedy_tokens(plain, "hello there", 4)
    finally:
        plain.close()
        model.close()


def test_trained_context_and_dry_run_at_full_context(moe_model) -> None:
    path, _ = moe_model
    with LlamaLog() as log:
        model = load(path, model_params={"no_alloc": True, "use_extra_bufts": False}, n_ctx=65536, threads=2,
                     flash_attn=True)
    try:
        assert model.n_ctx_train == 65536
        assert model.n_ctx == 65536
        kv = log.grep(r"llama_kv_cache: size = .*65536 cells")
        assert kv, log.text[-3000:]
        assert log.grep(r"compute buffer size = ")
    finally:
        model.close()


def test_unknown_buffer_and_param_are_engine_errors(moe_model) -> None:
    path, _ = moe_model
    with pytest.raises(EngineError, match="NOPE0"):
        TensorOverrides([Override("exps", "NOPE0")])
    with pytest.raises(EngineError, match="not_a_field"):
        load(path, model_params={"not_a_field": 1})
    with pytest.raises(EngineError, match="q3_0"):
        load(path, type_k="q3_0")


def _current_log_callback() -> int | None:
    cb = llama_cpp.llama_log_callback()
    ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(cb), ctypes.byref(ud))
    return ctypes.cast(cb, ctypes.c_void_p).value


def test_log_capture_nests_and_restores_previous_callback(moe_model) -> None:
    path, _ = moe_model
    before = _current_log_callback()
    with LlamaLog() as outer:
        with LlamaLog() as inner:
            load(path, n_ctx=64).close()
        assert _current_log_callback() != before
    assert _current_log_callback() == before
    assert inner.grep("model buffer size") and outer.grep("model buffer size")  # inner chains to outer


def test_f16_model_with_padded_vocab_generates(tmp_path) -> None:
    path = write_moe_model(tmp_path / "moe16.gguf", dtype="f16", vocab=1000, seed=1)
    with LlamaLog() as log:
        model = load(path, overrides=n_cpu_moe(1, N_LAYERS), n_ctx=128, threads=2)
    try:
        assert model.n_vocab == 1000
        assert set(log.overridden()) == _experts(0)
        assert len(_greedy_tokens(model, "hi", 3)) == 3
    finally:
        model.close()


def test_overrides_use_llamas_own_ggml_copy() -> None:
    # The wheel ships libggml-base.so, .so.0 and .so.0.x as separate files: opening one
    # by path would map a second copy, with its own CPU buffer type object.
    TensorOverrides(cpu_moe())
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if "libggml-base" in line}
    assert len(mapped) == 1, mapped
