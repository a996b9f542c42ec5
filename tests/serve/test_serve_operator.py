"""What `rag serve` tells its operator: the start-up line (the page's address, printed only once the
server answers there), one access-log line per request (never the token, a query or a body; none
with --quiet), and the stop. Real `rag serve` processes with the bundled models."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from devtools.servers import free_port
from support.serving import RagServer, serve_env

TOKEN = "operator-token-0451"


@pytest.fixture(scope="module")
def home(tmp_path_factory, model_home):
    root = tmp_path_factory.mktemp("operator")
    (root / "docs").mkdir()
    (root / "docs" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    env = serve_env(root, model_home)
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(root / "docs")], env=env, check=True,
                   capture_output=True, timeout=300)
    return {"root": root, "env": env}


def _health_now(port: int) -> bytes:
    """GET /health at once, on a raw socket: the status line, or the refusal."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_health_answers_the_moment_the_start_up_line_appears_and_the_line_names_the_page(home):
    for _ in range(4):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--port", str(port)], env=home["env"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            for line in proc.stderr:
                lines.append(line)
                if line.startswith("serving"):
                    break
            else:
                pytest.fail(f"rag serve printed no start-up line: {''.join(lines)}")
            try:
                status = _health_now(port)  # the moment the line is read: never "connection refused"
            except ConnectionRefusedError:
                pytest.fail(f"the port refused a connection after the start-up line: {line}")
            assert status == b"HTTP/1.1 200 OK", status
            assert f"open http://127.0.0.1:{port}/ in a browser" in line, line
        finally:
            proc.terminate()
            proc.communicate(timeout=60)


def _logged(server: RagServer, n: int) -> list[str]:
    """The last ``n`` access-log lines (those that begin with the client's address)."""
    deadline = time.monotonic() + 30
    while True:
        lines = [ln for ln in server.output().splitlines() if ln.startswith("127.0.0.1 ")]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines[-n:] if n else lines
        time.sleep(0.1)


def test_one_access_log_line_per_request_never_the_token_nor_the_query(home):
    env = {**home["env"], "RAG_SERVE_TOKEN": TOKEN}
    server = RagServer(env, log=home["root"] / "serve-log.log").start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        before = len(_logged(server, 1))  # start()'s /health, logged once its answer is sent
        server.request("GET", "/status?secret-question=vault", headers=auth)
        server.request("GET", "/status")  # no token: 401
        server.request("GET", "/health", headers={"Host": "evil.example"})  # refused by the guard: 403
        server.request("POST", "/search", json_body={"query": "the walrus code 7431"}, headers=auth)
        status, _, _ = server.request("POST", "/v1/chat/completions", headers=auth, json_body={
            "stream": True, "messages": [{"role": "user", "content": "What do tomato plants need?"}]})
        assert status == 200
        lines = _logged(server, before + 5)[before:]
    finally:
        server.stop()
    assert [ln.split()[1:4] for ln in lines] == [["GET", "/status", "200"], ["GET", "/status", "401"],
                                                 ["GET", "/health", "403"], ["POST", "/search", "200"],
                                                 ["POST", "/v1/chat/completions", "200"]], lines
    assert all(ln.split()[-1] in ("ms", "s") for ln in lines), lines
    out = server.output()
    for secret in (TOKEN, "secret-question", "vault", "walrus", "7431", "tomato plants"):
        assert secret not in out, (secret, out)


def test_quiet_logs_no_request(home):
    server = RagServer(home["env"], "--quiet", log=home["root"] / "serve-quiet.log").start()
    try:
        for _ in range(3):
            assert server.request("GET", "/status")[0] == 200
    finally:
        server.stop()
    out = server.output()
    assert out.startswith("serving") and not _logged(server, 0), out
    assert out.rstrip().endswith("stopped"), out


def test_a_stop_with_nothing_in_flight_says_so_at_once(home):
    server = RagServer(home["env"], log=home["root"] / "serve-stop.log").start()
    assert server.request("GET", "/health")[0] == 200
    assert server.stop() == 0
    said = server.output().splitlines()
    assert said[-2:] == ["stopping (SIGTERM): no answer in flight", "stopped"], said
    assert json.dumps(said)  # plain text lines


def test_a_stop_that_comes_while_the_server_starts_still_stops_it(home):
    """SIGTERM at any moment of the start-up (a container stopped at once) ends the process: it is never
    lost between two signal handlers."""
    import signal

    for delay in (0.3, 0.8, 1.3, 1.8, 2.5, 3.5):
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--port", str(free_port())],
                                env=home["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"SIGTERM {delay} s after the start did not stop rag serve")
        assert proc.returncode in (0, -signal.SIGTERM), (delay, proc.returncode, err)
        assert "Traceback" not in err, err
