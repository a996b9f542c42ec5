"""Run the benchmarks that exist and gather their figures: the library behind ``rag bench``.

Every script in the repository's ``benchmarks/`` folder (:func:`discover`; not
``gpu_prefill.py``, which builds llama.cpp for a GPU machine, nor files starting
with ``_``) runs in its own process as ``python SCRIPT --json OUT`` (plus
``--quick`` when asked and the script has it), from the repository root. A script
whose source does not mention ``--json`` is reported as skipped, not run. Each
script's JSON follows one schema (:data:`SCHEMA`, written with :func:`document` and
:func:`row`): the rows it declares, each with its metric, value and unit, ratios with
the two metrics they divide, and the figures a row was measured at. ``rag bench``'s
table shows exactly those rows (:func:`rows_of`; nothing is guessed from key names);
the script's raw figures are kept whole in the combined JSON (:meth:`BenchResults.to_dict`).

:func:`plot` draws prefill tokens/s against ``n_ubatch``, one line per ``series``,
from the declared rows that carry an ``n_ubatch`` (:func:`prefill_points`), with
matplotlib (the optional ``plot`` extra).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pipeline.errors import InputError, RagError

#: Scripts in benchmarks/ that ``rag bench`` does not run.
EXCLUDED = frozenset({"gpu_prefill.py"})
_INSTALL_HINT = "install matplotlib (pip install 'rag-pipeline[plot]')"


class PlotError(RagError):
    """A plot cannot be drawn: matplotlib is missing, or there is nothing to plot."""

    exit_code = 2


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Row:
    benchmark: str
    metric: str
    value: float | int | bool | str
    unit: str = ""


@dataclass
class BenchRun:
    """One benchmark script's run."""

    name: str
    script: str
    status: Literal["ok", "failed", "skipped", "timeout"]
    seconds: float = 0.0
    returncode: int | None = None
    data: dict[str, Any] | None = None  # the JSON it wrote
    message: str = ""
    output: str = ""  # the tail of its stdout and stderr

    def to_dict(self) -> dict[str, Any]:
        return dict(script=self.script, status=self.status, seconds=round(self.seconds, 3),
                    returncode=self.returncode, message=self.message, results=self.data)


@dataclass(frozen=True)
class BenchEvent:
    """Progress of :func:`run_benchmarks`: ``"start"``, ``"output"`` (one ``line`` of a script's output),
    ``"done"`` (``status``, ``seconds``) or ``"skip"`` (``message`` says why)."""

    kind: Literal["start", "output", "done", "skip"]
    name: str
    index: int
    total: int
    status: str = ""
    seconds: float = 0.0
    message: str = ""
    line: str = ""


@dataclass
class BenchResults:
    runs: list[BenchRun]
    quick: bool = False
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def rows(self) -> list[Row]:
        out: list[Row] = []
        for run in self.runs:
            if run.status == "ok" and run.data is not None:
                out += rows_of(run.name, run.data)
            else:
                out.append(Row(run.name, "status", f"{run.status}: {run.message}" if run.message else run.status))
        return out

    def table(self) -> str:
        return format_table(self.rows())

    def to_dict(self) -> dict[str, Any]:
        return dict(started=self.started, quick=self.quick, python=sys.version.split()[0],
                    benchmarks={r.name: r.to_dict() for r in self.runs},
                    rows=[asdict(r) for r in self.rows()])

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write the benchmark results to {path}: {exc.strerror or exc}") from None
        return path

    @property
    def ok(self) -> bool:
        return all(r.status in ("ok", "skipped") for r in self.runs)


# --------------------------------------------------------------------------- running


def default_dir() -> Path:
    """The source checkout's ``benchmarks/`` folder."""
    return Path(__file__).resolve().parents[1] / "benchmarks"


def discover(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """The benchmark scripts in ``directory`` (default :func:`default_dir`), by name."""
    folder = Path(directory) if directory is not None else default_dir()
    if not folder.is_dir():
        raise InputError(f"no benchmarks folder at {folder}: rag bench runs from a source checkout "
                         "(or pass the folder)")
    return sorted(p for p in folder.glob("*.py") if p.name not in EXCLUDED and not p.name.startswith("_"))


def script_options(script: Path) -> set[str]:
    """Which of ``--json`` and ``--quick`` a script's source mentions (it is not run to find out)."""
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {opt for opt in ("--json", "--quick") if re.search(rf"""["']{opt}["']""", text)}


def run_benchmarks(names: Sequence[str] | None = None, *, directory: str | os.PathLike[str] | None = None,
                   quick: bool = False, timeout: float | None = None, python: str | None = None,
                   extra_args: dict[str, list[str]] | None = None,
                   progress: Callable[[BenchEvent], None] | None = None) -> BenchResults:
    """Run the benchmarks (all by default, or those named: ``"ingest"`` or ``"ingest.py"``) and collect their JSON.

    ``quick`` passes ``--quick`` to the scripts that have it; ``timeout`` (seconds)
    stops a script that runs longer; ``extra_args`` adds arguments per benchmark
    name. A benchmark that fails, times out or has no ``--json`` does not stop the
    others; its status says what happened.
    """
    scripts = discover(directory)
    if names:
        wanted = {n[:-3] if n.endswith(".py") else n for n in names}
        unknown = wanted - {s.stem for s in scripts}
        if unknown:
            raise InputError(f"unknown benchmark(s): {', '.join(sorted(unknown))}; "
                             f"there are: {', '.join(s.stem for s in scripts) or 'none'}")
        scripts = [s for s in scripts if s.stem in wanted]
    results = BenchResults(runs=[], quick=quick)
    total = len(scripts)

    def emit(kind: str, name: str, i: int, **kw: Any) -> None:
        if progress is not None:
            progress(BenchEvent(kind, name, i, total, **kw))  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory(prefix="rag-bench-") as tmp:
        for i, script in enumerate(scripts):
            name = script.stem
            opts = script_options(script)
            if "--json" not in opts:
                run = BenchRun(name, str(script), "skipped", message="the script has no --json option")
                results.runs.append(run)
                emit("skip", name, i, status=run.status, message=run.message)
                continue
            out = Path(tmp) / f"{name}.json"
            cmd = [python or sys.executable, str(script), "--json", str(out)]
            if quick and "--quick" in opts:
                cmd.append("--quick")
            cmd += list((extra_args or {}).get(name, []))
            emit("start", name, i, message=" ".join(cmd))
            run = _run_one(name, script, cmd, out, timeout=timeout,
                           line=(lambda s, n=name, k=i: emit("output", n, k, line=s)) if progress else None)
            if quick and "--quick" not in opts:
                run.message = (run.message + "; " if run.message else "") + "no --quick option: ran in full"
            results.runs.append(run)
            emit("done", name, i, status=run.status, seconds=run.seconds, message=run.message)
    return results


def _run_one(name: str, script: Path, cmd: list[str], out: Path, *, timeout: float | None,
             line: Callable[[str], None] | None) -> BenchRun:
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(cmd, cwd=script.resolve().parent.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)

    def pump() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            text = text.rstrip("\n")
            tail.append(text)
            if line is not None:
                line(text)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
        status: Literal["ok", "failed", "timeout"] = "ok" if rc == 0 else "failed"
        message = "" if rc == 0 else f"exit status {rc}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script's own process group (start_new_session)
        rc = proc.wait()
        status, message = "timeout", f"stopped after {timeout:g} s"
    reader.join(timeout=5)
    data = None
    if status == "ok":
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
        except FileNotFoundError:
            status, message = "failed", "it wrote no JSON"
        except (OSError, json.JSONDecodeError) as exc:
            status, message = "failed", f"its JSON cannot be read: {exc}"
        else:
            if not isinstance(data, dict):
                data = {"value": data}
    if status == "failed" and tail and rc:
        message += f": {tail[-1].strip()}"
    return BenchRun(name, str(script), status, time.perf_counter() - t0, rc, data, message, "\n".join(tail))


# --------------------------------------------------------------------------- the output schema

#: The schema every benchmark's JSON follows: ``{"schema": SCHEMA, "rows": [row, ...], ...raw figures}``.
SCHEMA = "rag-bench/1"


def row(metric: str, value: float | int | bool | str, unit: str = "", *, ratio: tuple[str, str] | None = None,
        **fields: Any) -> dict[str, Any]:
    """One declared row of a benchmark's JSON: a figure, its unit, and for a ratio the two metrics it divides.

    ``fields`` name what the figure was measured at (``n_ubatch``, ``n_batch``, ``series``
    for a line of the prefill plot, ``context`` for its prompt length).
    """
    out: dict[str, Any] = dict(metric=metric, value=value, unit=unit)
    if ratio is not None:
        out["ratio"] = list(ratio)
    out.update(fields)
    return out


def document(rows: list[dict[str, Any]], **raw: Any) -> dict[str, Any]:
    """A benchmark's JSON: its declared rows (what ``rag bench`` shows) and any raw figures beside them."""
    return {"schema": SCHEMA, "rows": rows, **raw}


def rows_of(benchmark: str, data: dict[str, Any]) -> list[Row]:
    """The table rows a benchmark's JSON declares (:data:`SCHEMA`); one status row where it declares none."""
    declared = data.get("rows") if data.get("schema") == SCHEMA else None
    if not isinstance(declared, list) or not all(isinstance(r, dict) and "metric" in r and "value" in r
                                                 for r in declared):
        return [Row(benchmark, "status", f"ok, but its JSON declares no rows (schema {SCHEMA})")]
    return [Row(benchmark, str(r["metric"]), r["value"], str(r.get("unit", ""))) for r in declared]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or 0.001 <= abs(value) < 100:
            return f"{value:.4g}"
        return f"{value:,.1f}" if abs(value) < 1e7 else f"{value:.3e}"
    return "" if value is None else str(value)


def format_table(rows: Iterable[Row]) -> str:
    """Rows as an aligned text table: benchmark, metric, value, unit."""
    cells = [("benchmark", "metric", "value", "unit")] + [(r.benchmark, r.metric, _fmt(r.value), r.unit)
                                                         for r in rows]
    w = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}".rstrip() for a, b, c, d in cells]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the plot


def prefill_points(obj: Any) -> list[dict[str, Any]]:
    """Every declared prefill measurement in ``obj`` (results, combined JSON or one benchmark's JSON): rows in
    tok/s with an ``n_ubatch``, as ``{"line", "n_ubatch", "tokens_per_s", "context"}`` (line: the row's
    ``series``; context: its ``context``, else the benchmark's ``tokens``)."""
    if isinstance(obj, BenchResults):
        obj = obj.to_dict()["benchmarks"]
    points: list[dict[str, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict) and v.get("schema") == SCHEMA and isinstance(v.get("rows"), list):
            context = v.get("tokens") if isinstance(v.get("tokens"), int) else None
            for r in v["rows"]:
                ub, value = r.get("n_ubatch"), r.get("value")
                if (r.get("unit") == "tok/s" and isinstance(ub, int) and isinstance(value, (int, float))
                        and not isinstance(value, bool) and math.isfinite(value) and value > 0):
                    points.append(dict(line=str(r.get("series", "default")), n_ubatch=ub, tokens_per_s=float(value),
                                       context=r.get("context", context)))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(obj)
    return points


def require_matplotlib() -> None:
    """Raise :class:`PlotError` with the install hint when matplotlib is missing (check before a long run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(f"{_INSTALL_HINT} to draw plots") from None


def plot(results: BenchResults | dict[str, Any] | list[Any], path: str | os.PathLike[str]) -> Path:
    """Draw prefill tokens/s against ``n_ubatch``, one line per offload setting, to ``path`` (PNG, SVG, PDF).

    Where the measurements span several prompt lengths, each length gets its own lines;
    where one line has several figures at one ``n_ubatch`` (other ``n_batch`` values), the best is drawn.
    """
    points = prefill_points(results)
    if not points:
        raise PlotError("nothing to plot: no prefill measurements with n_ubatch in the results "
                        "(run the prefill benchmark)")
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    contexts = {p["context"] for p in points}
    lines: dict[str, dict[int, float]] = {}
    for p in points:
        name = p["line"] if len(contexts) == 1 else f"{p['line']}, {p['context']} tokens"
        best = lines.setdefault(name, {})
        best[p["n_ubatch"]] = max(best.get(p["n_ubatch"], 0.0), p["tokens_per_s"])
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, series in sorted(lines.items()):
        xs = sorted(series)
        ax.plot(xs, [series[x] for x in xs], marker="o", label=name)
    ticks = sorted({p["n_ubatch"] for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("n_ubatch (tokens per micro-batch)")
    ax.set_ylabel("prefill tokens/s")
    title = "Prefill speed by micro-batch size"
    if len(contexts) == 1 and None not in contexts:
        title += f" ({next(iter(contexts))}-token prompt)"
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="offload", fontsize="small")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    except (OSError, ValueError) as exc:  # an unwritable place, or a format matplotlib does not know
        raise PlotError(f"cannot draw the plot to {path}: {exc}") from None
    return path


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A combined JSON written by :meth:`BenchResults.write_json` (to plot it again)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read benchmark results {path}: {exc}") from None


__all__ = [
    "BenchEvent", "BenchResults", "BenchRun", "EXCLUDED", "PlotError", "Row", "SCHEMA", "default_dir", "discover",
    "document", "format_table", "load_results", "plot", "prefill_points", "require_matplotlib", "row", "rows_of",
    "run_benchmarks", "script_options",
]
