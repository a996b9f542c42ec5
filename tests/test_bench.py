"""rag bench's library: the runner over a folder of (fake, tiny) benchmark scripts, the table, the plot."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from pipeline.dev.bench import (
    BenchResults,
    PlotError,
    Row,
    discover,
    format_table,
    load_results,
    plot,
    prefill_points,
    require_matplotlib,
    rows_of,
    run_benchmarks,
    script_options,
    unit_of,
)
from pipeline.errors import InputError, RagError

GOOD = '''
import argparse, json, sys
ap = argparse.ArgumentParser()
ap.add_argument("--json")
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()
print("measuring", flush=True)
rows = [dict(n_batch=b, n_ubatch=u, offload=o, tokens_per_second=float(u * (2 if o == "none" else 1)),
             samples=[dict(tokens_per_second=1.0)])
        for o in ("none", "cpu_moe") for (b, u) in ((512, 128), (1024, 512), (2048, 512))]
out = dict(tokens=4096 if args.quick else 16384, quick=args.quick, sweep=rows, seconds=1.5,
           ratios=dict(speedup_over_reference=1.25), checks=dict(fast=True), note="text is not a row")
json.dump(out, open(args.json, "w"))
'''
NO_QUICK = '''
import json, sys
path = sys.argv[sys.argv.index("--json") + 1]
json.dump({"summary": {"rate": {"value": 10.0, "unit": "docs/s"}, "total_seconds": 2.0}}, open(path, "w"))
'''
FAILS = '''
import sys
# accepts "--json" but fails
print("boom: something broke", file=sys.stderr)
sys.exit(3)
'''
SLOW = '''
import time
# "--json"
time.sleep(60)
'''
NO_JSON = "print('I write no figures')\n"


@pytest.fixture
def bench_dir(tmp_path):
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for name, text in {"good.py": GOOD, "noquick.py": NO_QUICK, "fails.py": FAILS, "nojson.py": NO_JSON,
                       "gpu_prefill.py": GOOD, "_helper.py": GOOD}.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_discover_and_options(bench_dir) -> None:
    names = [p.name for p in discover(bench_dir)]
    assert names == ["fails.py", "good.py", "nojson.py", "noquick.py"]  # not gpu_prefill.py nor _helper.py
    assert script_options(bench_dir / "good.py") == {"--json", "--quick"}
    assert script_options(bench_dir / "nojson.py") == set()
    with pytest.raises(InputError):
        discover(bench_dir / "missing")
    real = [p.name for p in discover()]  # the repository's own benchmarks
    assert "ingest.py" in real and "gpu_prefill.py" not in real


def test_run_benchmarks_collects_json_and_statuses(bench_dir, tmp_path) -> None:
    events = []
    results = run_benchmarks(directory=bench_dir, quick=True, progress=events.append)
    runs = {r.name: r for r in results.runs}
    assert runs["good"].status == "ok" and runs["good"].data["quick"] is True  # --quick passed through
    assert runs["noquick"].status == "ok" and "no --quick" in runs["noquick"].message
    assert runs["fails"].status == "failed" and runs["fails"].returncode == 3
    assert "boom: something broke" in runs["fails"].message
    assert runs["nojson"].status == "skipped" and "--json" in runs["nojson"].message
    assert not results.ok
    assert any(e.kind == "output" and e.line == "measuring" for e in events)
    assert [e.name for e in events if e.kind in ("done", "skip")] == ["fails", "good", "nojson", "noquick"]

    rows = results.rows()
    good = {r.metric: r for r in rows if r.benchmark == "good"}
    assert good["sweep[offload=none, n_batch=1024, n_ubatch=512].tokens_per_second"].value == 1024.0
    assert good["sweep[offload=none, n_batch=1024, n_ubatch=512].tokens_per_second"].unit == "tok/s"
    assert good["seconds"].unit == "s" and good["ratios.speedup_over_reference"].unit == "x"
    assert good["checks.fast"].value is True and not any("samples" in m or "note" in m for m in good)
    assert Row("noquick", "rate", 10.0, "docs/s") in rows and Row("noquick", "total_seconds", 2.0, "s") in rows
    assert any(r.benchmark == "fails" and r.metric == "status" and "failed" in r.value for r in rows)
    table = results.table()
    assert table.splitlines()[0].split() == ["benchmark", "metric", "value", "unit"]
    assert "1,024.0" in table and "docs/s" in table

    out = results.write_json(tmp_path / "out" / "bench.json")
    combined = json.loads(out.read_text())
    assert combined["quick"] is True and combined["benchmarks"]["good"]["results"]["tokens"] == 4096
    assert combined["benchmarks"]["nojson"]["status"] == "skipped"
    assert len(combined["rows"]) == len(rows)
    assert load_results(out) == combined

    only = run_benchmarks(["good.py"], directory=bench_dir)
    assert [r.name for r in only.runs] == ["good"] and only.runs[0].data["quick"] is False and only.ok
    with pytest.raises(InputError):
        run_benchmarks(["nosuch"], directory=bench_dir)


def test_timeout_stops_a_benchmark(bench_dir) -> None:
    (bench_dir / "slow.py").write_text(SLOW)
    results = run_benchmarks(["slow"], directory=bench_dir, timeout=1)
    run = results.runs[0]
    assert run.status == "timeout" and run.seconds < 10 and "1 s" in run.message


def test_prefill_points_and_rows_of_the_prefill_benchmark() -> None:
    data = {"tokens": 4096, "sweep": [
        {"n_batch": 512, "n_ubatch": 128, "offload": "none", "tokens_per_second": 100.0, "samples": []},
        {"n_batch": 2048, "n_ubatch": 512, "offload": "none", "tokens_per_second": 300.0},
        {"n_batch": 2048, "n_ubatch": 512, "offload": "cpu_moe", "tokens_per_second": 200.0},
    ], "comparisons": [{"setting": "2048/512 none", "n_ubatch": 512, "offload": "none", "overhead_wall": 0.01,
                        "passed": True, "bare_wall": 1.0, "samples": {"pipeline": [], "bare": []}}]}
    pts = prefill_points({"prefill": {"results": data}})
    assert sorted((p["line"], p["n_ubatch"], p["tokens_per_s"]) for p in pts) == [
        ("cpu_moe", 512, 200.0), ("none", 128, 100.0), ("none", 512, 300.0)]
    rows = rows_of("prefill", data)
    assert Row("prefill", "-b 2048 -ub 512, offload cpu_moe", 200.0, "tok/s") in rows
    assert Row("prefill", "engine overhead vs bare llama_decode (2048/512 none)", 1.0, "%") in rows
    assert rows_of("prefill", {"other": 1.0}) == [Row("prefill", "other", 1.0, "")]  # format changed: generic
    # gpu_prefill.py's rows carry the micro-batch in their flags; n_cpu_moe names the line
    assert prefill_points([{"config": "recipe", "flags": ["-b", "1024", "-ub", "512"], "measured_tok_s": 9.0},
                           {"n_cpu_moe": 3, "n_ubatch": 256, "prefill_tokens_per_second": 5.0}]) == [
        {"line": "recipe", "n_ubatch": 512, "tokens_per_s": 9.0, "context": None},
        {"line": "3 layers' experts on CPU", "n_ubatch": 256, "tokens_per_s": 5.0, "context": None}]
    assert unit_of("a.prefill_tok_s") == "tok/s" and unit_of("model_load_seconds") == "s"
    assert format_table([Row("b", "m", 1234567, "")]).splitlines()[-1].split() == ["b", "m", "1,234,567"]


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    data = [{"n_ubatch": 128, "offload": "none", "tokens_per_second": 1.0}]
    with pytest.raises(PlotError) as err:
        plot(data, tmp_path / "p.png")
    assert "install matplotlib (pip install 'rag-pipeline[plot]')" in str(err.value)
    assert isinstance(err.value, RagError)
    with pytest.raises(PlotError):
        require_matplotlib()
    assert not (tmp_path / "p.png").exists()


def test_plot_with_nothing_to_plot(tmp_path) -> None:
    with pytest.raises(PlotError, match="nothing to plot"):
        plot(BenchResults(runs=[]), tmp_path / "p.png")


def test_plot_writes_a_png(bench_dir, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    results = run_benchmarks(["good"], directory=bench_dir)
    path = plot(results, tmp_path / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = plot(json.loads(results.write_json(tmp_path / "r.json").read_text()), tmp_path / "again.png")
    assert again.stat().st_size > 1000
