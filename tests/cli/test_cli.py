"""The ``rag`` command through click's CliRunner: output, JSON, exit statuses."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from pipeline.cli import cli


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def walk(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from walk(cmd, prefix + (name,))


@pytest.mark.parametrize("path,cmd", list(walk(cli)), ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_every_command_has_help(path, cmd):
    assert cmd.help and cmd.help.strip()
    result = run(*path, "--help")
    assert result.exit_code == 0
    assert cmd.help.strip().splitlines()[0][:30] in " ".join(result.output.split())


def test_help_does_not_load_heavy_modules():
    import subprocess
    import sys

    code = ("import sys; from pipeline.cli import cli\n"
            "from click.testing import CliRunner\n"
            "CliRunner().invoke(cli, ['--help'])\n"
            "heavy = [m for m in ('llama_cpp', 'chromadb', 'langchain_text_splitters', 'numpy') if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.slow
def test_ingest_search_status_round_trip(store_dir, corpus):
    result = run("ingest", str(corpus))
    assert result.exit_code == 0, result.output
    assert "4 new, 0 changed, 0 unchanged, 1 skipped, 0 failed" in result.output
    again = run("ingest", str(corpus))
    assert "0 new, 0 changed, 4 unchanged, 1 skipped, 0 failed; nothing to embed" in again.output

    hits = json.loads(run("search", "ERR_SOCKET_ZX81", "--top-k", "2", "--json").output)["hits"]
    assert len(hits) == 2
    assert set(hits[0]) >= {"source", "page", "score", "text", "found_by"}
    assert hits[0]["source"].endswith("notes.txt") and "lexical" in hits[0]["found_by"]

    text = run("search", "bananas potassium", "-k", "1").output
    assert "manual.pdf, page 2" in text and "bananas" in text

    st = json.loads(run("status", "--json").output)
    assert st["documents"] == 4 and st["exists"] and st["store"] == str(store_dir)
    human = run("status").output
    assert "documents:   4" in human and "all-MiniLM-L6-v2" in human


@pytest.mark.slow
def test_ingest_json_report(store_dir, corpus):
    data = json.loads(run("ingest", str(corpus), "--json").output)
    assert data["counts"] == {"new": 4, "changed": 0, "unchanged": 0, "skipped": 1, "failed": 0,
                              "removed": 0, "missing": 0}
    assert data["chunks"] > 0 and data["tokens"] > 0 and data["seconds"] > 0
    assert {f["status"] for f in data["files"]} == {"new", "skipped"}


@pytest.mark.slow
def test_missing_path_exits_nonzero_with_a_message(store_dir, corpus):
    result = run("ingest", str(corpus / "nope"))
    assert result.exit_code == 2
    assert "Error: path does not exist" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_unreadable_file_is_reported_but_exit_is_zero_unless_strict(store_dir, corpus):
    from support.pdfs import make_corrupt_pdf

    make_corrupt_pdf(corpus / "broken.pdf")
    result = run("ingest", str(corpus))
    assert result.exit_code == 0
    assert "failed: " in result.output and "broken.pdf" in result.output
    assert "1 failed" in result.output
    (corpus / "broken2.pdf").write_bytes(b"%PDF-1.4 garbage")
    assert run("ingest", str(corpus), "--strict").exit_code == 1


def test_a_run_where_every_file_failed_exits_1_and_says_so(tmp_store, tmp_path):
    docs = tmp_path / "broken"
    docs.mkdir()
    (docs / "a.pdf").write_bytes(b"%PDF-1.4 garbage")
    (docs / "b.pdf").write_bytes(b"%PDF-1.4 more garbage")
    (docs / "c.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # skipped: not a failure, not a success either
    result = run("ingest", str(docs))
    assert result.exit_code == 1
    assert "2 failed" in result.output and "no file could be ingested: 2 failed" in result.output
    result = run("ingest", str(docs), "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["counts"]["failed"] == 2


def test_an_empty_folder_or_one_without_documents_is_not_a_success(tmp_store, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".hidden.md").write_text("# skipped, as hidden files are\n")
    result = run("ingest", str(empty))
    assert result.exit_code == 2 and "no files under" in result.output and "nothing to ingest" in result.output
    assert not tmp_store.exists()  # refused before the store opens: nothing created
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    (pictures / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    result = run("ingest", str(pictures))
    assert result.exit_code == 1 and "no document found: the 1 file(s)" in result.output
    assert "warm" not in result.output and "section states" not in result.output


def test_search_before_ingest_is_a_clear_error(tmp_store):
    result = run("search", "anything")
    assert result.exit_code == 4
    assert "collection 'default' does not exist" in result.output and "rag ingest" in result.output


def test_status_of_an_empty_store(tmp_store):
    result = run("status")
    assert result.exit_code == 0 and "does not exist yet" in result.output
    assert not tmp_store.exists()  # status never creates anything


def test_bad_config_key_names_the_key(tmp_store, tmp_path, monkeypatch):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[retrieval]\ntop_kk = 3\n")
    result = run("--config", str(cfg), "status")
    assert result.exit_code == 2 and "unknown setting 'retrieval.top_kk'" in result.output
    monkeypatch.setenv("RAG_STORE_COLECTION", "x")
    result = run("status")
    assert result.exit_code == 2 and "RAG_STORE_COLECTION" in result.output


def test_invalid_collection_name(tmp_store, corpus):
    result = run("ingest", str(corpus), "--collection", "a b")
    assert result.exit_code == 2 and "invalid collection name" in result.output


@pytest.mark.slow
def test_drop(store_dir, corpus):
    run("ingest", str(corpus / "notes.txt"))
    assert run("drop").exit_code == 1  # confirmation refused (no input)
    result = run("drop", "--yes")
    assert result.exit_code == 0 and "dropped collection 'default'" in result.output
    assert "does not exist yet" in run("status").output
    assert run("drop", "--yes").exit_code == 2  # bad input: no such collection


@pytest.mark.slow
def test_models_list(store_dir):
    data = json.loads(run("models", "list", "--json").output)
    assert data["embedder"]["ready"] and data["embedder"]["path"].endswith(".gguf")
    assert data["generator"]["ready"]


def test_config_prints_effective_settings(tmp_store, monkeypatch):
    monkeypatch.setenv("RAG_RETRIEVAL_TOP_K", "9")
    out = run("config").output
    assert "top_k = 9" in out and f'path = "{tmp_store}"' in out


def test_config_never_prints_credentials_in_urls(tmp_store, monkeypatch):
    monkeypatch.setenv("RAG_MODELS_GENERATOR", "openai:http://alice:s3cret@127.0.0.1:9/v1#m")
    out = run("config")
    assert out.exit_code == 0, out.output
    assert "s3cret" not in out.output and "alice" not in out.output
    assert 'generator = "openai:http://***@127.0.0.1:9/v1#m"' in out.output
    assert out.output.startswith("# credentials in URLs are shown as ***")


def test_python_dash_m_works(tmp_store):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "ingest" in out.stdout


@pytest.mark.slow
def test_sections_shows_the_sizes_and_recut_cuts_the_others_again_from_the_stored_chunks(store_dir, tmp_path):
    """After a change of size, `rag sections` names the documents cut to another one, and --recut cuts
    them again (nothing embedded: the chunks stay); prompts then pack the new sections; a second
    --recut has nothing to do; a missing collection is an error, not a traceback."""
    from pipeline import Pipeline
    from pipeline.schemas import validate

    docs = tmp_path / "shelf"
    docs.mkdir()
    for name, topic in [("a.md", "pump"), ("b.md", "valve")]:
        (docs / name).write_text("\n\n".join(
            f"Paragraph {i} of the {topic} manual: the {topic} unit {i} reports level {i * 7}." for i in range(60)))
    runner = CliRunner()
    small = {"RAG_CHUNKING_SIZE": "64", "RAG_CHUNKING_OVERLAP": "8", "RAG_CHUNKING_SECTION_TOKENS": "512"}
    assert runner.invoke(cli, ["ingest", str(docs)], env=small).exit_code == 0
    chunks_before = Pipeline.from_config(overrides={"chunking.size": 64}).status().chunks

    smaller = {**small, "RAG_CHUNKING_SECTION_TOKENS": "128"}
    shown = runner.invoke(cli, ["sections"], env=smaller)
    assert shown.exit_code == 0, shown.output
    assert "cut at 512 tokens" in shown.output and "another size than the settings'" in shown.output
    assert "`rag sections --recut` cuts the other 2 documents again at 128 tokens" in shown.output

    before = json.loads(runner.invoke(cli, ["sections", "--json"], env=smaller).stdout)
    recut = runner.invoke(cli, ["sections", "--recut", "--json"], env=smaller)
    assert recut.exit_code == 0, recut.output
    after = json.loads(recut.stdout)
    validate("sections", before)
    validate("sections", after)
    assert before["stale"] == 2 and [t["target"] for t in before["by_target"]] == [512]
    assert after["recut"] == 2 and after["stale"] == 0 and [t["target"] for t in after["by_target"]] == [128]
    assert after["sections"] > before["sections"] and after["documents"] == before["documents"] == 2

    with Pipeline.from_config(overrides={"chunking.size": 64, "chunking.section_tokens": 128}) as rag:
        assert rag.status().chunks == chunks_before
        prompt = rag.prompt("What level does pump unit 7 report?")
        assert {p.section.target for p in prompt.sections} == {128}
    again = runner.invoke(cli, ["sections", "--recut"], env=smaller)
    assert again.exit_code == 0 and "nothing to cut again" in again.output
    derived = {**small, "RAG_CHUNKING_SECTION_TOKENS": "0"}
    composed = runner.invoke(cli, ["sections", "--ctx", "4096", "--json"], env=derived)
    assert json.loads(composed.stdout)["target"] == 1024  # a quarter of the context given, for composed prompts
    exact = runner.invoke(cli, ["sections", "--ctx", "4096", "--json"], env={**derived, "RAG_ASK_COMPOSE": "off"})
    assert json.loads(exact.stdout)["target"] == 256  # a sixteenth where prompts are prefilled exactly

    missing = runner.invoke(cli, ["sections", "--recut", "--collection", "nope"], env=smaller)
    assert missing.exit_code == 4 and "collection 'nope' does not exist" in missing.output
    assert "Traceback" not in missing.output
