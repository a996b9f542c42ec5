"""rag bench's library: the runner over a folder of (fake, tiny) benchmark scripts, the table, the plot."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from devtools.bench import (
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
)
from pipeline.errors import InputError, RagError

GOOD = '''
import argparse, json, sys
sys.path.insert(0, REPO)
from devtools.bench import document, row
ap = argparse.ArgumentParser()
ap.add_argument("--json")
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()
print("measuring", flush=True)
sweep = [dict(n_batch=b, n_ubatch=u, offload=o, tokens_per_second=float(u * (2 if o == "none" else 1)),
              samples=[dict(tokens_per_second=1.0)])
         for o in ("none", "cpu_moe") for (b, u) in ((512, 128), (1024, 512), (2048, 512))]
rows = [row(f"-b {r['n_batch']} -ub {r['n_ubatch']}, offload {r['offload']}", r["tokens_per_second"], "tok/s",
            n_ubatch=r["n_ubatch"], series=r["offload"]) for r in sweep]
rows += [row("seconds", 1.5, "s"), row("speedup_over_reference", 1.25, "x", ratio=("a", "b")), row("fast", True)]
out = document(rows, tokens=4096 if args.quick else 16384, quick=args.quick, sweep=sweep, note="raw, not a row")
json.dump(out, open(args.json, "w"))
'''
NO_QUICK = '''
import json, sys
path = sys.argv[sys.argv.index("--json") + 1]
json.dump({"schema": "rag-bench/1", "rows": [{"metric": "rate", "value": 10.0, "unit": "docs/s"},
                                             {"metric": "total_seconds", "value": 2.0, "unit": "s"}]}, open(path, "w"))
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
    good = GOOD.replace("REPO", repr(str(Path(__file__).resolve().parents[2])))
    for name, text in {"good.py": good, "noquick.py": NO_QUICK, "fails.py": FAILS, "nojson.py": NO_JSON,
                       "gpu_prefill.py": good, "_helper.py": good}.items():
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
    assert runs["good"].status == "ok", runs["good"].output
    assert runs["good"].data["quick"] is True  # --quick passed through
    assert runs["noquick"].status == "ok" and "no --quick" in runs["noquick"].message
    assert runs["fails"].status == "failed" and runs["fails"].returncode == 3
    assert "boom: something broke" in runs["fails"].message
    assert runs["nojson"].status == "skipped" and "--json" in runs["nojson"].message
    assert not results.ok
    assert any(e.kind == "output" and e.line == "measuring" for e in events)
    assert [e.name for e in events if e.kind in ("done", "skip")] == ["fails", "good", "nojson", "noquick"]

    rows = results.rows()
    good = {r.metric: r for r in rows if r.benchmark == "good"}
    # exactly the rows the script declared, with the units it declared: nothing guessed, nothing raw
    assert list(good)[:6] == [f"-b {b} -ub {u}, offload {o}" for o in ("none", "cpu_moe")
                              for (b, u) in ((512, 128), (1024, 512), (2048, 512))]
    assert good["-b 1024 -ub 512, offload none"].value == 1024.0 and good["-b 1024 -ub 512, offload none"].unit == "tok/s"
    assert good["seconds"].unit == "s" and good["speedup_over_reference"].unit == "x"
    assert good["fast"].value is True and len(good) == 9
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


def test_prefill_points_and_rows_of_declared_json() -> None:
    from devtools.bench import SCHEMA, document, row

    data = document([row("prompt tokens", 4096),
                     row("-b 512 -ub 128, offload none", 100.0, "tok/s", n_batch=512, n_ubatch=128, series="none"),
                     row("-b 2048 -ub 512, offload none", 300.0, "tok/s", n_batch=2048, n_ubatch=512, series="none"),
                     row("-b 2048 -ub 512, offload cpu_moe", 200.0, "tok/s", n_ubatch=512, series="cpu_moe"),
                     row("engine overhead vs bare llama_decode (2048/512 none)", 1.0, "%")],
                    tokens=4096, sweep=[{"n_ubatch": 64, "tokens_per_second": 9.0}])  # raw figures: not points
    assert data["schema"] == SCHEMA
    pts = prefill_points({"prefill": {"results": data}})
    assert sorted((p["line"], p["n_ubatch"], p["tokens_per_s"], p["context"]) for p in pts) == [
        ("cpu_moe", 512, 200.0, 4096), ("none", 128, 100.0, 4096), ("none", 512, 300.0, 4096)]
    rows = rows_of("prefill", data)
    assert rows[0] == Row("prefill", "prompt tokens", 4096, "")
    assert Row("prefill", "-b 2048 -ub 512, offload cpu_moe", 200.0, "tok/s") in rows
    assert Row("prefill", "engine overhead vs bare llama_decode (2048/512 none)", 1.0, "%") in rows
    # JSON without the schema: one row that says so, no figures guessed from its key names
    assert rows_of("old", {"tokens_per_second": 5.0}) == [
        Row("old", "status", f"ok, but its JSON declares no rows (schema {SCHEMA})")]
    assert format_table([Row("b", "m", 1234567, "")]).splitlines()[-1].split() == ["b", "m", "1,234,567"]


def test_the_repository_benchmarks_declare_their_rows() -> None:
    for script in discover():
        text = script.read_text(encoding="utf-8")
        assert "document(" in text and "row(" in text, script.name
    from devtools.bench import default_dir

    assert "document(" in (default_dir() / "gpu_prefill.py").read_text(encoding="utf-8")


def test_results_that_cannot_be_written_are_a_clear_error(tmp_path) -> None:
    with pytest.raises(InputError, match="cannot write"):
        BenchResults(runs=[]).write_json(tmp_path)  # a directory


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    data = {"schema": "rag-bench/1", "rows": [{"metric": "m", "value": 1.0, "unit": "tok/s", "n_ubatch": 128}]}
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
