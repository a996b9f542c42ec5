"""The fault drill (tests/drills/drill.py) in a bounded form, and its checks on their own.

``HOLDS`` lists the probes this code base handles; the full drill (``python tests/drills/drill.py``)
runs every probe, including those that wait for fixes elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "drills"))

import drill as drills  # noqa: E402

HOLDS = [
    "kill.ingest.1", "kill.prune.1",
    "files.bad-utf8", "files.newline-in-name",
    "config.env.cache.max_gb=nan", "config.env.ask.temperature=inf", "config.env.ask.temperature=nan",
    "config.env.engine.n_ctx=99999999999999999999", "config.env.engine.flash_attn=maybe",
    "config.env.unknown-key", "config.env.unknown-section-warns", "config.env.kv-type",
    "config.env.config-missing", "config.env.hf-generator-escape", "config.env.hf-endpoint-secret",
    "config.args.search-dash", "config.args.search-double-dash", "config.args.ask-dash",
    "config.args.search-empty", "config.args.drop-missing", "config.args.sections-missing",
    "config.args.models-pull-escape",
    "config.args.cache-off", "config.args.plan-vram-nan", "config.args.tune-seconds-nan",
    # fixed by the ingest and engine work
    "files.fifo", "files.symlink-loop", "files.outside-link", "files.gzip", "files.utf16-no-bom",
    "files.control-tokens", "cache.corrupt-index", "cache.path-is-file",
    "config.args.collection-space", "config.args.collection-short", "config.args.collection-newline",
    # rag serve, summarize and the settings that arrived with them
    "config.args.ask-invalid-utf8", "config.args.search-json-invalid-utf8", "config.args.chat-id-newline",
    "config.args.config-not-utf8", "config.args.config-dev-zero", "config.env.engine-threads-10000",
    "config.args.serve-off-loopback", "config.env.serve-allow-missing",
    "http.ingest-missing", "http.ingest-symlink-file", "http.host-rebound", "http.text-plain", "http.deep-json",
    "summarize.prompt-file-dev-zero",
    # settings past their range, ingest limits, an upstream that is down
    "config.env.cache-max-gb-huge", "config.env.cache-ram-gb-huge", "config.env.remote-connect-timeout-huge",
    "config.message.compose-recompute-negative", "config.message.ram-gb-negative",
    "config.range.cache.max_gb", "config.range.remote.connect_timeout", "config.range.ingest.max_file_mb",
    "files.max-file-mb-past-memory", "files.every-file-failed", "http.generator-unreachable",
    # servers that answer garbage, overflowing floats
    "config.message.float-overflow", "upstream.generator-html", "upstream.generator-completions-broken",
    "upstream.embedder-embeddings-json", "upstream.serve-generator-html", "upstream.serve-generator-completions-choices",
]


def test_bounded_drill_finds_no_defect(tmp_path, model_home):
    # Two drills of half the probes each, side by side: the probes are mostly `rag` processes starting,
    # and each drill keeps to its own folders.
    ordered = [p.name for p in drills.probes(kills=1) if p.name in HOLDS]
    halves = [ordered[0::2], ordered[1::2]]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "drills" / "drill.py"), "--only", ",".join(half),
                               "--kills", "1", "--json", str(tmp_path / f"drill{i}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, half in enumerate(halves)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for i, (half, proc, stdout) in enumerate(zip(halves, procs, outputs)):
        results = json.loads((tmp_path / f"drill{i}.json").read_text())["results"]
        assert [r["name"] for r in results] == half
        defects = [f"{r['name']}: {r['detail']}" for r in results if r["outcome"] != "handled"]
        assert not defects, stdout
        assert proc.returncode == 0 and f"| total | {len(half)} | {len(half)} | 0 |" in stdout
    assert sorted(ordered) == sorted(HOLDS)


def _ran(code, err="", out=""):
    return drills.Ran(["x"], code, out, err, 0.1)


@pytest.mark.parametrize("ran,why", [
    (_ran(1, "Traceback (most recent call last):\n  ...\nValueError: x\n"), "traceback"),
    (_ran(7, "Error: odd\n"), "undocumented exit status"),
    (_ran(2, "Error: one\nError: two\n"), "one 'Error:' line"),
    (_ran(2, "Error: x\nmore text\n"), "one 'Error:' line"),
    (_ran(None), "timed out"),
])
def test_the_drill_flags_what_a_user_should_never_see(ran, why):
    with pytest.raises(drills.Defect, match=why):
        drills.clean(ran)
    with pytest.raises(drills.Defect, match="expected exit 2"):
        drills.clean(_ran(0), codes={2})
    assert drills.clean(_ran(2, "Usage: rag x\n\nError: No such option\n"), codes={2}).code == 2


def test_table_counts_outcomes():
    rs = [drills.Result("a", "a.1", "", "handled"), drills.Result("a", "a.2", "", "defect"),
          drills.Result("b", "b.1", "", "n/a")]
    assert drills.table(rs).splitlines()[2:] == ["| a | 2 | 1 | 1 |", "| b | 0 | 0 | 0 |", "| total | 2 | 1 | 1 |"]
