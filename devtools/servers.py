"""Real servers on 127.0.0.1 for tests and benchmarks: a Chroma server and a throwaway PostgreSQL cluster.

* :class:`ChromaServer`: ``chroma run`` (the command the chromadb package installs) on a free
  port over a directory, ready once its heartbeat answers.
* :class:`PostgresCluster`: Debian's PostgreSQL binaries (``initdb``, ``pg_ctl``; see
  :func:`postgres_bin`) on a free port with its socket in its own temporary directory, trust
  authentication for the user ``rag``, fsync off: for tests and benchmarks only. PostgreSQL
  refuses to run as root, so under root the cluster runs as ``nobody`` and owns its directory.

Failures raise :class:`ServerError` with the server's own log.
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

_counter = itertools.count()


class ServerError(RuntimeError):
    """A test server could not be started."""


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
            raise ServerError(f"the chroma command is missing next to {sys.executable}: the chromadb package installs it")
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = open(self.path.parent / f"chroma-{self.port}.log", "wb")
        self.proc = subprocess.Popen([str(chroma), "run", "--path", str(self.path), "--host", "127.0.0.1",
                                      "--port", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"chroma run exited with {self.proc.returncode}: "
                            f"{Path(self._log.name).read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/v2/heartbeat", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"the Chroma server on port {self.port} did not answer its heartbeat within {timeout:g} s")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
            self._log.close()


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
            raise ServerError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}")

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
