"""The seed's own model family end to end: a generated Qwen3.5/3.6-style hybrid (``qwen35moe``: Gated
DeltaNet and gated attention, routed and shared experts) through ingest, ask (whole and sections),
summarize and a second process restoring the saved state (see ``tests/support/arch_flow.py``)."""

from __future__ import annotations

import pytest

from support.arch_flow import run_main_path


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from devtools.synthetic import write_hybrid_model

    return write_hybrid_model(tmp_path_factory.mktemp("hybrid") / "qwen35moe.gguf")


def test_hybrid_main_path(hybrid, store_dir, tmp_path, monkeypatch):
    from pipeline.engine.gguf.info import ModelInfo

    info = ModelInfo.read(hybrid)
    assert info.arch == "qwen35moe" and [lay.kind for lay in info.layers] == ["recurrent"] * 3 + ["full"]
    out = run_main_path(hybrid, tmp_path, monkeypatch)
    # the hybrid's memory cannot be cut back: every later question restored the state from disk
    assert out["again"]["stats"]["cache"] == "disk"
