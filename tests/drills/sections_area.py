"""Drill area `sections`: `rag warm --sections` and the section states it saves, with the real small models.

A collection of about ten times the context below (sections of 128 tokens), warmed into a cache
that is then damaged: its disk full (a small tmpfs, where mounting is permitted), its state files
deleted, cut short or bit-flipped, two warms started at once, its index deleted before a question.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from drill import Defect, Drill, NotApplicable, clean, store_env, write_corpus

#: Small sections, so that the collection is many of them and a warm is quick.
SECTIONS = {"RAG_CHUNKING_SECTION_TOKENS": "128", "RAG_CHUNKING_SIZE": "64", "RAG_CHUNKING_OVERLAP": "8"}
QUESTION = "What does the quick brown fox number 305 do?"


def _collection(d: Drill) -> dict:
    """One ingested collection and a cache warmed whole (copied by each probe, never changed)."""
    base = d.fresh("sections")
    write_corpus(base / "docs", 1)
    env = {**store_env(base), **SECTIONS}
    clean(d.rag("ingest", "--no-warm", str(base / "docs"), env=env, timeout=300), codes={0})  # warmed below
    warmed = _warm(d, env)
    if warmed["saved"] != warmed["sections"] or warmed["sections"] < 8:
        raise Defect(f"a first warm did not save every section: {warmed}")
    return {"base": base, "env": env, "sections": warmed["sections"], "bytes": warmed["bytes_written"]}


def collection(d: Drill) -> dict:
    return d.once("sections", lambda: _collection(d))


def _warm(d: Drill, env: dict, *, codes=frozenset({0})):
    ran = clean(d.rag("warm", "--sections", "--json", env=env, timeout=900), codes=set(codes))
    return json.loads(ran.out) if ran.code == 0 else ran


def _copy(d: Drill, name: str) -> dict:
    """The collection's environment with a copy of its warmed cache."""
    c = collection(d)
    cache = d.fresh(name) / "cache"
    shutil.copytree(c["base"] / "cache", cache)
    return {**c["env"], "RAG_CACHE_PATH": str(cache)}


def _section_files(cache: Path) -> list[Path]:
    """The section states of the cache (the largest files are the head's and the calibration's own)."""
    return sorted(cache.glob("*.state"), key=lambda p: p.stat().st_mtime)


def probe_full_disk(d: Drill) -> None:
    c = collection(d)
    where = d.fresh("sections-disk") / "disk"
    where.mkdir()
    size = f"{(2 * c['bytes'] >> 20) + 32}m"  # room for every state once the disk is emptied
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        raise NotApplicable("mounting a tmpfs (a real full disk) is not permitted here")
    d.cleanups.append(lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True))
    env = {**c["env"], "RAG_CACHE_PATH": str(where / "cache")}
    state = c["bytes"] // c["sections"]
    from support.full_disk import SmallDisk

    disk = SmallDisk(where)
    disk.fill(free=int(2.5 * state) + (1 << 20))
    ran = _warm(d, env, codes={4})
    line = ran.err.strip().splitlines()[-1]
    if "is full" not in line or "section state(s) saved now" not in line:
        raise Defect(f"exit 4 without saying the disk is full and how much was saved: {ran.brief()}")
    saved = int(re.search(r"(\d+) section state\(s\) saved now", line).group(1))
    if saved >= c["sections"] - 1:
        raise Defect(f"it went on after the disk was full ({saved} of {c['sections']} saved): {ran.brief()}")
    disk.empty()
    again = _warm(d, env)
    if again["saved"] + again["cached"] != again["sections"]:
        raise Defect(f"the rerun with room again did not complete the states: {again}")


def _damaged(fault: str):
    def check(d: Drill) -> None:
        env = _copy(d, f"sections-{fault}")
        cache = Path(env["RAG_CACHE_PATH"])
        victims = _section_files(cache)[2:5]
        for p in victims:
            if fault == "deleted":
                p.unlink()
            elif fault == "truncated":
                with open(p, "r+b") as fh:
                    fh.truncate(p.stat().st_size // 2)
            else:
                data = bytearray(p.read_bytes())
                data[len(data) // 2] ^= 0xFF
                p.write_bytes(bytes(data))
        report = _warm(d, env)
        if report["saved"] != len(victims) or report["saved"] + report["cached"] != report["sections"]:
            raise Defect(f"{len(victims)} {fault} state files: saved {report['saved']}, cached {report['cached']} "
                         f"of {report['sections']} (they must be found and saved again)")
    return check


def probe_two_at_once(d: Drill) -> None:
    c = collection(d)
    cache = d.fresh("sections-twice") / "cache"
    env = {**d.env, **c["env"], "RAG_CACHE_PATH": str(cache)}
    args = [sys.executable, "-m", "pipeline", "warm", "--sections", "--json"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=d.work)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    if [p.returncode for p in procs] != [0, 0]:
        raise Defect(f"exit statuses {[p.returncode for p in procs]}: {outs[0][1][-200:]} {outs[1][1][-200:]}")
    reports = [json.loads(out) for out, _ in outs]
    for r in reports:
        if r["saved"] + r["cached"] != r["sections"]:
            raise Defect(f"a warm's counts do not add up: saved {r['saved']} + cached {r['cached']} of "
                         f"{r['sections']}")
    if sum(r["saved"] for r in reports) != reports[0]["sections"]:
        raise Defect(f"two warms saved {[r['saved'] for r in reports]} of {reports[0]['sections']} sections "
                     "(each once in all would be right)")


def probe_lost_index(d: Drill) -> None:
    env = _copy(d, "sections-lost-index")
    cache = Path(env["RAG_CACHE_PATH"])
    orphans = list(cache.glob("*.state"))
    for p in cache.glob("index.sqlite*"):
        p.unlink()
    ran = clean(d.rag("ask", "--json", QUESTION, env=env, timeout=300), codes={0})
    stats = json.loads(ran.out)["stats"]
    if "evicted" in stats.get("sections_lost", []):
        raise Defect(f"sections lost with the index are reported as evicted: {stats['sections_lost']}")
    if not any("index" in n and "missing" in n for n in stats.get("notes", [])):
        raise Defect(f"the answer's notes do not say the index was lost: {stats.get('notes')}")
    left = [p for p in orphans if p.exists()]
    if left:
        raise Defect(f"{len(left)} orphaned state files ({sum(p.stat().st_size for p in left):,} bytes) were left "
                     "outside cache.max_gb")


def probe_ingest_killed_while_warming(d: Drill) -> None:
    """``rag ingest`` with its default warming, SIGKILLed after its third section state: the documents
    stay, a rerun embeds nothing and completes the states, and a question is composed from them."""
    base = d.fresh("sections-ingest-kill")
    write_corpus(base / "docs", 1)
    env = {**store_env(base), **SECTIONS, "RAG_INGEST_WARM": "auto",
           "RAG_ASK_COMPOSE_MAX_KL": "10"}  # the mechanism, not SmolLM2 on 128-token sections (over 0.05)
    killed = d.rag("ingest", str(base / "docs"), env={**env, "RAG_TEST_KILL_SECTION_SAVED": "3"}, timeout=600)
    if killed.code not in (-9, 137):
        raise Defect(f"the crash point was not reached (the warming did not run?): {killed.brief()}")
    again = json.loads(clean(d.rag("ingest", "--json", str(base / "docs"), env=env, timeout=600), codes={0}).out)
    warm = again.get("warm") or {}
    if again["chunks"] != 0 or again["counts"].get("unchanged") != 6:
        raise Defect(f"the killed ingest's documents were not all kept: {again['counts']}, {again['chunks']} chunks")
    if not warm.get("warmed") or warm["saved"] + warm["cached"] != warm["sections"] or warm["cached"] < 3:
        raise Defect(f"the rerun did not complete the section states from those saved: {warm}")
    stats = json.loads(clean(d.rag("ask", "--json", QUESTION, env=env, timeout=300), codes={0}).out)["stats"]
    if stats["cache"] != "composed" or stats["states_saved"] != 0:
        raise Defect(f"the first question was not composed from the saved states: {stats['cache']}, "
                     f"{stats['states_saved']} computed")


PROBES = [
    ("sections", "sections.full-disk", "a cache disk that fills during warm --sections: exit 4 at the first "
     "state it cannot save, saying so; the rerun completes", probe_full_disk),
    ("sections", "sections.deleted-states", "deleted state files are found and saved again", _damaged("deleted")),
    ("sections", "sections.truncated-states", "truncated state files are found and saved again",
     _damaged("truncated")),
    ("sections", "sections.flipped-states", "bit-flipped state files are found and saved again", _damaged("flipped")),
    ("sections", "sections.two-at-once", "two warms at once: each one's counts add up, each section saved once",
     probe_two_at_once),
    ("sections", "sections.lost-index", "a deleted index: 'lost', not 'evicted'; said; its orphans removed at once",
     probe_lost_index),
    ("sections", "sections.ingest-killed-while-warming", "rag ingest killed while saving section states: the "
     "documents stay, the rerun embeds nothing and completes the states, the first question is composed",
     probe_ingest_killed_while_warming),
]
