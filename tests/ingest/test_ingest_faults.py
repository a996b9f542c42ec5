"""Regression tests for issue 8's ingest and store defects, each on the exact case the drill found.

Real files (FIFOs, sockets, device links, symlink loops, unreadable folders, a full
file system), real Chroma and the real default embedder. Each test checks the
message, the exit status, and that nothing stored was lost.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import StoreError


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def rag(*args, timeout=120, drop_root_read=False):
    """``rag ARGS`` in a new process (a hang fails the test instead of stalling it).

    ``drop_root_read``: as root, run without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so that file
    modes apply to it as to any user (chmod 000 does not stop root otherwise).
    """
    preexec = _drop_dac_capabilities if drop_root_read and os.geteuid() == 0 else None
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ), preexec_fn=preexec)


def _drop_dac_capabilities() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: gone from the bounding set, so from exec
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def status(collection="default"):
    return json.loads(run("status", "--collection", collection, "--json").output)


def sources(collection="default"):
    return {Path(s["source"]).name for s in status(collection)["sources"]}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def docs(tmp_path) -> Path:
    root = tmp_path / "docs"
    write(root / "zebra.md", "# Zebras\n\nZebras have black and white stripes that confuse flies.\n")
    write(root / "sub" / "otter.txt", "Sea otters hold hands while they sleep so they do not drift apart.\n")
    return root


# 1. the same file in two collections of one store


def test_the_same_file_goes_into_two_collections_of_one_store(store_dir, docs):
    first = run("ingest", docs, "--collection", "aaa")
    assert first.exit_code == 0, first.output
    second = run("ingest", docs, "--collection", "bbb")
    assert second.exit_code == 0, second.output
    assert "2 new" in second.output and "Traceback" not in second.output
    assert status("aaa")["documents"] == status("bbb")["documents"] == 2
    for name in ("aaa", "bbb"):
        st = status(name)
        assert st["chunks"] == st["dense_chunks"]
        hits = json.loads(run("search", "stripes confuse flies", "--collection", name, "--json").output)["hits"]
        assert Path(hits[0]["source"]).name == "zebra.md"
    assert run("drop", "--collection", "aaa", "--yes").exit_code == 0
    assert status("bbb")["documents"] == 2  # the other collection keeps its chunks


# 2. a symlink loop anywhere in the folder


def test_a_symlink_loop_is_reported_and_the_rest_ingested(store_dir, docs):
    os.symlink("b", docs / "a.txt")
    os.symlink("a.txt", docs / "b")
    os.symlink("..", docs / "sub" / "up")  # a folder loop too
    result = run("ingest", docs)
    assert result.exit_code == 0, result.output
    assert "skipped: " in result.output and "a.txt: symlink loop" in result.output
    assert "up: symlink to a folder already scanned" in result.output
    assert sources() == {"zebra.md", "otter.txt"}


# 3. FIFOs, sockets, devices: only regular files are opened


def test_special_files_are_skipped_and_never_opened(store_dir, docs, tmp_path):
    os.mkfifo(docs / "pipe.txt")
    os.symlink("/dev/zero", docs / "zero.txt")
    os.symlink("/dev/urandom", docs / "random.md")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(docs / "sock.txt"))
    try:
        out = rag("ingest", docs, timeout=180)  # would hang forever on the FIFO, holding the store lock
    finally:
        sock.close()
    assert out.returncode == 0, out.stderr
    assert "pipe.txt: not a regular file: a FIFO (named pipe)" in out.stderr
    assert "zero.txt: symlink to a character device (/dev/zero)" in out.stderr
    assert "random.md: symlink to a character device (/dev/urandom)" in out.stderr
    assert "sock.txt: not a regular file: a socket" in out.stderr
    assert "2 new" in out.stdout and "4 skipped" in out.stdout
    assert sources() == {"zebra.md", "otter.txt"}
    assert run("search", "zebras").exit_code == 0  # the lock was released


def test_a_fifo_swapped_in_after_the_scan_is_refused_at_open(tmp_path):
    """The loader and the hash open non-blocking and check the open file, so even a race cannot hang."""
    import threading

    from pipeline.errors import LoadError
    from pipeline.ingest.loaders import load
    from pipeline.ingest.scan import file_hash

    fifo = tmp_path / "late.md"
    os.mkfifo(fifo)
    outcome = {}

    def attempt():
        for name, fn in (("load", load), ("hash", file_hash)):
            try:
                fn(fifo)
            except LoadError as exc:
                outcome[name] = str(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert outcome == {"load": "not a regular file: a FIFO (named pipe)",
                       "hash": "not a regular file: a FIFO (named pipe)"}


# 6. symlinks that leave the folder


def test_links_leaving_the_folder_are_skipped_unless_followed_and_keep_their_own_name(store_dir, docs, tmp_path):
    outside = write(tmp_path / "elsewhere" / "giraffe.md", "# Giraffes\n\nGiraffes sleep less than two hours a day.\n")
    os.symlink(outside, docs / "linked.md")
    os.symlink("/etc/passwd", docs / "passwd")
    os.symlink("zebra.md", docs / "alias.md")  # inside the folder: the file itself is taken once
    result = run("ingest", docs)
    assert result.exit_code == 0, result.output
    assert f"linked.md: symlink leaves the folder (to {outside})" in result.output
    assert "--follow-symlinks" in result.output
    assert sources() == {"zebra.md", "otter.txt"}

    result = run("ingest", docs, "--follow-symlinks")
    assert result.exit_code == 0, result.output
    names = {s["source"] for s in status()["sources"]}
    assert str(docs / "linked.md") in names and str(docs / "passwd") in names  # the link's path, not the target
    assert not any(n.startswith("/etc/") or "elsewhere" in n for n in names)
    # without the flag again: the links are reported, and what the earlier run stored stays
    result = run("ingest", docs, "--prune")
    assert result.exit_code == 0 and "removed" not in result.output and "missing" not in result.output
    assert str(docs / "linked.md") in {s["source"] for s in status()["sources"]}

    (docs / "linked.md").unlink()
    (docs / "passwd").unlink()
    result = run("ingest", docs, "--prune")
    assert result.exit_code == 0 and "2 removed" in result.output
    assert sources() == {"zebra.md", "otter.txt"}


def test_a_link_to_a_folder_inside_is_followed_under_its_own_name(store_dir, docs):
    write(docs / ".versions" / "v3" / "lion.md", "# Lions\n\nLions rest for up to twenty hours a day.\n")
    os.symlink(".versions/v3", docs / "current")
    assert run("ingest", docs).exit_code == 0
    assert str(docs / "current" / "lion.md") in {s["source"] for s in status()["sources"]}


# 7. full disk, read-only store


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 24 MiB file system (tmpfs, mounted by root); skipped where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({made.stderr.strip()}); "
                    "test_store_write_errors_are_clear covers the error mapping")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_a_clear_error_and_the_next_run_recovers(tmp_path, docs, tiny_fs, monkeypatch, store_dir):
    store = tiny_fs / "store"
    monkeypatch.setenv("RAG_STORE_PATH", str(store))
    assert run("ingest", docs).exit_code == 0
    before = status()
    big = write(docs / "big.md", "\n\n".join(f"Paragraph {i} about hippos wallowing in river mud number {i}."
                                            for i in range(600)))
    filler = tiny_fs / "filler"
    with open(filler, "wb") as fh:  # fill the file system to the last block
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError:
            pass
    out = rag("ingest", docs, timeout=300)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "Error: the disk holding the store" in out.stderr and "is full" in out.stderr
    assert "Traceback" not in out.stderr
    filler.unlink()
    after = status()
    assert after["documents"] == before["documents"] and after["chunks"] == before["chunks"]
    assert json.loads(run("search", "stripes confuse flies", "--json").output)["hits"][0]["source"].endswith("zebra.md")
    again = run("ingest", docs)
    assert again.exit_code == 0 and "1 new" in again.output, again.output
    final = status()
    assert final["documents"] == 3 and final["chunks"] == final["dense_chunks"]
    assert big.name in sources()

    # The same store on a file system remounted read-only: a message and exit 4, for reads too.
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    for args in (("status",), ("search", "zebras"), ("ingest", docs)):
        out = rag(*args)
        assert out.returncode == 4, (args, out.stderr)
        assert "cannot take the store lock" in out.stderr and "Read-only file system" in out.stderr
        assert "Traceback" not in out.stderr


def test_store_write_errors_are_clear(store_dir, docs, monkeypatch):
    """Whatever the file system: a Chroma write failing for lack of space maps to exit 4, nothing lost."""
    from chromadb.errors import InternalError
    from chromadb.api.models.Collection import Collection

    assert run("ingest", docs).exit_code == 0
    write(docs / "new.md", "# New\n\nA new document about pelicans.\n")

    def full(self, *a, **k):
        raise InternalError("Query error: Database error: (code: 13) database or disk is full")

    with monkeypatch.context() as patch:
        patch.setattr(Collection, "upsert", full)
        result = run("ingest", docs)
    assert result.exit_code == 4
    assert "the disk holding the store" in result.output and "0 of 1 files to embed were committed" in result.output
    assert status()["documents"] == 2
    assert run("ingest", docs).exit_code == 0 and status()["documents"] == 3


# 8. unreadable folders and trees deeper than PATH_MAX


def test_an_unreadable_folder_is_reported_and_its_documents_never_pruned(store_dir, docs):
    assert run("ingest", docs).exit_code == 0
    (docs / "sub").chmod(0)
    try:
        out = rag("ingest", docs, "--prune", "--strict", drop_root_read=True)
        plain = rag("ingest", docs, drop_root_read=True)
    finally:
        (docs / "sub").chmod(0o755)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "failed: " in out.stderr and "sub: cannot read folder: Permission denied" in out.stderr
    assert "1 failed" in out.stdout and "removed" not in out.stdout
    assert plain.returncode == 0 and "missing" not in plain.stdout
    assert sources() == {"zebra.md", "otter.txt"}  # nothing pruned


def test_a_tree_deeper_than_path_max_is_reported(store_dir, docs):
    fd = os.open(docs, os.O_RDONLY)
    try:  # each level through its parent's descriptor: the path itself is too long to use
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            child = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("deep.md", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        os.write(leaf, b"# Deep\n\nToo deep to open by path.\n")
        os.close(leaf)
    finally:
        os.close(fd)
    result = run("ingest", docs, "--strict")
    assert result.exit_code == 1, result.output
    assert "path longer than the system allows (PATH_MAX)" in result.output
    assert sources() == {"zebra.md", "otter.txt"}
    subprocess.run(["rm", "-rf", str(docs / ("d" * 250))], check=True)


# 9. expected errors without tracebacks


def test_search_and_ask_with_another_embedder_say_so(store_dir, docs, make_pipeline):
    assert run("ingest", docs).exit_code == 0
    other = {"RAG_MODELS_EMBEDDER": "builtin:SmolLM2-135M-Instruct"}
    result = CliRunner().invoke(cli, ["search", "zebras"], env=other, catch_exceptions=False)
    assert result.exit_code == 4
    assert "was built with the embedder builtin:all-MiniLM-L6-v2; the configured one is " \
           "builtin:SmolLM2-135M-Instruct" in result.output
    assert "dimension" not in result.output
    with pytest.raises(StoreError, match="was built with the embedder builtin:all-MiniLM-L6-v2"):
        make_pipeline(models__embedder="builtin:SmolLM2-135M-Instruct", engine__n_ctx=512).ask("zebras?")
    # lexical search needs no embedder and still works
    lexical = CliRunner().invoke(cli, ["search", "zebras", "--no-dense"], env=other, catch_exceptions=False)
    assert lexical.exit_code == 0 and "zebra.md" in lexical.output


def test_a_collection_name_chroma_refuses_is_refused_up_front(store_dir, docs):
    assert run("ingest", docs).exit_code == 0
    result = run("ingest", docs, "--collection", "10.0.0.1")
    assert result.exit_code == 2
    assert "invalid collection name '10.0.0.1': a name that reads as an IPv4 address" in result.output
    assert status()["collections"] == ["default"]  # never recorded
    assert run("search", "zebras").exit_code == 0


# 11. smaller defects


def test_utf16_without_a_bom_is_text(store_dir, docs):
    (docs / "notes16.txt").write_bytes("Narwhal tusks are teeth with ten million nerve endings.\n".encode("utf-16-le"))
    (docs / "big16.txt").write_bytes("Walruses use their tusks to haul out of water.\n".encode("utf-16-be"))
    result = run("ingest", docs, "--json")
    data = json.loads(result.output)
    outcome = {Path(f["path"]).name: f["status"] for f in data["files"]}
    assert outcome["notes16.txt"] == outcome["big16.txt"] == "new"
    hits = json.loads(run("search", "narwhal nerve endings", "--json", "--no-dense").output)["hits"]
    assert Path(hits[0]["source"]).name == "notes16.txt" and "Narwhal tusks" in hits[0]["text"]


def test_files_over_the_size_limit_are_reported(store_dir, docs, monkeypatch):
    monkeypatch.setenv("RAG_INGEST_MAX_FILE_MB", "0.01")  # 10 KiB
    write(docs / "huge.txt", "x" * 20_000)  # one long line
    with gzip.open(docs / "bomb.txt.gz", "wb") as fh:  # 1 KiB on disk, 1 MiB inside
        fh.write(b"y" * (1 << 20))
    result = run("ingest", docs, "--strict")
    assert result.exit_code == 0, result.output  # skipped, not failed
    assert "huge.txt: 0.0191 MB is over the size limit of 0.01 MB (ingest.max_file_mb)" in result.output
    assert "bomb.txt.gz: decompressed size over the limit of 0.01 MB" in result.output
    assert sources() == {"zebra.md", "otter.txt"}
    monkeypatch.setenv("RAG_INGEST_MAX_FILE_MB", "nan")
    bad = run("ingest", docs)
    assert bad.exit_code == 2 and "ingest.max_file_mb must be a finite number, got nan" in bad.output


def test_progress_is_reported_in_tokens_without_a_terminal(store_dir, docs, monkeypatch):
    from pipeline.cli.collection import IngestProgress

    monkeypatch.setattr(IngestProgress, "every", 0.0)
    write(docs / "long.md", "\n\n".join(f"Paragraph {i}: capybaras are the largest rodents." for i in range(400)))
    result = CliRunner().invoke(cli, ["ingest", str(docs), "--json"], catch_exceptions=False)
    assert result.exit_code == 0
    data = json.loads(result.stdout)  # stdout stays pure JSON
    lines = [line for line in result.stderr.splitlines() if line.startswith("embedding: ")]
    assert lines and "tokens" in lines[-1] and "chunks" in lines[-1] and "% of" in lines[-1]
    assert f"{data['tokens']:,} tokens" in lines[-1]


def test_progress_events_count_tokens_and_bytes(make_pipeline, docs):
    events = []
    write(docs / "long.md", "\n\n".join(f"Paragraph {i}: capybaras are the largest rodents." for i in range(400)))
    report = make_pipeline().ingest([docs], progress=events.append)
    plan, last = events[0], events[-1]
    assert plan.kind == "plan" and plan.total == 3 and plan.total_bytes == sum(
        p.stat().st_size for p in docs.rglob("*") if p.is_file())
    chunk_events = [e for e in events if e.kind == "chunks"]
    assert [e.done_tokens for e in chunk_events] == sorted(e.done_tokens for e in chunk_events)
    assert any(0 < e.done_bytes < plan.total_bytes for e in chunk_events)  # moves inside one long file
    assert last.done_tokens == report.tokens and last.done_chunks == report.chunks
    assert last.done_bytes == plan.total_bytes


def test_reads_never_create_a_store(store_dir, tmp_path, make_pipeline):
    nowhere = tmp_path / "no-store"
    # status says what exists (0); drop of a missing collection is bad input (2); the rest: no store (4)
    for args, code in ((("search", "x"), 4), (("status",), 0), (("ask", "x"), 4), (("warm",), 4),
                       (("drop", "--yes"), 2)):
        result = run(*args, "--store", nowhere)
        assert result.exit_code == code, (args, result.output)
        assert "Traceback" not in result.output
    assert not nowhere.exists()
    result = run("search", "x", "--store", nowhere)
    assert result.exit_code == 4 and "there is no store at" in result.output


# 12. common text files


def test_text_by_content_gzip_and_globs(store_dir, docs):
    write(docs / "README", "The capybara is a giant cavy rodent native to South America.\n")
    write(docs / "copyright", "Copyright 2024 The Wombat Authors. Licensed under the MIT license.\n")
    (docs / "NEWS.Debian.gz").write_bytes(gzip.compress(b"Version 2.0 adds support for echidnas.\n"))
    (docs / "guide.md.gz").write_bytes(gzip.compress(b"# Guide\n\nPlatypuses lay eggs.\n"))
    (docs / "blob").write_bytes(bytes(range(256)) * 8)  # no extension, binary content
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    data = json.loads(run("ingest", docs, "--json").output)
    outcome = {Path(f["path"]).name: (f["status"], f["reason"]) for f in data["files"]}
    for name in ("README", "copyright", "NEWS.Debian.gz", "guide.md.gz"):
        assert outcome[name][0] == "new", (name, outcome[name])
    assert outcome["blob"] == ("skipped", "not a text file (binary content)")
    assert outcome["photo.png"] == ("skipped", "unsupported file type")
    hits = json.loads(run("search", "echidnas", "--json", "--no-dense").output)["hits"]
    assert Path(hits[0]["source"]).name == "NEWS.Debian.gz"
    with_title = {s["source"]: s["title"] for s in status()["sources"]}
    assert with_title[str(docs / "guide.md.gz")] == "Guide"

    # --include / --exclude select files; what they leave out is left as it is, never pruned
    run("drop", "--yes")
    result = run("ingest", docs, "--include", "*.md", "--include", "README", "--exclude", "sub")
    assert result.exit_code == 0, result.output
    assert sources() == {"zebra.md", "README"}
    result = run("ingest", docs, "--exclude", "*.md", "--prune")
    assert result.exit_code == 0 and "removed" not in result.output
    assert sources() >= {"zebra.md", "README", "otter.txt", "copyright"}
