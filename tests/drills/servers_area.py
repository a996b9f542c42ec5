"""Drill areas `servers` and `disk`: the store's servers stopped, refused or misnamed, and the store's
disk full.

A real Chroma server (`chroma run`) and, where Debian's PostgreSQL is installed, a throwaway
cluster, both on 127.0.0.1; SIGSTOP freezes a server the way an overloaded or suspended host
does (it accepts connections and never answers). Full disks are small tmpfs mounts, where
mounting is permitted.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from drill import Defect, Drill, NotApplicable, clean, store_env

CORPUS = {"guide.md": "# Prefill\n\nThe flag --n-cpu-moe keeps expert tensors in CPU memory.\n",
          "notes.txt": "Tomato plants need full sun and regular watering.\n"}


def _docs(base: Path) -> Path:
    docs = base / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (docs / name).write_text(text)
    return docs


def _chroma(d: Drill) -> dict:
    from devtools.servers import ChromaServer

    base = d.fresh("chroma")
    server = ChromaServer(base / "server").start()
    d.cleanups.append(server.stop)
    env = {**store_env(base), "RAG_STORE_URL": server.url, "RAG_STORE_TIMEOUT": "3"}
    clean(d.rag("ingest", str(_docs(base)), env=env), codes={0})
    return {"server": server, "env": env}


def _closed_port() -> int:
    from devtools.servers import free_port

    return free_port()  # nothing listens there once the probe socket is closed


def _timed(d: Drill, args: list[str], env: dict, *, codes: set[int], within: float, hide: str = "") -> None:
    t0 = time.monotonic()
    ran = clean(d.rag(*args, env=env, timeout=max(120, 3 * within)), codes=codes)
    if time.monotonic() - t0 > within:
        raise Defect(f"it took {time.monotonic() - t0:.0f} s (more than {within:g}): {ran.brief()}")
    if hide and hide in ran.out + ran.err:
        raise Defect(f"a secret was printed: {ran.brief()}")


def probe_chroma_stopped(d: Drill) -> None:
    c = d.once("chroma", lambda: _chroma(d))
    os.kill(c["server"].proc.pid, signal.SIGSTOP)
    try:
        for args in (["status"], ["search", "tomato"]):
            _timed(d, args, c["env"], codes={4}, within=60)
            ran = d.rag(*args, env=c["env"])
            if "store.timeout" not in ran.err:
                raise Defect(f"the message does not name store.timeout: {ran.brief()}")
    finally:
        os.kill(c["server"].proc.pid, signal.SIGCONT)


def probe_chroma_refused(d: Drill) -> None:
    base = d.fresh("chroma-refused")
    env = {**store_env(base), "RAG_STORE_URL": f"http://127.0.0.1:{_closed_port()}", "RAG_STORE_TOKEN": "s3cret-tok"}
    _timed(d, ["ingest", str(_docs(base))], env, codes={4}, within=60, hide="s3cret-tok")


def probe_chroma_killed(d: Drill) -> None:
    from devtools.servers import ChromaServer

    base = d.fresh("chroma-killed")
    server = ChromaServer(base / "server").start()
    env = {**store_env(base), "RAG_STORE_URL": server.url}
    clean(d.rag("ingest", str(_docs(base)), env=env), codes={0})
    server.stop()
    _timed(d, ["search", "tomato"], env, codes={4}, within=30)


def probe_pg_refused(d: Drill) -> None:
    base = d.fresh("pg-refused")
    url = f"postgresql://rag:s3cret-pw@127.0.0.1:{_closed_port()}/rag"
    _timed(d, ["status"], {**store_env(base), "RAG_STORE_CATALOG_URL": url}, codes={4}, within=40, hide="s3cret-pw")


def probe_pg_stopped(d: Drill) -> None:
    from devtools.servers import PostgresCluster, postgres_bin

    bindir = postgres_bin()
    if bindir is None:
        raise NotApplicable("PostgreSQL is not installed here")
    cluster = PostgresCluster(bindir).start()
    d.cleanups.append(cluster.stop)
    base = d.fresh("pg-stopped")
    env = {**store_env(base), "RAG_STORE_CATALOG_URL": cluster.create_database()}
    clean(d.rag("ingest", str(_docs(base)), env=env), codes={0})
    postmaster = int((cluster.dir / "data" / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGSTOP)  # connections queue in the kernel; none is ever answered
    try:
        _timed(d, ["status"], env, codes={4, 5}, within=60)
    finally:
        os.kill(postmaster, signal.SIGCONT)


# -- a full disk --------------------------------------------------------------------------------------


def _mount(d: Drill, name: str, size: str) -> Path:
    where = d.fresh(name) / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        raise NotApplicable("mounting a tmpfs (a real full disk) is not permitted here")
    d.cleanups.append(lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True))
    return where


def _fill(where: Path, *, free: int) -> None:
    st = os.statvfs(where)
    room = st.f_bavail * st.f_frsize - free
    with open(where / "filler", "wb") as fh:
        while room > 0:
            try:
                room -= fh.write(b"\0" * min(room, 1 << 20))
                fh.flush()
            except OSError:
                break


def _reference_store(d: Drill) -> Path:
    base = d.fresh("disk-ref")
    clean(d.rag("ingest", str(_docs(base)), env=store_env(base)), codes={0})
    return base / "store"


def probe_reads_on_a_full_disk(d: Drill) -> None:
    ref = d.once("disk-ref", lambda: _reference_store(d))
    where = _mount(d, "disk-read", "8m")
    codes = []
    for free_kb in (0, 8, 24, 40, 56, 80):
        shutil.rmtree(where / "store", ignore_errors=True)
        (where / "filler").unlink(missing_ok=True)
        shutil.copytree(ref, where / "store")
        _fill(where, free=free_kb * 1024)
        env = {"RAG_STORE_PATH": str(where / "store"), "RAG_CACHE_ENABLED": "false"}
        for args in (["status"], ["search", "tomato"]):
            ran = clean(d.rag(*args, env=env), codes={0, 4})
            if ran.code == 4 and "is full" not in ran.err:
                raise Defect(f"exit 4 without saying the disk is full: {ran.brief()}")
            codes.append(ran.code)
    if 4 not in codes:
        raise Defect("a store on a disk with no room at all read without an error")


def probe_ingest_on_a_full_disk(d: Drill) -> None:
    base = d.fresh("disk-ingest")
    docs = base / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"doc{i}.md").write_text(f"# Report {i}\n\n" + " ".join(
            f"Sensor {i}-{j} read {j * 37 % 1000} units at hour {j % 24}." for j in range(400)))
    where = _mount(d, "disk-ingest-mnt", "8m")
    _fill(where, free=1500 * 1024)
    env = {"RAG_STORE_PATH": str(where / "store"), "RAG_CACHE_ENABLED": "false", "RAG_CHUNKING_SIZE": "32",
           "RAG_CHUNKING_OVERLAP": "0"}
    ran = clean(d.rag("ingest", str(docs), env=env, timeout=600), codes={4})
    if "is full" not in ran.err:
        raise Defect(f"the message does not say the disk is full: {ran.brief()}")


def probe_cache_on_a_full_disk(d: Drill) -> None:
    ref = d.once("disk-ref", lambda: _reference_store(d))
    where = _mount(d, "disk-cache", "1m")
    _fill(where, free=0)
    env = {"RAG_STORE_PATH": str(ref), "RAG_CACHE_PATH": str(where / "cache"), "RAG_CACHE_MIN_TOKENS": "16"}
    clean(d.rag("ask", "What do tomato plants need?", env=env, timeout=300), codes={0})


def probe_cache_stats_on_a_full_disk(d: Drill) -> None:
    """`rag cache stats` and `clear` where the cache folder does not exist yet and cannot be made: exit 4, as
    every full disk is."""
    where = _mount(d, "disk-cache-stats", "1m")
    _fill(where, free=0)
    env = {**store_env(d.fresh("disk-cache-stats-store")), "RAG_CACHE_PATH": str(where / "cache")}
    for args in (["cache", "stats"], ["cache", "clear", "--yes"]):
        ran = clean(d.rag(*args, env=env), codes={4})
        if "full" not in ran.err:
            raise Defect(f"the message does not say the disk is full: {ran.brief()}")


PROBES = [
    ("servers", "servers.chroma-stopped", "a SIGSTOPped Chroma server: exit 4 within store.timeout, naming it",
     probe_chroma_stopped),
    ("servers", "servers.chroma-refused", "a Chroma URL where nothing listens: exit 4, the token never shown",
     probe_chroma_refused),
    ("servers", "servers.chroma-killed", "a Chroma server that went away: exit 4", probe_chroma_killed),
    ("servers", "servers.chroma-bad-url", "store.url that is not http(s)://host:port: exit 2",
     lambda d: clean(d.rag("status", env={**store_env(d.fresh("u")), "RAG_STORE_URL": "ftp://x:1"}), codes={2})),
    ("servers", "servers.pg-refused", "a PostgreSQL URL where nothing listens: exit 4, the password never shown",
     probe_pg_refused),
    ("servers", "servers.pg-stopped", "a SIGSTOPped PostgreSQL: exit 4 or 5 in time", probe_pg_stopped),
    ("servers", "servers.pg-bad-url", "store.catalog_url that is not PostgreSQL: exit 2",
     lambda d: clean(d.rag("status", env={**store_env(d.fresh("u")),
                                          "RAG_STORE_CATALOG_URL": "mysql://a:s3cret@h/db"}), codes={2})),
    ("disk", "disk.reads-full", "status and search on a full disk: exit 0 or 4 (saying so), never a traceback",
     probe_reads_on_a_full_disk),
    ("disk", "disk.ingest-full", "an ingest that fills the disk: exit 4 saying the disk is full",
     probe_ingest_on_a_full_disk),
    ("disk", "disk.cache-full", "a prefix cache on a full disk costs time, not the answer", probe_cache_on_a_full_disk),
    ("disk", "disk.cache-stats-full", "`rag cache stats`/`clear` with no cache folder yet on a full disk: exit 4, "
     "saying the disk is full", probe_cache_stats_on_a_full_disk),
]
