"""Real llama-cpp-python OpenAI-compatible servers (``python -m llama_cpp.server``) on 127.0.0.1, for tests and benchmarks.

Each server is one process with its own log file; tests start, kill -9 and restart
them. Kept small (1 thread, a short context): the machines are shared.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``python -m llama_cpp.server`` on a model, started and stopped by a test or a benchmark."""

    def __init__(self, model: Path, log_dir: Path, *, alias: str = "model", n_ctx: int = 2048,
                 embedding: bool = False, port: int | None = None):
        self.model = Path(model)
        self.alias = alias
        self.port = port or free_port()
        self.log = Path(log_dir) / f"server-{self.port}.log"
        args = ["--n_ctx", str(n_ctx), "--n_threads", "1", "--n_threads_batch", "1"]
        if embedding:  # an encoder must see each input in one micro-batch
            args += ["--embedding", "true", "--n_batch", str(n_ctx), "--n_ubatch", str(n_ctx)]
        self.args = args
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, *, wait: bool = True) -> "LlamaServer":
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", self.alias,
                 "--host", "127.0.0.1", "--port", str(self.port), *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}):\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama_cpp.server did not start in {timeout:g} s:\n{self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def prefix_hits(self) -> list[int]:
        """The server's own count of reused prompt tokens, one per prompt it reused a prefix for
        (llama-cpp-python logs ``Llama.generate: N prefix-match hit``; its API reports none)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [int(n) for n in re.findall(r"Llama\.generate: (\d+) prefix-match hit", text)]

    def completions(self) -> int:
        """How many completion requests this server has answered (its access log)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return len(re.findall(r'"POST /v1/completions HTTP/1\.1" 200', text))

    def __enter__(self) -> "LlamaServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
