"""Ctrl-C in `rag ask` during a long prefill takes effect at once (a real process, a real SIGINT).

A signal reaches Python only between bytecodes, never inside ``llama_decode``; before,
Ctrl-C during a prefill waited for the whole prefill (about 30 s on a long prompt).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_ctrl_c_stops_a_prefill_at_once(store_dir, tmp_path, model_home):
    doc = tmp_path / "long.md"
    doc.write_text("\n\n".join(f"Entry {i}: the sensor in room {i % 37} read {i * 13 % 101} units at "
                               f"hour {i % 24}, logged by operator {i % 11}." for i in range(420)))
    env = {**os.environ, "RAG_CACHE_ENABLED": "false"}
    rag = [sys.executable, "-m", "pipeline"]
    subprocess.run(rag + ["ingest", str(doc)], env=env, check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(rag + ["ask", "What did room 5 read?", "--doc", str(doc), "--ctx", "8192",
                                   "--stats"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # the model is loaded and the prefill of ~7,000 tokens is under way (tens of seconds here)
    assert proc.poll() is None, proc.communicate()
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    waited = time.perf_counter() - t0
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err
    assert "prefill" not in err  # no --stats line: the answer never came
    assert waited < 5, f"Ctrl-C took {waited:.1f} s to stop the prefill"
