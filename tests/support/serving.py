"""A real ``rag serve`` process on 127.0.0.1 for tests, and raw HTTP to it (any Host, Origin or
Content-Type an attacker's page or curl would send)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.servers import free_port


class RagServer:
    """``rag serve --port P ARGS...`` with ``env``; :meth:`start` returns once ``/health`` answers."""

    def __init__(self, env: dict, *args: str, port: int | None = None, log: Path | None = None):
        self.env, self.args = env, list(args)
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log or Path(tempfile.mkstemp(prefix="rag-serve-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> "RagServer":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--port", str(self.port),
                                      *self.args], env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.output()
                self.stop()
                raise RuntimeError(f"rag serve did not start: {out}")
            time.sleep(0.2)

    def output(self) -> str:
        """What the server printed so far (stdout and stderr)."""
        return Path(self.log_path).read_text(errors="replace")

    def request(self, method: str, path: str, *, json_body=None, body: bytes | None = None,
                headers: dict | None = None, timeout: float = 120) -> tuple[int, dict | None, dict]:
        """(status, JSON body or None, headers). ``Host`` is 127.0.0.1:PORT unless ``headers`` names
        another; a JSON body is sent as application/json unless ``headers`` says otherwise."""
        headers = {k.lower(): v for k, v in (headers or {}).items()}
        headers.setdefault("host", f"127.0.0.1:{self.port}")
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers.setdefault("content-type", "application/json")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.putheader("content-length", str(len(body or b"")))
            conn.endheaders(body)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = None
            return resp.status, data, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def wait_job(self, job_id: str, *, timeout: float = 300, headers: dict | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.request("GET", f"/ingest/{job_id}", headers=headers)[1]
            if job["state"] in ("done", "failed"):
                return job
            time.sleep(0.2)
        raise AssertionError(f"ingest job {job_id} did not finish in {timeout} s")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far (all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_env(root: Path, model_home: Path, **extra: str) -> dict:
    """The environment of a test server: the real models, a store and cache under ``root``, small settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_HOME=str(model_home), RAG_STORE_PATH=str(root / "store"), RAG_CACHE_PATH=str(root / "cache"),
               RAG_ENGINE_N_CTX="768", RAG_ASK_MAX_TOKENS="8", RAG_ASK_TOP_K="2", RAG_ASK_NEIGHBOURS="0",
               RAG_ENGINE_TUNED="false")
    env.update(extra)
    return env
