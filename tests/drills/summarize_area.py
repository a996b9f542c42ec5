"""Drill area `summarize`: `rag summarize` outputs and jobs with the real small model.

Outputs on a full disk (a small tmpfs, where mounting is permitted), a rerun killed while it
rewrites its JSON Lines file, documents whose output names once collided, instructions from
a file that never ends, two processes on one job, a job killed and resumed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from drill import Defect, Drill, NotApplicable, clean, store_env

ARGS = ("--max-tokens", "4", "--ctx", "1024")


def _notes(root: Path, n: int, *, sub: str = "") -> Path:
    folder = root / sub if sub else root
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"n{i}.txt").write_text(f"Note {i}: the pump {i} runs at {i * 10 + 5} litres a minute.\n")
    return root


def _setup(d: Drill, name: str, n: int = 3) -> tuple[Path, dict]:
    base = d.fresh(name)
    return _notes(base / "docs", n), store_env(base)


def _small_disk(d: Drill, name: str):
    """A mounted, full tmpfs (None where mounting is not permitted)."""
    where = d.fresh(name) / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        raise NotApplicable("mounting a tmpfs (a real full disk) is not permitted here")
    d.cleanups.append(lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True))
    with open(where / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError:
            pass
    return where


def probe_outputs(d: Drill) -> None:
    docs, env = _setup(d, "sum-ok")
    out = docs.parent / "out"
    clean(d.rag("summarize", str(docs), *ARGS, "--out", str(out / "md"), "--jsonl", str(out / "s.jsonl"),
                env=env, timeout=600), codes={0})
    if len(list((out / "md").iterdir())) != 3 or len((out / "s.jsonl").read_text().splitlines()) != 3:
        raise Defect("three documents did not give three Markdown files and three JSON lines")


def probe_name_collision(d: Drill) -> None:
    base = d.fresh("sum-names")
    docs = base / "docs"
    (docs / "p" / "q").mkdir(parents=True)
    (docs / "p__q").mkdir()
    (docs / "p" / "q" / "r.md").write_text("# One\n\nThe first pump runs at 5 litres a minute.\n")
    (docs / "p__q" / "r.md").write_text("# Two\n\nThe second pump runs at 15 litres a minute.\n")
    clean(d.rag("summarize", str(docs), *ARGS, "--out", str(base / "md"), env=store_env(base), timeout=600),
          codes={0})
    if len(list((base / "md").iterdir())) != 2:
        raise Defect(f"two documents, {len(list((base / 'md').iterdir()))} summary file(s): one was overwritten")


def probe_jsonl_killed_rerun(d: Drill) -> None:
    docs, env = _setup(d, "sum-atomic", 8)
    jsonl = docs.parent / "s.jsonl"
    clean(d.rag("summarize", str(docs), *ARGS, "--jsonl", str(jsonl), env=env, timeout=600), codes={0})
    complete = jsonl.read_bytes()
    killed = d.rag("summarize", str(docs), *ARGS, "--jsonl", str(jsonl), "--restart",
                   env={**env, "RAG_TEST_KILL_AFTER_COMMITS": "3"}, timeout=600)
    if killed.code != -9:
        raise Defect(f"the kill hook did not stop the rerun: {killed.brief()}")
    if jsonl.read_bytes() != complete:
        raise Defect(f"a killed rerun left {len(jsonl.read_bytes().splitlines())} of 8 lines in --jsonl")


def _full_disk_output(option: str):
    def check(d: Drill) -> None:
        docs, env = _setup(d, "sum-full", 1)
        disk = _small_disk(d, "sum-disk")
        target = disk / ("out/s.jsonl" if option == "--jsonl" else "md")
        ran = clean(d.rag("summarize", str(docs), *ARGS, option, str(target), env=env, timeout=600), codes={4})
        if "cannot write the output" not in ran.err or "is full" not in ran.err:
            raise Defect(f"the message does not say the output could not be written to a full disk: {ran.brief()}")
    return check


def probe_two_processes(d: Drill) -> None:
    docs, env = _setup(d, "sum-two", 6)
    clean(d.rag("ingest", str(docs), env=env), codes={0})
    args = [sys.executable, "-m", "pipeline", "summarize", str(docs), *ARGS, "--json"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d.work,
                              env={**d.env, **env, "RAG_STORE_WAIT": "120"}) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    if [p.returncode for p in procs] != [0, 0]:
        raise Defect(f"exit statuses {[p.returncode for p in procs]}: {outs[0][1][-200:]} {outs[1][1][-200:]}")
    computed = [json.loads(out)["units_computed"] for out, _ in outs]
    if sum(computed) != 6:
        raise Defect(f"two processes on one job computed {computed} units (6 in all would be each once)")


def probe_kill_resume(d: Drill) -> None:
    docs, env = _setup(d, "sum-resume", 4)
    jsonl = docs.parent / "s.jsonl"
    ref = d.fresh("sum-resume-ref")
    clean(d.rag("summarize", str(docs), *ARGS, "--jsonl", str(ref / "s.jsonl"), env=store_env(ref), timeout=600),
          codes={0})
    d.rag("summarize", str(docs), *ARGS, "--jsonl", str(jsonl), env={**env, "RAG_TEST_KILL_AFTER_COMMITS": "3"},
          timeout=600)
    clean(d.rag("summarize", str(docs), *ARGS, "--jsonl", str(jsonl), env=env, timeout=600), codes={0})
    if jsonl.read_bytes() != (ref / "s.jsonl").read_bytes():
        raise Defect("the resumed job's JSON Lines differ from an uninterrupted run's")


def _bad_args(*args: str, codes=frozenset({2})):
    def check(d: Drill) -> None:
        base = d.fresh("sum-args")
        (base / "a-file").write_text("x\n")
        (base / "binary.txt").write_bytes(b"\xff\xfe\x00 not text \x81\n")
        here = [str(base / a[1:]) if a.startswith("@") else a for a in args]
        clean(d.rag("summarize", *here, env=store_env(base), timeout=300, max_memory=4 << 30), codes=set(codes))
    return check


PROBES = [
    ("summarize", "summarize.outputs", "three documents: three Markdown files and three JSON lines", probe_outputs),
    ("summarize", "summarize.name-collision", "p/q/r.md and p__q/r.md get a summary file each",
     probe_name_collision),
    ("summarize", "summarize.jsonl-killed-rerun", "a rerun killed mid-way leaves the previous --jsonl whole",
     probe_jsonl_killed_rerun),
    ("summarize", "summarize.jsonl-full-disk", "--jsonl on a full disk: exit 4 (a full disk), one line",
     _full_disk_output("--jsonl")),
    ("summarize", "summarize.out-full-disk", "--out on a full disk: exit 4 (a full disk), one line",
     _full_disk_output("--out")),
    ("summarize", "summarize.two-processes", "two processes on one job compute each unit once", probe_two_processes),
    ("summarize", "summarize.kill-resume", "a job killed mid-way resumes to the uninterrupted output",
     probe_kill_resume),
    ("summarize", "summarize.prompt-file-dev-zero", "--prompt-file /dev/zero: exit 2 at once",
     _bad_args("--prompt-file", "/dev/zero")),
    ("summarize", "summarize.prompt-file-binary", "--prompt-file that is not UTF-8: exit 2",
     _bad_args("--prompt-file", "@binary.txt")),
    ("summarize", "summarize.prompt-empty", "an empty -p: exit 2", _bad_args("-p", "  ", "@a-file")),
    ("summarize", "summarize.missing-path", "a missing path: exit 2", _bad_args("/nonexistent/docs")),
    ("summarize", "summarize.out-is-a-file", "--out naming a file: exit 2", _bad_args("--out", "@a-file")),
    ("summarize", "summarize.jsonl-is-a-folder", "--jsonl naming a folder: exit 2", _bad_args("--jsonl", "/tmp")),
    ("summarize", "summarize.max-tokens-0", "--max-tokens 0: exit 2", _bad_args("--max-tokens", "0")),
]
