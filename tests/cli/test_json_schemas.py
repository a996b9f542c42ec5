"""Every ``--json`` output validates against its versioned schema; errors in ``--json`` mode are JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.schemas import SCHEMA, SCHEMAS, validate


def _json(*args, code: int = 0):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    return json.loads(result.stdout), result


def test_every_json_output_validates(store_dir, corpus):
    ingest, _ = _json("ingest", str(corpus), "--json")
    validate("ingest", ingest)
    search, _ = _json("search", "ERR_SOCKET_ZX81", "-k", "2", "--json")
    validate("search", search)
    ask, _ = _json("ask", "Where do tomatoes grow best?", "--ctx", "768", "--max-tokens", "4", "-k", "2", "--json")
    validate("ask", ask)
    assert ask["stats"]["start_point"] == "process"  # the wait from the command's start to the first text
    assert ask["stats"]["start_to_first_token_seconds"] >= ask["stats"]["ttft_seconds"]
    status, _ = _json("status", "--json")
    validate("status", status)
    plan, _ = _json("plan", "--spec", "qwen3.6-35b-a3b", "--gpu", "rtx3090", "--ctx", "16384", "--json")
    validate("plan", plan)
    summary, _ = _json("summarize", str(corpus / "page.html"), "--max-tokens", "4", "--ctx", "768", "--json")
    validate("summarize", summary)
    assert summary["summaries"] and summary["summaries"][0]["summary"]
    for data in (ingest, search, ask, status, plan, summary):
        assert data["schema"] == SCHEMA


def test_json_fields_are_the_api_objects_to_dict(make_pipeline, corpus, store_dir):
    rag = make_pipeline()
    rag.ingest([corpus])
    hit = rag.search("ERR_SOCKET_ZX81", top_k=1)[0]
    search, _ = _json("search", "ERR_SOCKET_ZX81", "-k", "1", "--json")
    assert search["hits"][0] == json.loads(json.dumps(hit.to_dict()))
    status, _ = _json("status", "--json")
    assert {k: v for k, v in status.items() if k not in ("schema", "system", "composition")} == json.loads(
        json.dumps(rag.status().to_dict()))
    assert status["composition"] == json.loads(json.dumps(rag.calibration()))


@pytest.mark.parametrize("args, code", [
    (["search", "anything", "--json"], 4),              # no collection yet
    (["ask", "   ", "--json"], 2),                      # empty question
    (["ingest", "/does/not/exist", "--json"], 2),       # missing path
])
def test_errors_in_json_mode_are_json_on_stdout_and_a_message_on_stderr(store_dir, args, code):
    data, result = _json(*args, code=code)
    validate("error", data)
    assert data["exit_code"] == code and data["error"]["message"]
    assert data["error"]["message"] in result.stderr


def test_schemas_are_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "app.md").read_text()
    for kind in SCHEMAS:
        assert f"`{kind}`" in doc, kind


def test_public_types_are_exported_without_loading_heavy_modules():
    import subprocess
    import sys

    code = ("import sys, pipeline\n"
            "from pipeline import (Answer, AnswerStream, AsyncAnswerStream, CancelToken, Cancelled, Hit, IngestReport,"
            " CollectionStatus, EngineStats, Pipeline, RagError, AskOptions, AskStats, PrefillProgress, Summary)\n"
            "assert Answer.__name__ == 'Answer' and issubclass(Cancelled, RagError)\n"
            "print('llama_cpp' in sys.modules, 'chromadb' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
