"""Real servers for the shared-store tests, started on 127.0.0.1 and stopped by the fixtures.

* :func:`chroma_url`: a Chroma server (the ``chroma`` command that the chromadb package
  installs) on a free port, over a fresh directory, one per test.
* :func:`pg_url`: a fresh database in a throwaway PostgreSQL cluster (Debian's
  postgresql package: initdb, pg_ctl), one cluster per test session. PostgreSQL refuses
  to run as root, so under root the cluster belongs to ``nobody`` and lives in a
  directory of its own under the system temp dir (pytest's ``tmp_path`` is private to
  root). When no PostgreSQL can be found the tests skip with a reason that says so and
  how to install it (``.ci/run`` installs it on a fresh machine).

Import the fixtures into a test module: ``from servers import chroma_url, pg_url  # noqa: F401``.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

_counter = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ChromaServer:
    """``chroma run`` on a free port; ``url`` once :meth:`start` returned (its heartbeat answered)."""

    def __init__(self, path: Path, *, port: int | None = None):
        self.path = path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 90.0) -> "ChromaServer":
        chroma = Path(sys.executable).with_name("chroma")
        if not chroma.exists():
            pytest.fail(f"the chroma command is missing next to {sys.executable}: the chromadb package installs it")
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = open(self.path.parent / f"chroma-{self.port}.log", "wb")
        self.proc = subprocess.Popen([str(chroma), "run", "--path", str(self.path), "--host", "127.0.0.1",
                                      "--port", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"chroma run exited with {self.proc.returncode}: "
                            f"{Path(self._log.name).read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/v2/heartbeat", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"the Chroma server on port {self.port} did not answer its heartbeat within {timeout:g} s")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
            self._log.close()


@pytest.fixture
def chroma_url(tmp_path):
    """The URL of a fresh Chroma server for this test."""
    server = ChromaServer(tmp_path / "chroma-server").start()
    yield server.url
    server.stop()


def postgres_bin() -> Path | None:
    """The directory holding initdb and pg_ctl (on PATH, or Debian's /usr/lib/postgresql/N/bin)."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


class PostgresCluster:
    """A throwaway cluster: initdb into a temp directory, pg_ctl start on a free port, socket in the same dir."""

    def __init__(self, bindir: Path):
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="rag-pg-"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # postgres refuses root: run it as nobody, owning its directory
            import pwd

            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self.as_user = ["runuser", "-u", "nobody", "--"]

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, cwd="/")
        if done.returncode:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> "PostgresCluster":
        data = self.dir / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "rag", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-locale")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                        "-c max_connections=100", "start")
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://rag@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster():
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL NOT FOUND: no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin, so the "
                    "PostgreSQL catalog tests did not run. Install it: apt-get install -y postgresql "
                    "(.ci/run does this on a fresh machine)")
    cluster = PostgresCluster(bindir).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """The URL of a fresh, empty database for this test."""
    return pg_cluster.create_database()
