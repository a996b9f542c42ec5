"""Prefill benchmark: long-prompt prefill speed on the synthetic MoE model, and the engine's overhead.

Run from the repository root::

    .venv/bin/python benchmarks/prefill.py [--tokens 16384] [--repeat 3] [--json OUT.json] [--quick]
        [--arch qwen3moe|qwen35moe|gpt-oss|all]

What it does, in one process:

1. Writes a generated ``qwen3moe`` model (:func:`devtools.synthetic.write_moe_model`, 64K trained
   context, shapes in ``MODEL_SHAPE``) into a temporary directory.
2. **Settings sweep**: prefill tokens/s over the same ``--tokens`` random prompt for every
   (``n_batch``, ``n_ubatch``) in ``BATCHES`` x expert offload in {none, ``n_cpu_moe`` = half the
   layers (the last ones), ``cpu_moe``}, flash attention on, n_ctx = the model's 64K, through
   ``Engine.generate(tokens, max_tokens=1)``. The tokens/s figure is the engine's own
   ``EngineStats.prefill_tokens_per_second`` (llama.cpp's ``t_p_eval`` counter).
3. **Overhead check**: for the recommended setting (2048/512, no offload) and one offload setting,
   the engine's prefill (wall clock around ``Engine.prefill`` + ``llama_synchronize``, and
   ``stats.prefill_seconds``) against a bare ``llama_decode`` loop written here with the low-level
   API over the same tokens and the same context parameters. Runs alternate (pipeline, bare,
   bare, pipeline, ...) with the KV cache cleared before each; the figure is the ratio of the
   medians. Target: the pipeline adds at most 3%.
4. With ``--arch`` naming other architectures (``all``: the hybrid ``qwen35moe`` and ``gpt-oss`` too),
   the same settings sweep on a generated model of each (shapes in ``ARCH_SHAPES``), in the same run.
5. Prints a table and optionally writes everything (all samples too) as JSON.

Every engine and bare context is loaded and warmed before the clock starts; repeats are
interleaved (rotating order) so machine noise hits every row alike; figures are medians.
Threads = usable cores (``pipeline.engine.host.usable_cpus()``), the same for both sides.
This is a benchmark, not a test: it always exits 0 (the PASS/FAIL line is informational).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from devtools.synthetic import write_model, write_moe_model  # noqa: E402
from pipeline.config import EngineConfig  # noqa: E402
from pipeline.engine.host import usable_cpus  # noqa: E402
from pipeline.engine.local import Engine  # noqa: E402

#: The generated model: qwen3moe, 64K trained context. At 16K tokens the attention over the long
#: prompt dominates the cost (it grows with layers x heads x tokens^2), so two layers and one
#: attention head keep a 16K-token prefill at a few seconds on 2 cores (about 2 s idle; 4 layers
#: with 4 heads, the package's default shape, took 7.5 s idle and 20-40 s on a busy machine).
MODEL_SHAPE = dict(n_layers=2, n_embd=64, n_head=1, n_head_kv=1, head_dim=16,
                   n_experts=8, n_experts_used=2, expert_ff=32, n_ctx_train=65536)
#: The other architectures the sweep can run, as small: the hybrid keeps its 3:1 layout (three Gated
#: DeltaNet layers, one attention layer), gpt-oss one sliding-window and one full-attention layer.
ARCH_SHAPES = {
    "qwen35moe": dict(n_layers=4, n_embd=64, n_head=1, n_head_kv=1, head_dim=16, rope_dim=8, n_experts=8,
                      n_experts_used=2, expert_ff=32, shared_ff=32, n_ctx_train=65536),
    "gpt-oss": dict(n_layers=2, n_embd=64, n_head=1, n_head_kv=1, head_dim=16, n_experts=8, n_experts_used=2,
                    expert_ff=32, n_ctx_train=65536),
}
N_CTX = 65536  # the context every engine gets: the model's trained 64K, as in the recipe
BATCHES = [(512, 128), (1024, 512), (2048, 512), (2048, 2048)]
QUICK_BATCHES = [(512, 128), (2048, 512)]
REFERENCE = ((512, 128), "none")  # the "before" of the recipe: -b 512 -ub 128, nothing offloaded
OVERHEAD_TARGET = 0.03  # the pipeline may add at most 3% to the bare loop's prefill time
EXPERT_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's LLM_FFN_EXPS_REGEX


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> float:
    """(max - min) / median: how far apart the repeats were."""
    return (max(xs) - min(xs)) / median(xs) if len(xs) > 1 and median(xs) else 0.0


# --------------------------------------------------------------------------- settings


@dataclass
class Setting:
    n_batch: int
    n_ubatch: int
    offload: str  # none | n_cpu_moe | cpu_moe
    n_layers: int

    @property
    def offload_label(self) -> str:
        if self.offload == "n_cpu_moe":
            return f"n_cpu_moe={self.n_layers // 2} (last)"
        return self.offload

    @property
    def key(self) -> str:
        return f"{self.n_batch}/{self.n_ubatch} {self.offload_label}"

    def engine_config(self, threads: int) -> EngineConfig:
        return EngineConfig(
            n_ctx=N_CTX, n_batch=self.n_batch, n_ubatch=self.n_ubatch, flash_attn=True,
            threads=threads, threads_batch=threads,
            n_cpu_moe=self.n_layers // 2 if self.offload == "n_cpu_moe" else 0,
            cpu_moe_from="last", cpu_moe=self.offload == "cpu_moe",
        )

    def expert_layers(self) -> list[int] | None:
        """Layers whose experts are kept on the CPU (None: every layer, ``cpu_moe``)."""
        if self.offload == "cpu_moe":
            return None
        if self.offload == "n_cpu_moe":
            half = self.n_layers // 2
            return list(range(self.n_layers - half, self.n_layers))
        return []


# --------------------------------------------------------------------------- the pipeline side


@dataclass
class EngineRun:
    """An Engine with its ``prefill`` wrapped to time the call (synchronised) from outside."""

    setting: Setting
    engine: Engine
    prefill_walls: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        inner = self.engine.prefill  # the bound method, looked up before the instance attribute is set
        model = self.engine.llm
        walls = self.prefill_walls

        def prefill(tokens, *, start: int = 0):
            t0 = time.perf_counter()
            inner(tokens, start=start)
            model.synchronize()
            walls.append(time.perf_counter() - t0)

        self.engine.prefill = prefill  # type: ignore[method-assign]  (_run calls self.prefill)

    def run(self, tokens: list[int], *, settle: bool = True) -> dict:
        """One full prefill of ``tokens`` (KV cache cleared first) plus one generated token.

        ``settle``: synchronise the context afterwards. ``Engine.generate`` leaves its last decode
        (the generated token's) unsynchronised, and llama.cpp then books everything from that
        decode to the next call's first synchronisation (idle time included) as the *next* call's
        prompt-eval time; see :func:`stale_timer_check`.
        """
        self.engine.reset()  # llama_memory_clear + forget the cached tokens: no prefix reuse
        t0 = time.perf_counter()
        gen = self.engine.generate(tokens, max_tokens=1)
        gen.read()
        total = time.perf_counter() - t0
        if settle:
            self.engine.llm.synchronize()
        s = gen.stats
        if s.cached_tokens or s.prefill_tokens != len(tokens):
            raise RuntimeError(f"{self.setting.key}: expected a full prefill, got {s.to_dict()}")
        return dict(tokens_per_second=s.prefill_tokens_per_second, prefill_seconds=s.prefill_seconds,
                    prefill_wall=self.prefill_walls[-1], ttft_seconds=s.ttft_seconds, generate_wall=total)


# --------------------------------------------------------------------------- the bare side


class _BuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class BareLoop:
    """llama.cpp's low-level API only: load, create a context, decode ``n_batch`` slices, synchronise.

    Written independently of the engine. Model params: llama.cpp's defaults plus the engine's
    GPU layers, mmap choice and expert overrides; context params: llama.cpp's defaults plus
    n_ctx, n_batch, n_ubatch, threads, flash attention, KV types and perf counters on.
    """

    def __init__(self, path: Path, cfg: EngineConfig, *, n_ctx: int, use_mmap: bool,
                 expert_layers: list[int] | None):
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = cfg.gpu_layers
        mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if use_mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        self._patterns: list[bytes] = []
        if expert_layers is None:
            self._patterns = [EXPERT_PATTERN.encode()]
        else:
            self._patterns = [(rf"blk\.{i}" + EXPERT_PATTERN).encode() for i in expert_layers]
        self._overrides = None
        if self._patterns:
            cpu_buft = llama_cpp.llama_cpp._lib.ggml_backend_cpu_buffer_type
            cpu_buft.restype, cpu_buft.argtypes = ctypes.c_void_p, []
            self._overrides = (_BuftOverride * (len(self._patterns) + 1))()  # last entry {NULL, NULL}
            for i, pattern in enumerate(self._patterns):
                self._overrides[i].pattern = pattern
                self._overrides[i].buft = cpu_buft()
            mp.tensor_buft_overrides = ctypes.addressof(self._overrides)
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"bare loop: could not load {path}")

        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = min(cfg.n_batch, n_ctx)
        cp.n_ubatch = min(cfg.n_ubatch, cfg.n_batch, n_ctx)
        cp.n_threads = cfg.threads
        cp.n_threads_batch = cfg.threads_batch or cfg.threads
        cp.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg.flash_attn
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        kv = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
        cp.type_k, cp.type_v = kv[cfg.type_k], kv[cfg.type_v]
        cp.no_perf = False
        self.params = cp
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("bare loop: could not create the context")
        self.n_batch = int(cp.n_batch)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        b = self.batch
        for i in range(self.n_batch):  # one sequence, set once
            b.seq_id[i][0] = 0
            b.n_seq_id[i] = 1
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)

    def run(self, tokens: np.ndarray, positions: np.ndarray) -> dict:
        """Prefill ``tokens`` from an empty cache; logits for the last token of each slice only."""
        self.clear()
        llama_cpp.llama_perf_context_reset(self.ctx)
        ctx, batch, n_batch = self.ctx, self.batch, self.n_batch
        tok, pos, logits = self._tok, self._pos, self._logits
        n = len(tokens)
        t0 = time.perf_counter()
        for lo in range(0, n, n_batch):
            m = min(n_batch, n - lo)
            tok[:m] = tokens[lo:lo + m]
            pos[:m] = positions[lo:lo + m]
            logits[:m] = 0
            logits[m - 1] = 1
            batch.n_tokens = m
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"bare loop: llama_decode returned {rc} at token {lo}")
        llama_cpp.llama_synchronize(ctx)
        wall = time.perf_counter() - t0
        perf = llama_cpp.llama_perf_context(ctx)
        return dict(wall=wall, prefill_seconds=perf.t_p_eval_ms / 1000, n_p_eval=perf.n_p_eval)

    def close(self) -> None:
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def param_differences(a, b) -> list[str]:
    """Scalar fields of two ``llama_context_params`` that differ (pointers and callbacks skipped)."""
    out = []
    for name, typ in a._fields_:
        if typ in (ctypes.c_int, ctypes.c_int32, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64,
                   ctypes.c_float, ctypes.c_double, ctypes.c_bool, ctypes.c_int8, ctypes.c_uint8):
            va, vb = getattr(a, name), getattr(b, name)
            if va != vb:
                out.append(f"{name}: engine {va} / bare {vb}")
    return out


# --------------------------------------------------------------------------- main


def python_overhead(run: EngineRun, tokens: list[int]) -> float:
    """Seconds ``Engine.prefill`` spends outside ``llama_decode``: the same call with decode stubbed out."""
    llm = run.engine.llm
    run.engine.reset()
    llm._decode = lambda: None  # instance attribute shadows Model._decode, the llama_decode call
    try:
        times = []
        for _ in range(3):
            run.engine.reset()
            t0 = time.perf_counter()
            Engine.prefill(run.engine, tokens)
            times.append(time.perf_counter() - t0)
    finally:
        del llm._decode
        run.engine.reset()
    return min(times)


def stale_timer_check(run: EngineRun, tokens: list[int], idle: float = 1.0) -> dict:
    """Two engine calls with ``idle`` seconds between them, the first one left unsynchronised."""
    run.run(tokens)  # settled: a clean start
    run.run(tokens, settle=False)
    time.sleep(idle)
    x = run.run(tokens)
    return dict(idle=idle, tokens=len(tokens), stats_prefill_seconds=x["prefill_seconds"],
                prefill_wall=x["prefill_wall"])


def arch_sweep(arch: str, folder: Path, tokens: list[int], batches, offloads, repeat: int, threads: int) -> list[dict]:
    """The settings sweep on a generated ``arch`` model (:data:`ARCH_SHAPES`): rows as the main sweep's."""
    shape = ARCH_SHAPES[arch]
    path = write_model(arch, folder / f"{arch}.gguf", **shape)
    settings = [Setting(b, u, o, shape["n_layers"]) for (b, u) in batches for o in offloads]
    runs = {}
    try:
        for s in settings:
            runs[s.key] = EngineRun(s, Engine(path, s.engine_config(threads)))
            runs[s.key].run(tokens[: min(len(tokens), 2048)])  # loaded and warmed before the clock starts
        print(f"{arch} sweep: {len(settings)} settings x {repeat} repeats, interleaved...", flush=True)
        samples: dict[str, list[dict]] = {s.key: [] for s in settings}
        for r in range(repeat):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            for s in (order[::-1] if r % 2 else order):
                samples[s.key].append(runs[s.key].run(tokens))
    finally:
        for run in runs.values():
            run.engine.close()
    rows = []
    for s in settings:
        tps = [x["tokens_per_second"] for x in samples[s.key]]
        rows.append(dict(arch=arch, n_batch=s.n_batch, n_ubatch=s.n_ubatch, offload=s.offload_label,
                         tokens_per_second=median(tps), tokens_per_second_min=min(tps),
                         tokens_per_second_max=max(tps), samples=samples[s.key]))
    ref = next(r["tokens_per_second"] for r in rows if (r["n_batch"], r["n_ubatch"]) == REFERENCE[0]
               and r["offload"] == REFERENCE[1])
    for r in rows:
        r["vs_reference"] = r["tokens_per_second"] / ref if ref else float("nan")
    return rows


def print_arch_rows(rows: list[dict], n_tokens: int) -> None:
    print(f"\nPrefill of {n_tokens:,} tokens by architecture, tokens/s (median), ratio to its own 512/128 none")
    for r in rows:
        print(f"{r['arch']:>10}  {r['n_batch']:>5}/{r['n_ubatch']:<5} {r['offload']:<18} "
              f"{r['tokens_per_second']:>8.0f}  {r['vs_reference']:>5.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=None, help="prompt tokens (default 16384; --quick: 4096)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats of the settings sweep (default 3; --quick: 2)")
    ap.add_argument("--compare-repeat", type=int, default=None,
                    help="pipeline/bare pairs per overhead setting (default 6; --quick: 3)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    ap.add_argument("--quick", action="store_true", help="4096 tokens, fewer settings (about a minute)")
    ap.add_argument("--arch", default="qwen3moe",
                    help="also sweep these generated architectures: a comma list of qwen35moe, gpt-oss, or all")
    args = ap.parse_args(argv)
    extra = list(ARCH_SHAPES) if args.arch == "all" else [a for a in args.arch.split(",") if a != "qwen3moe"]
    unknown = [a for a in extra if a not in ARCH_SHAPES]
    if unknown:
        ap.error(f"unknown architecture(s) {', '.join(unknown)}: use qwen3moe, {', '.join(ARCH_SHAPES)} or all")
    quick = args.quick
    n_tokens = args.tokens or (4096 if quick else 16384)
    repeat = max(1, args.repeat or (2 if quick else 3))
    cmp_repeat = max(1, args.compare_repeat or (3 if quick else 6))
    threads = usable_cpus()
    notes: list[str] = []
    if n_tokens > N_CTX - 1:
        notes.append(f"--tokens {n_tokens} does not fit a {N_CTX}-token context with the generated token: "
                     f"using {N_CTX - 1}")
        n_tokens = N_CTX - 1
    n_layers = MODEL_SHAPE["n_layers"]
    batches = QUICK_BATCHES if quick else BATCHES
    offloads = ["none", "cpu_moe"] if quick else ["none", "n_cpu_moe", "cpu_moe"]
    settings = [Setting(b, u, o, n_layers) for (b, u) in batches for o in offloads]
    compare = [Setting(2048, 512, "none", n_layers), Setting(2048, 512, "n_cpu_moe", n_layers)]
    gpu_build = bool(llama_cpp.llama_supports_gpu_offload())
    load_before = os.getloadavg()
    t_start = time.perf_counter()

    tmp = tempfile.TemporaryDirectory(prefix="rag-prefill-bench-")
    runs: dict[str, EngineRun] = {}
    bares: dict[str, BareLoop] = {}
    try:
        model_path = write_moe_model(Path(tmp.name) / "synthetic-moe.gguf", **MODEL_SHAPE)
        rng = np.random.default_rng(0)
        tokens_np = rng.integers(0, 256, size=n_tokens, dtype=np.int32)  # byte tokens, no specials
        tokens = tokens_np.tolist()
        positions = np.arange(n_tokens, dtype=np.int32)

        # -- setup (untimed): load every engine and bare context, warm each once --------------
        print(f"prefill benchmark: {n_tokens:,} tokens, n_ctx {N_CTX:,}, {threads} threads, flash attention on, "
              f"llama-cpp-python {llama_cpp.__version__}, {'GPU' if gpu_build else 'CPU-only'} build", flush=True)
        print("model: qwen3moe " + ", ".join(f"{k}={v}" for k, v in MODEL_SHAPE.items())
              + f" ({model_path.stat().st_size / 1e6:.1f} MB)", flush=True)
        print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
              "loading and warming engines...", flush=True)
        warm = tokens[: min(len(tokens), 2048)]
        for s in settings + compare:
            if s.key in runs:
                continue
            run = EngineRun(s, Engine(model_path, s.engine_config(threads)))
            run.engine.llm
            run.run(warm)
            runs[s.key] = run
        param_diffs: dict[str, list[str]] = {}
        for s in compare:
            run = runs[s.key]
            bare = BareLoop(model_path, s.engine_config(threads), n_ctx=run.engine.n_ctx,
                            use_mmap=run.engine.use_mmap, expert_layers=s.expert_layers())
            bare.run(tokens_np[:len(warm)], positions[:len(warm)])
            bares[s.key] = bare
            param_diffs[s.key] = param_differences(run.engine.llm.context_params, bare.params)

        stale = stale_timer_check(runs[compare[0].key], tokens[:256])

        # -- 1. settings sweep ------------------------------------------------------------------
        sweep: dict[str, list[dict]] = {s.key: [] for s in settings}
        print(f"settings sweep: {len(settings)} settings x {repeat} repeats, interleaved...", flush=True)
        for r in range(repeat):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            if r % 2:
                order.reverse()
            for s in order:
                sweep[s.key].append(runs[s.key].run(tokens))

        # -- 2. pipeline vs bare ------------------------------------------------------------------
        print(f"pipeline vs bare llama_decode loop: {len(compare)} settings x {cmp_repeat} pairs, alternating...",
              flush=True)
        pairs: dict[str, dict[str, list]] = {s.key: {"pipeline": [], "bare": []} for s in compare}
        for r in range(cmp_repeat):
            for s in (compare if r % 2 == 0 else compare[::-1]):
                sides = ["pipeline", "bare"] if r % 2 == 0 else ["bare", "pipeline"]
                for side in sides:
                    if side == "pipeline":
                        pairs[s.key]["pipeline"].append(runs[s.key].run(tokens))
                    else:
                        pairs[s.key]["bare"].append(bares[s.key].run(tokens_np, positions))
        py_overhead = python_overhead(runs[compare[0].key], tokens)
        arch_rows = [r for arch in extra
                     for r in arch_sweep(arch, Path(tmp.name), tokens, batches, offloads, repeat, threads)]
        elapsed = time.perf_counter() - t_start
    finally:
        for bare in bares.values():
            bare.close()
        for run in runs.values():
            run.engine.close()
        tmp.cleanup()
    load_after = os.getloadavg()

    # -- figures ---------------------------------------------------------------------------------
    ref_key = Setting(*REFERENCE[0], REFERENCE[1], n_layers).key
    ref_tps = median([x["tokens_per_second"] for x in sweep[ref_key]])
    ref_best = max(x["tokens_per_second"] for x in sweep[ref_key])
    rows = []
    for s in settings:
        xs = sweep[s.key]
        tps = [x["tokens_per_second"] for x in xs]
        rows.append(dict(
            n_batch=s.n_batch, n_ubatch=s.n_ubatch, offload=s.offload_label,
            tokens_per_second=median(tps), tokens_per_second_min=min(tps), tokens_per_second_max=max(tps),
            prefill_seconds=median([x["prefill_seconds"] for x in xs]),
            prefill_wall=median([x["prefill_wall"] for x in xs]),
            ttft_seconds=median([x["ttft_seconds"] for x in xs]),
            vs_reference=median(tps) / ref_tps if ref_tps else float("nan"),
            vs_reference_best=max(tps) / ref_best if ref_best else float("nan"),
            samples=xs,
        ))
    comparisons = []
    for s in compare:
        p, b = pairs[s.key]["pipeline"], pairs[s.key]["bare"]
        p_wall = median([x["prefill_wall"] for x in p])
        p_stats = median([x["prefill_seconds"] for x in p])
        b_wall = median([x["wall"] for x in b])
        b_stats = median([x["prefill_seconds"] for x in b])
        paired = [x["prefill_wall"] / y["wall"] - 1 for x, y in zip(p, b)]
        best = min(x["prefill_wall"] for x in p) / min(x["wall"] for x in b) - 1
        comparisons.append(dict(
            setting=s.key, n_batch=s.n_batch, n_ubatch=s.n_ubatch, offload=s.offload_label,
            pipeline_prefill_wall=p_wall, pipeline_stats_prefill_seconds=p_stats,
            bare_wall=b_wall, bare_perf_prefill_seconds=b_stats,
            overhead_wall=p_wall / b_wall - 1, overhead_stats=p_stats / b_wall - 1,
            overhead_paired_median=median(paired), paired_overheads=paired, overhead_best=best,
            pipeline_spread=spread([x["prefill_wall"] for x in p]), bare_spread=spread([x["wall"] for x in b]),
            passed=p_wall / b_wall - 1 <= OVERHEAD_TARGET,
            context_param_differences=param_diffs[s.key],
            samples=dict(pipeline=p, bare=b),
        ))
    bare_ref = min(x["wall"] for x in pairs[compare[0].key]["bare"])  # the least disturbed bare run
    noise = max(max(c["bare_spread"], c["pipeline_spread"]) for c in comparisons)

    # -- report ------------------------------------------------------------------------------------
    print()
    print(f"Prefill of {n_tokens:,} tokens, tokens/s from llama.cpp's timings (EngineStats), median of {repeat} "
          "interleaved runs")
    print(f"{'n_batch/n_ubatch':>16}  {'offload':<18} {'tok/s':>7} {'best':>7} {'worst':>7}  {'prefill s':>9}  "
          f"{'wall s':>7}  {'vs 512/128 none':>15} {'(best)':>7}")
    for row in rows:
        print(f"{row['n_batch']:>7}/{row['n_ubatch']:<8}  {row['offload']:<18} {row['tokens_per_second']:>7.0f} "
              f"{row['tokens_per_second_max']:>7.0f} {row['tokens_per_second_min']:>7.0f}  "
              f"{row['prefill_seconds']:>9.2f}  {row['prefill_wall']:>7.2f}  {row['vs_reference']:>14.2f}x "
              f"{row['vs_reference_best']:>6.2f}x")
    print("tok/s and prefill s: median; best/worst: fastest/slowest repeat; wall s: median wall clock around "
          "Engine.prefill (synchronised).")
    if gpu_build:
        print("offload rows: GPU build, so the offloaded experts run from host memory (see the ratios).")
    else:
        print("offload rows: this is a CPU-only build, so every tensor is in CPU memory anyway and expert "
              "offload cannot change speed (differences are noise); the rows are there so the same script "
              "shows the effect on a GPU build.")
    print()
    print(f"Pipeline prefill vs a bare llama_decode loop, same tokens and context params, {cmp_repeat} alternating "
          "pairs, medians (wall = around Engine.prefill / the loop, synchronised)")
    print(f"{'setting':<28} {'pipeline wall':>13} {'stats.prefill':>13} {'bare wall':>9} {'bare perf':>9} "
          f"{'overhead':>8} {'paired':>7} {'best':>6}  result")
    for c in comparisons:
        print(f"{c['setting']:<28} {c['pipeline_prefill_wall']:>12.3f}s {c['pipeline_stats_prefill_seconds']:>12.3f}s "
              f"{c['bare_wall']:>8.3f}s {c['bare_perf_prefill_seconds']:>8.3f}s {c['overhead_wall']:>+7.1%} "
              f"{c['overhead_paired_median']:>+6.1%} {c['overhead_best']:>+6.1%}  {'PASS' if c['passed'] else 'FAIL'}")
    print(f"criterion: overhead = median(pipeline wall) / median(bare wall) - 1 <= {OVERHEAD_TARGET:.0%}. Noise "
          f"tolerance: none beyond the {OVERHEAD_TARGET:.0%} target itself. 'paired' = median of the per-pair "
          "ratios, 'best' = fastest pipeline run / fastest bare run (noise only ever adds time).")
    print("repeat spread, (max-min)/median: " + "; ".join(
        f"{c['setting']}: bare {c['bare_spread']:.1%}, pipeline {c['pipeline_spread']:.1%}" for c in comparisons)
        + (f" -- above {OVERHEAD_TARGET:.0%}: this machine's noise is larger than the effect measured, read the "
           "verdict with that in mind" if noise > OVERHEAD_TARGET else ""))
    print(f"Engine.prefill outside llama_decode (decode stubbed out): {py_overhead * 1000:.1f} ms for "
          f"{n_tokens:,} tokens ({py_overhead / n_tokens * 1e6:.2f} us/token, {py_overhead / bare_ref:.2%} of the fastest bare "
          "prefill): filling the batch through NumPy views, and slicing.")
    print(f"engine stats check: after a call whose last decode was left unsynchronised and {stale['idle']:.1f} s "
          f"idle, a {stale['tokens']}-token prefill took {stale['prefill_wall']:.3f} s (wall) but "
          f"stats.prefill_seconds said {stale['stats_prefill_seconds']:.3f} s"
          + (" -- llama.cpp booked the idle time to it (Engine.generate never synchronises its last decode; "
             "this benchmark synchronises after every call to keep its figures clean)"
             if stale["stats_prefill_seconds"] > stale["prefill_wall"] + 0.5 * stale["idle"] else " (consistent)"))
    for c in comparisons:
        if c["context_param_differences"]:
            print(f"context params that differ ({c['setting']}; the yarn_* ones are unused without YaRN scaling): "
                  + "; ".join(c["context_param_differences"]))
    if arch_rows:
        print_arch_rows(arch_rows, n_tokens)
    for note in notes:
        print("note: " + note)
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"total {elapsed:.0f} s")

    if args.json:
        out = dict(
            tokens=n_tokens, n_ctx=N_CTX, threads=threads, flash_attn=True, repeat=repeat,
            compare_repeat=cmp_repeat, quick=quick, model_shape=MODEL_SHAPE, gpu_build=gpu_build,
            llama_cpp_python=llama_cpp.__version__, python=platform.python_version(),
            load_average_before=load_before, load_average_after=load_after, seconds=elapsed,
            reference=ref_key, sweep=rows, comparisons=comparisons, overhead_target=OVERHEAD_TARGET,
            engine_prefill_python_seconds=py_overhead, stale_timer_check=stale, noise_spread=noise, notes=notes,
            arch_shapes={a: ARCH_SHAPES[a] for a in extra}, arch_sweep=arch_rows,
        )
        from devtools.bench import document, row

        table = [row("prompt tokens", int(n_tokens))]
        table += [row(f"-b {r['n_batch']} -ub {r['n_ubatch']}, offload {r['offload']}", float(r["tokens_per_second"]),
                      "tok/s", n_batch=r["n_batch"], n_ubatch=r["n_ubatch"], series=str(r["offload"]))
                  for r in rows]
        table += [row(f"{r['arch']}: -b {r['n_batch']} -ub {r['n_ubatch']}, offload {r['offload']}",
                      float(r["tokens_per_second"]), "tok/s", n_batch=r["n_batch"], n_ubatch=r["n_ubatch"],
                      series=f"{r['arch']} {r['offload']}") for r in arch_rows]
        for c in comparisons:
            table.append(row(f"engine overhead vs bare llama_decode ({c['setting']})", 100.0 * float(c["overhead_wall"]),
                             "%"))
            table.append(row(f"overhead target met ({c['setting']})", bool(c["passed"])))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(table, **out), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
