"""Ctrl-C in `rag ask` during a long prefill takes effect at once (a real process, a real SIGINT).

A signal reaches Python only between bytecodes, never inside ``llama_decode``; before,
Ctrl-C during a prefill waited for the whole prefill (about 30 s on a long prompt).
The signal goes out once the prefill is seen running: stderr is a terminal (a pty), so
`rag ask` draws its prefill line there after the first second of prefill. A fixed sleep
raced the prefill on a fast, idle machine, where the whole answer came before it.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time


def _read_until(fd: int, pattern: str, *, timeout: float) -> str:
    """What the pty said until ``pattern`` appeared (or the process closed it, or time ran out)."""
    seen, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and not re.search(pattern, seen):
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the other end is closed: the process is gone
                break
            if not chunk:
                break
            seen += chunk.decode(errors="replace")
    return seen


def test_ctrl_c_stops_a_prefill_at_once(store_dir, tmp_path, model_home):
    doc = tmp_path / "long.md"
    doc.write_text("\n\n".join(f"Entry {i}: the sensor in room {i % 37} read {i * 13 % 101} units at "
                               f"hour {i % 24}, logged by operator {i % 11}." for i in range(420)))
    env = {**os.environ, "RAG_CACHE_ENABLED": "false"}
    rag = [sys.executable, "-m", "pipeline"]
    subprocess.run(rag + ["ingest", str(doc)], env=env, check=True, capture_output=True, timeout=600)
    master, slave = pty.openpty()
    # A terminal's Ctrl-C: SIGINT at its default disposition in the child. A suite started in the background
    # (`nohup ... &`) ignores SIGINT, children inherit that, and Python then installs no KeyboardInterrupt.
    proc = subprocess.Popen(rag + ["ask", "What did room 5 read?", "--doc", str(doc), "--ctx", "8192",
                                   "--stats"], env=env, stdout=subprocess.PIPE, stderr=slave, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    try:
        # the prefill of ~7,000 tokens has run for a second and is under way (several seconds even when idle)
        before = _read_until(master, r"prefill [\d,]+/[\d,]+ tokens \((?!100%)\d+%\)", timeout=300)
        assert proc.poll() is None, (before, proc.communicate())
        assert "prefill" in before, before
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        waited = time.perf_counter() - t0
        err = before + _read_until(master, r"(?!)", timeout=2)  # the rest of what stderr said, until it closes
    finally:
        os.close(master)
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err
    assert "TTFT" not in err  # no --stats line: the answer never came
    assert not out.strip()  # nor any of its text
    assert waited < 5, f"Ctrl-C took {waited:.1f} s to stop the prefill"
