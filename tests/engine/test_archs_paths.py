"""`rag warm`, `rag ask --chat` and `rag serve` with a generated hybrid (qwen35moe) and gpt-oss as the
generator: the counters say the documents' prefix was prefilled once and reused (the text is noise),
in a long-lived server from host memory (the hybrid) or the KV cache itself (gpt-oss)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from support.arch_flow import QUESTIONS, ask, cli_json, settings_env, write_docs
from devtools.servers import free_port
from pipeline.cli import cli

ARCHS = ["qwen35moe", "gpt-oss"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from devtools.synthetic import write_model

    folder = tmp_path_factory.mktemp("paths")
    return {arch: write_model(arch, folder / f"{arch}.gguf") for arch in ARCHS}


def _ingest(tmp_path) -> None:
    out = CliRunner().invoke(cli, ["ingest", str(write_docs(tmp_path / "docs"))], catch_exceptions=False)
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("arch", ARCHS)
def test_warm_then_ask_and_a_chat_follow_up(models, arch, store_dir, tmp_path, monkeypatch):
    settings_env(monkeypatch, models[arch])
    _ingest(tmp_path)
    warm = cli_json("warm")
    assert warm, warm
    first = ask(QUESTIONS[0])["stats"]  # the first question already starts from the warmed prefix
    assert first["cache"] == "disk" and first["prefill_tokens"] < len(QUESTIONS[0]) + 64, first
    one = ask(QUESTIONS[0], "--chat", "c1")["stats"]
    two = ask("And which unit reports level 21?", "--chat", "c1")["stats"]
    assert one["cache"] == "disk" and two["cache"] == "disk"
    assert two["cached_tokens"] >= sum(x["tokens"] for x in two["sections"])  # the documents stayed cached
    assert two["prompt_tokens"] > one["prompt_tokens"]  # the earlier turn goes after the documents


def _post(url: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _serve(env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, base
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"rag serve did not start: {proc.stdout.read()}")
        time.sleep(0.2)


@pytest.mark.parametrize("arch", ARCHS)
def test_serve_answers_and_a_follow_up_reuses_the_documents(models, arch, store_dir, tmp_path, monkeypatch):
    settings_env(monkeypatch, models[arch])
    _ingest(tmp_path)
    proc, base = _serve(dict(os.environ))
    try:
        chat = base + "/v1/chat/completions"
        code, first = _post(chat, {"model": "rag", "messages": [{"role": "user", "content": QUESTIONS[0]}]})
        assert code == 200, first
        assert first["choices"][0]["finish_reason"] in ("stop", "length") and first["usage"]["completion_tokens"] >= 1
        code, follow = _post(chat, {"model": "rag", "messages": [
            {"role": "user", "content": QUESTIONS[0]},
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": QUESTIONS[1]}]})
        assert code == 200, follow
        cached = follow["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0.5 * first["usage"]["prompt_tokens"], (cached, first["usage"])
        # a long-lived process: the hybrid restores the documents' state from host memory, gpt-oss cuts its cache
        assert follow["stats"]["cache"] == {"qwen35moe": "ram", "gpt-oss": "memory"}[arch], follow["stats"]
        code, bad = _post(chat, {"model": "rag", "messages": []})
        assert code == 400 and bad["error"]["message"]
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
