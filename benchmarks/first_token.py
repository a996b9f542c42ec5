"""The time a person waits: a fresh ``rag ask`` process's start to its first answer text, against the
engine's own time to first token (``ttft_seconds``), for composed questions, side by side in one run.

A fresh store and cache are ingested from ``samples/`` with Gemma 3 270M as the generator (the ingest
calibrates composition and saves every section's state), then each question runs as a new
process, as a person at a terminal would start it, ``--stats``, streaming:

* **seen**: from just before the process is spawned to the first byte of answer text on its
  stdout, measured here, outside the process (interpreter start-up, imports, retrieval, model
  load, composing and the first token: everything);
* **reported**: the process's own ``start_to_first_token_seconds`` (from its start, read from the
  kernel, to its first piece of answer text), where the version under test reports it;
* **engine**: its ``ttft_seconds`` (from the engine taking the prompt to the first token).

Beside them, in each round, the floor no Python program on llama-cpp-python can go under: a process
that only imports ``llama_cpp`` and loads the same model file with the engine's default settings
(context 8,192, batches 2,048/512, flash attention), from its spawn to the line it prints once loaded.
That floor plus the engine's TTFT, over the engine's TTFT, is the best ratio a new process could reach.

The ratio seen / engine is the figure to keep at or under 2. Questions whose prompt was not composed
(``cache: composed`` in the stats line) are reported and left out of the ratio.

    .venv/bin/python benchmarks/first_token.py [--repeat 3] [--quick] [--work DIR] [--baseline SRC] [--json OUT]

``--work DIR`` keeps (and on a later run reuses) the ingested stores and caches there. ``--baseline SRC``
also runs another version of the code (a source tree, e.g. ``git archive main | tar -x -C SRC``) with
its own store and cache, question by question in turn with this one, so that both meet the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The generator of these figures, set for every version (whatever its default): Gemma 3 270M.
GENERATOR = "builtin:gemma-3-270m"
QUESTIONS = [
    "How does llama.cpp reuse the KV cache across prompts?",
    "Which batch sizes make prefill fastest on a CPU?",
    "When should Chroma run as a server instead of embedded?",
    "How many experts can stay on the GPU when offloading a MoE model?",
]

_TTFT = re.compile(r"\| TTFT ([0-9.]+) s")
_START = re.compile(r"from the start ([0-9.]+) s")
_CACHE = re.compile(r"cache: (\w+)")


def python() -> str:
    """The interpreter a person's ``rag`` runs on: the checkout's virtual environment's, else this one."""
    local = ROOT / ".venv" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


class Version:
    """One version of the code: ``rag`` run from its source tree, on its own store and cache under ``work``."""

    def __init__(self, name: str, source: Path, work: Path):
        self.name, self.source, self.work = name, source, work / name
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
        self.env.update({"RAG_STORE_PATH": str(self.work / "store"), "RAG_CACHE_PATH": str(self.work / "cache"),
                         "RAG_MODELS_GENERATOR": GENERATOR, "PYTHONPATH": str(source)})
        if os.environ.get("RAG_HOME"):
            self.env["RAG_HOME"] = os.environ["RAG_HOME"]  # where the models are

    def command(self, *args: str) -> list[str]:
        return [python(), "-m", "pipeline", *args]

    def run(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        # Run from the source tree: its ``pipeline`` comes first on the path.
        return subprocess.run(self.command(*args), env=self.env, cwd=self.source, check=True, **kwargs)

    def prepare(self) -> dict:
        """Ingest the samples (once) and return the calibration ``rag status`` shows."""
        if not (self.work / "store" / "catalog.sqlite").exists():
            print(f"{self.name}: ingesting samples/ (calibrates composition, saves section states) ...", flush=True)
            started = time.perf_counter()
            self.run("ingest", str(ROOT / "samples"), stdout=subprocess.DEVNULL)
            print(f"  ingested in {time.perf_counter() - started:.0f} s", flush=True)
        status = json.loads(self.run("status", "--json", capture_output=True, text=True).stdout)
        return status.get("composition") or {}

    def ask(self, question: str, max_tokens: int) -> dict:
        """One question as a new process: seconds to its first byte of answer text, and its stats line."""
        cmd = self.command("ask", question, "--stats", "--max-tokens", str(max_tokens))
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=self.env, cwd=self.source, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = None
        out = b""
        while first is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                byte = os.read(proc.stdout.fileno(), 1)
                if not byte:
                    break
                first = time.perf_counter() - started
                out += byte
        rest, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{err.decode(errors='replace')}")
        stats = next((line for line in err.decode(errors="replace").splitlines() if "| TTFT" in line), "")
        ttft, start, cache = _TTFT.search(stats), _START.search(stats), _CACHE.search(stats)
        return {"version": self.name, "question": question, "seen": first,
                "engine": float(ttft.group(1)) if ttft else None,
                "reported": float(start.group(1)) if start else None, "cache": cache.group(1) if cache else ""}


_BARE_LOAD = """
import sys
import llama_cpp
quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)
llama_cpp.llama_log_set(quiet, None)
llama_cpp.Llama(sys.argv[1], n_ctx=8192, n_batch=2048, n_ubatch=512, flash_attn=True, verbose=False)
print("loaded", flush=True)
"""


def bare_load(version: Version) -> float:
    """Seconds from spawning a process that only imports llama_cpp and loads the generator to its "loaded"."""
    listed = json.loads(version.run("models", "list", "--json", capture_output=True, text=True).stdout)
    started = time.perf_counter()
    proc = subprocess.Popen([python(), "-c", _BARE_LOAD, listed["generator"]["path"]], env=version.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    seconds = time.perf_counter() - started  # the process's exit (freeing the model) is not counted
    _, err = proc.communicate()
    if line.strip() != b"loaded":
        raise SystemExit(f"the bare load failed ({proc.returncode}):\n{err.decode(errors='replace')}")
    return seconds


def summary(runs: list[dict]) -> dict:
    composed = [r for r in runs if r["cache"] == "composed" and r["seen"] and r["engine"]]
    if not composed:
        return {"runs": len(runs), "composed": 0}
    reported = [r["reported"] for r in composed if r["reported"] is not None]
    return {"runs": len(runs), "composed": len(composed),
            "seen_median": statistics.median(r["seen"] for r in composed),
            "engine_ttft_median": statistics.median(r["engine"] for r in composed),
            "ratio_median": statistics.median(r["seen"] / r["engine"] for r in composed),
            "overhead_median": statistics.median(r["seen"] - r["engine"] for r in composed),
            "reported_median": statistics.median(reported) if reported else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="rounds over the questions")
    ap.add_argument("--quick", action="store_true", help="one round over two questions")
    ap.add_argument("--max-tokens", type=int, default=8, help="answer length (the first token is what counts)")
    ap.add_argument("--work", type=Path, help="keep the ingested stores and caches here (reused when present)")
    ap.add_argument("--baseline", type=Path, help="another version's source tree, run in turn with this one")
    ap.add_argument("--json", type=Path, help="write the runs and medians here")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="rag-first-token-"))
    try:
        return measure(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, work: Path) -> int:
    versions = [Version("this", ROOT, work)]
    if args.baseline:
        versions.append(Version("baseline", args.baseline.resolve(), work))
    for v in versions:
        c = v.prepare()
        print(f"{v.name}: composition {'allowed' if c.get('allowed') else 'NOT allowed'} "
              f"(KL {c.get('kl')}, budget {c.get('budget')})", flush=True)
    runs, floors = [], []
    for round_ in range(1 if args.quick else args.repeat):
        floors.append(bare_load(versions[0]))
        print(f"  floor    round {round_ + 1}: import llama_cpp and load the model alone {floors[-1]:.2f} s", flush=True)
        for q in QUESTIONS[:2] if args.quick else QUESTIONS:
            for v in versions:
                r = v.ask(q, args.max_tokens)
                runs.append(r)
                reported = f"{r['reported']:.2f} s" if r["reported"] is not None else "-"
                print(f"  {v.name:8} round {round_ + 1}: seen {r['seen']:.2f} s | reported {reported} | engine TTFT "
                      f"{r['engine']:.2f} s | {r['seen'] / r['engine']:.2f}x | cache {r['cache']} | {q}", flush=True)
    results = {v.name: summary([r for r in runs if r["version"] == v.name]) for v in versions}
    print()
    for name, s in results.items():
        if not s["composed"]:
            print(f"{name}: no question was composed: nothing to compare")
            continue
        print(f"{name}: {s['composed']} of {s['runs']} composed: start to first answer text {s['seen_median']:.2f} s "
              f"(median, seen from outside), engine TTFT {s['engine_ttft_median']:.2f} s: {s['ratio_median']:.2f}x "
              f"(median of per-run ratios; target <= 2); the rest, {s['overhead_median']:.2f} s, is start-up, "
              "retrieval, the model load and the first piece's decode"
              + (f"; reported by rag {s['reported_median']:.2f} s" if s["reported_median"] is not None else ""))
    floor = statistics.median(floors)
    ours = results["this"]
    if ours["composed"]:
        best = (floor + ours["engine_ttft_median"]) / ours["engine_ttft_median"]
        print(f"floor: a process that only imports llama_cpp and loads the model takes {floor:.2f} s (median): "
              f"with nothing else before the engine, the best ratio is {best:.2f}x")
        results["floor"] = {"load_seconds_median": floor, "best_ratio": best}
    load = os.getloadavg()
    print(f"load average {' '.join(f'{x:.1f}' for x in load)}")
    passed = bool(ours["composed"]) and ours["ratio_median"] <= 2.0
    if ours["composed"]:
        print(f"[{'PASS' if passed else 'FAIL'}] start to first answer text at most twice the engine's TTFT: "
              f"{ours['ratio_median']:.2f}x")
    if args.json:
        sys.path.insert(0, str(ROOT))
        from devtools.bench import document, row

        table = [row("floor_load_seconds", floor, "s")]
        for name, r in results.items():
            if r.get("composed"):
                table += [row(f"{name}_start_to_first_text_seconds", r["seen_median"], "s"),
                          row(f"{name}_engine_ttft_seconds", r["engine_ttft_median"], "s"),
                          row(f"{name}_ratio", r["ratio_median"], "x",
                              ratio=(f"{name}_start_to_first_text_seconds", f"{name}_engine_ttft_seconds")),
                          row(f"{name}_overhead_seconds", r["overhead_median"], "s")]
        args.json.write_text(json.dumps(document(table, summary=results, load_average=load, runs=runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
