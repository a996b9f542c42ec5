"""gpt-oss end to end: a generated ``gpt-oss`` (alternating sliding-window and full attention with
sinks, experts with biases, the harmony template) through ingest, ask (whole and sections), summarize
and a second process restoring the saved state (see ``tests/support/arch_flow.py``)."""

from __future__ import annotations

import pytest

from support.arch_flow import run_main_path


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    from devtools.synthetic import write_gpt_oss_model

    return write_gpt_oss_model(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss.gguf")


def test_gpt_oss_main_path(gpt_oss, store_dir, tmp_path, monkeypatch):
    from pipeline.engine.gguf.info import ModelInfo

    info = ModelInfo.read(gpt_oss)
    assert info.arch == "gpt-oss" and [lay.kind for lay in info.layers] == ["swa", "full"] * 2
    assert {lay.window for lay in info.layers if lay.kind == "swa"} == {128}
    out = run_main_path(gpt_oss, tmp_path, monkeypatch)
    # the documents are longer than the window: the full-size window cache still restored them exactly
    assert out["first"]["stats"]["prompt_tokens"] > 4 * 128
