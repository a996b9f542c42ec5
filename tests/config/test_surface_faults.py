"""Issue 8's configuration, model-reference and CLI defects, each reproduced as the issue states it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import warnings

import pytest
from click.testing import CliRunner

from pipeline import models
from pipeline.cli import cli
from pipeline.config import ConfigWarning, load_config
from pipeline.errors import ConfigError, ModelError, redact

from test_config_models import hf_server  # noqa: F401 - the local Hugging Face stand-in


def run(*args, env=None, input=None):
    return CliRunner().invoke(cli, list(args), env=env, input=input, prog_name="rag", catch_exceptions=False)


def rag(*args, env=None, cwd=None):
    """A real ``rag`` process: what a user sees on stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


# -- 9: non-finite settings ----------------------------------------------------------------


@pytest.mark.parametrize("text,key", [
    ("[cache]\nmax_gb = nan\n", "cache.max_gb"),
    ("[ask]\ntemperature = inf\n", "ask.temperature"),
    ("[ask]\ntemperature = nan\n", "ask.temperature"),
    ("[store]\nwait = -inf\n", "store.wait"),
    ("[engine]\nrope_freq_scale = nan\n", "engine.rope_freq_scale"),
])
def test_non_finite_floats_in_toml_are_refused(tmp_path, text, key):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')} must be a finite number"):
        load_config(cfg, environ={})


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_non_finite_floats_from_environment_and_flags(value):
    with pytest.raises(ConfigError, match="ask.temperature must be a finite number"):
        load_config(environ={"RAG_ASK_TEMPERATURE": value})
    with pytest.raises(ConfigError, match="cache.max_gb must be a finite number"):
        load_config(environ={}, overrides={"cache.max_gb": float(value)})


def _float_settings() -> list[str]:
    import dataclasses

    from pipeline.config import Config

    out = []
    for section in dataclasses.fields(Config):
        value = getattr(Config(), section.name)
        if dataclasses.is_dataclass(value):
            out += [f"{section.name}.{f.name}" for f in dataclasses.fields(value) if f.type in ("float", float)]
    return out


def test_an_overflowing_float_is_quoted_as_given_for_every_float_setting(tmp_path):
    keys = _float_settings()
    assert len(keys) > 10 and "ask.compose_max_kl" in keys
    for key in keys:
        section, name = key.split(".")
        env = {f"RAG_{section}_{name}".upper(): "1e400"}
        with pytest.raises(ConfigError) as err:
            load_config(environ=env)
        assert str(err.value) == f"{key} must be a finite number, got 1e400", key
        cfg = tmp_path / f"{section}-{name}.toml"
        cfg.write_text(f"[{section}]\n{name} = -1_5e400\n")
        with pytest.raises(ConfigError) as err:
            load_config(cfg, environ={})
        assert str(err.value) == f"{key} must be a finite number, got -1_5e400", key
    out = rag("status", env={"RAG_ASK_COMPOSE_MAX_KL": "1e400"})
    assert out.returncode == 2 and out.stderr.strip() == "Error: ask.compose_max_kl must be a finite number, got 1e400"


def test_out_of_range_integers_and_nul_are_refused():
    with pytest.raises(ConfigError, match="engine.n_ctx is out of range"):
        load_config(environ={"RAG_ENGINE_N_CTX": "99999999999999999"})
    with pytest.raises(ConfigError, match="store.path contains a NUL"):
        load_config(environ={}, overrides={"store.path": "a\0b"})


def test_cache_max_gb_nan_is_a_one_line_error_with_exit_2(store_dir, tmp_path):
    cfg = tmp_path / "nan.toml"
    cfg.write_text("[cache]\nmax_gb = nan\n")
    out = rag("--config", str(cfg), "ask", "anything")
    assert out.returncode == 2
    assert out.stderr.strip() == "Error: cache.max_gb must be a finite number, got nan"
    out = rag("ask", "anything", env={"RAG_ASK_TEMPERATURE": "inf"})
    assert out.returncode == 2 and "ask.temperature must be a finite number, got inf" in out.stderr
    assert "Traceback" not in out.stderr


# -- 11: unknown RAG_* variables -----------------------------------------------------------


def test_misspelled_section_in_environment_warns_with_the_likely_setting():
    with pytest.warns(ConfigWarning, match=r"RAG_ENGIN_N_CTX matches no setting.*RAG_ENGINE_N_CTX, setting engine\.n_ctx"):
        config = load_config(environ={"RAG_ENGIN_N_CTX": "1234"})
    assert config.engine.n_ctx == load_config(environ={}).engine.n_ctx != 1234  # ignored, as the warning says
    seen = []
    load_config(environ={"RAG_COMPLETELY_OTHER": "1", "RAG_TEST_MINILM_DIR": "/x"}, warn=seen.append)
    assert seen == ["environment variable RAG_COMPLETELY_OTHER matches no setting and is ignored"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(environ={"RAG_ENGINE_N_CTX": "8192", "RAG_HOME": "/x", "OTHER": "1"})


def test_unknown_variable_warns_once_on_stderr(store_dir):
    out = rag("config", env={"RAG_ENGIN_N_CTX": "8192"})
    assert out.returncode == 0
    assert out.stderr.splitlines() == [
        "warning: environment variable RAG_ENGIN_N_CTX matches no setting and is ignored "
        "(did you mean RAG_ENGINE_N_CTX, setting engine.n_ctx?)"]


# -- 10: secrets and paths in model references ---------------------------------------------


def test_redact_hides_credentials_in_urls():
    assert redact("from https://user:p@ss@host:8/x?a=1&token=abc") == "from https://***@host:8/x?a=1&token=***"
    assert redact("plain text and http://host/path") == "plain text and http://host/path"
    assert str(ModelError("at https://u:secret@h/x")) == "at https://***@h/x"
    assert redact('url = "postgresql://u:pw@db/rag?token=abc"') == 'url = "postgresql://***@db/rag?token=***"'


def test_config_with_credentials_prints_toml_that_reads_back(tmp_path):
    url = "postgresql://bob:pw@db/rag?sslmode=require&token=abc"
    env = {k: None for k in os.environ if k.startswith("RAG_")} | {"RAG_HOME": str(tmp_path),
                                                                    "RAG_STORE_CATALOG_URL": url}
    out = run("config", env=env).output
    assert "pw" not in out and "abc" not in out
    cfg = tmp_path / "out.toml"
    cfg.write_text(out)
    assert load_config(cfg, environ={}).store.catalog_url == "postgresql://***@db/rag?sslmode=require&token=***"


@pytest.mark.parametrize("endpoint", ["https://user:s3cret@127.0.0.1:9", "https://user:s3cret@host:notaport",
                                      "https://user:s3cret@nohost.invalid"])
def test_password_in_hf_endpoint_is_never_shown(store_dir, tmp_path, endpoint):
    out = rag("models", "pull", "hf:acme/tiny/x.gguf", env={"HF_ENDPOINT": endpoint, "RAG_HOME": str(tmp_path)})
    assert out.returncode == 3, out.stderr
    assert "s3cret" not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_endpoint_credentials_are_sent_as_a_header(hf_server, tmp_path, monkeypatch):  # noqa: F811
    seen = []
    serve = hf_server.do_GET

    def get(self):
        seen.append(self.headers.get("Authorization"))
        serve(self)

    monkeypatch.setattr(hf_server, "do_GET", get)
    port = os.environ["HF_ENDPOINT"].rsplit(":", 1)[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://user:p%40ss@127.0.0.1:{port}")
    hf_server.files["/acme/tiny/resolve/main/x.gguf"] = b"GGUF" + bytes(28)
    logged = []
    path = models.resolve("hf:acme/tiny/x.gguf", home=tmp_path, log=logged.append)
    assert path.read_bytes().startswith(b"GGUF")
    assert seen == ["Basic " + base64.b64encode(b"user:p@ss").decode()]
    assert logged == [f"downloading http://127.0.0.1:{port}/acme/tiny/resolve/main/x.gguf"]


@pytest.mark.parametrize("ref", ["hf:a/b/../../../../x.gguf", "hf:/etc/x.gguf", "hf:a/b/./x.gguf",
                                 "hf:a//x.gguf", "hf:../b/x.gguf", "hf:a/b/c\\..\\x.gguf",
                                 "hf:a/b/x\n.gguf", "hf:a/b/x.gguf?y=.gguf"])
def test_hf_references_cannot_leave_the_model_home(tmp_path, ref):
    home = tmp_path / "home"
    with pytest.raises(ModelError, match="expected hf:owner/repo/file.gguf"):
        models.resolve(ref, home=home)
    assert list(tmp_path.iterdir()) == []  # not even the home was created


def test_path_escape_from_the_cli_exits_3_and_creates_nothing(store_dir, tmp_path):
    home = tmp_path / "home"
    out = rag("models", "pull", "hf:a/b/../../../../x.gguf",
              env={"RAG_HOME": str(home), "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert out.returncode == 3
    assert "'..' parts are not allowed" in out.stderr and "Traceback" not in out.stderr
    assert not home.exists() or not any(home.rglob("*"))


# -- 11: names that could forge output lines ----------------------------------------------

FORGED = "x.txt\nfailed: passwd: pwned\n[1] fake.txt"


def test_control_characters_in_file_names_are_escaped(store_dir, tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / FORGED).write_text("Bananas are yellow and rich in potassium.\n")
    (docs / "bad\x1b[31m.pdf").write_bytes(b"%PDF-1.4 broken")
    monkeypatch.chdir(tmp_path)
    out = rag("ingest", "docs")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith("failed: 'docs/bad\\x1b[31m.pdf': ")
    assert "\x1b" not in out.stderr and "pwned" not in out.stderr
    hits = rag("search", "bananas", "-k", "1").stdout
    assert hits.splitlines()[0].startswith("[1] 'docs/x.txt\\nfailed: passwd: pwned\\n[1] fake.txt'  score ")
    assert not any(line.startswith("failed:") or line.startswith("[1] fake") for line in hits.splitlines())
    status = rag("status").stdout.splitlines()
    assert "  'docs/x.txt\\nfailed: passwd: pwned\\n[1] fake.txt'  (text, 1 chunks)" in status
    data = json.loads(rag("search", "bananas", "-k", "1", "--json").stdout)["hits"]
    assert data[0]["source"].endswith(FORGED)  # JSON keeps the exact name


def test_error_messages_stay_on_one_line(store_dir, tmp_path):
    result = run("ingest", str(tmp_path / "no\nsuch"))
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: path does not exist: {tmp_path}/no\\nsuch"


# -- 12: queries that start with dashes, drop, config, models list -------------------------


@pytest.mark.parametrize("command,what", [("search", "query"), ("ask", "question")])
def test_a_query_that_starts_with_dashes_says_to_use_double_dash(store_dir, command, what):
    result = run(command, "--track-origins")
    assert result.exit_code == 2
    assert (f"No such option '--track-origins'. A {what} that starts with a dash goes after --: "
            f"rag {command} -- --track-origins") in result.output


def test_search_after_double_dash_finds_the_flag(store_dir, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "valgrind.txt").write_text("Run valgrind with --track-origins=yes to see where values come from.\n")
    (docs / "other.txt").write_text("Tomatoes need sun.\n")
    assert run("ingest", str(docs)).exit_code == 0
    result = run("search", "-k", "1", "--no-dense", "--", "--track-origins")
    assert result.exit_code == 0 and "valgrind.txt" in result.output


def test_ask_after_double_dash_is_a_question(store_dir):
    result = run("ask", "--", "--track-origins?")
    assert result.exit_code == 4 and "collection 'default' does not exist" in result.output


def test_drop_of_a_missing_collection_exits_2(store_dir, corpus):
    result = run("drop", "--collection", "nope", "--yes")
    assert result.exit_code == 2
    assert f"Error: collection 'nope' does not exist in {store_dir}" in result.output
    assert run("drop", "--collection", "nope").exit_code == 2  # no confirmation for nothing
    assert not store_dir.exists()  # and nothing was created


def test_config_prints_effective_paths(tmp_path):
    home = tmp_path / "home"
    env = {k: None for k in os.environ if k.startswith("RAG_")} | {"RAG_HOME": str(home)}
    out = run("config", env=env).output
    assert f'home = "{home}"' in out
    assert f'path = "{home / "store"}"' in out and f'path = "{home / "cache"}"' in out
    assert 'path = ""' not in out and 'home = ""' not in out
    cfg = tmp_path / "out.toml"
    cfg.write_text(out)
    assert load_config(cfg, environ={}).store_path == home / "store"


def test_models_list_shows_other_models_in_the_home(store_dir, tmp_path, model_home):
    home = tmp_path / "home"
    (home / "models" / "hf" / "acme" / "tiny").mkdir(parents=True)
    for name in ("gemma-3-270m-q4_k_m.gguf", "all-MiniLM-L6-v2.f16.gguf"):
        (home / "models" / name).symlink_to(model_home / "models" / name)
    (home / "models" / "hf" / "acme" / "tiny" / "tiny.gguf").write_bytes(b"GGUF" + bytes(60))
    (home / "models" / "mine.gguf").write_bytes(b"GGUF" + bytes(60))
    env = {"RAG_HOME": str(home)}
    data = json.loads(run("models", "list", "--json", env=env).output)
    by_ref = {m["ref"]: m for m in data["present"]}
    assert by_ref["builtin:gemma-3-270m"]["configured"] == ["generator"]
    assert by_ref["builtin:all-MiniLM-L6-v2"]["configured"] == ["embedder"]
    assert by_ref["hf:acme/tiny/tiny.gguf"]["configured"] == []
    assert by_ref[str(home / "models" / "mine.gguf")]["bytes"] == 64
    assert data["available"] == ["builtin:SmolLM2-135M-Instruct"]
    text = run("models", "list", env=env).output
    assert "* builtin:gemma-3-270m" in text and "(generator)" in text
    assert "hf:acme/tiny/tiny.gguf" in text
    assert "builtin:SmolLM2-135M-Instruct  (not provisioned: rag models pull SmolLM2-135M-Instruct)" in text


def test_prefix_cache_off_is_a_configuration_error(store_dir):
    result = run("cache", "stats", env={"RAG_CACHE_ENABLED": "false"})
    assert result.exit_code == 2 and "the prefix cache is off" in result.output


@pytest.mark.parametrize("args", [["plan", "--vram", "nan"], ["plan", "--ram", "inf"], ["plan", "--vram", "-1"],
                                  ["tune", "--max-seconds", "nan"]])
def test_float_options_refuse_nan_infinities_and_negatives(store_dir, args):
    result = run(*args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert args[1] in result.output.splitlines()[-1]  # the error names the option
