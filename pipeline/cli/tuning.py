"""What to run with and how fast it is: ``rag plan``, ``rag tune``, ``rag bench``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import InputError
from .common import FiniteFloat, cli, echo_json, handles_errors, json_option, open_pipeline


@cli.command()
@click.argument("model", required=False)
@click.option("--spec", "builtin_spec", help="Published shapes instead of a file: qwen3.6-35b-a3b.")
@click.option("--quant", default="Q6_K", show_default=True, help="Quantisation for --spec (Q4_K_M, Q6_K, Q8_0, f16).")
@click.option("--gpu", "hardware", help="Hardware profile: rtx3090, rtx4090, a100-40gb, a100-80gb, h100, h200, cpu, "
              "or a profile TOML. [default: the one `rag tune --measure-hardware` saved, else cpu]")
@click.option("--vram", "vram_gb", type=float, help="GPU memory budget in GiB (overrides the profile).")
@click.option("--ram", "ram_gb", type=float, help="Host memory budget in GiB (overrides the profile).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=1), help="Context length. [default: engine.n_ctx]")
@click.option("--kv", type=click.Choice(["f16", "q8_0", "q4_0", "auto"]), help="KV cache type; auto searches.")
@click.option("-b", "--n-batch", type=click.IntRange(min=1), help="Fix n_batch instead of searching.")
@click.option("-ub", "--n-ubatch", type=click.IntRange(min=1), help="Fix n_ubatch instead of searching.")
@click.option("--compare", is_flag=True, help="Also print a table: the recipe, its baseline, llama.cpp's fit, the plan.")
@json_option
@click.pass_context
@handles_errors
def plan(ctx, model, builtin_spec, quant, hardware, vram_gb, ram_gb, n_ctx, kv, n_batch, n_ubatch, compare,
         as_json):
    """Plan expert offload and batch sizes for the fastest prefill that fits the memory.

    Reads MODEL's tensor list (a GGUF path or model reference; default: the configured
    generator) without loading weights, and prints the plan, its memory per device, the
    estimated prefill speed and what limits it, llama.cpp flags and a config snippet.
    """
    with open_pipeline(ctx) as rag:
        out = rag.plan(model, builtin_spec=builtin_spec, quant=quant, hardware=hardware, vram_gb=vram_gb,
                       ram_gb=ram_gb, n_ctx=n_ctx, kv=kv, n_batch=n_batch, n_ubatch=n_ubatch, compare=compare)
    best, fit = out["plan"], out["fit"]
    if as_json:
        data = {"plan": best.to_dict(), "llama_cpp_fit": fit.to_dict() if fit else None,
                "hardware": out["hardware"].to_dict()}
        if compare:
            data["compare"] = [r.to_dict() for r in out["compare"]]
        echo_json(data)
        return
    click.echo(best.describe())
    if fit is not None:
        gain = best.prefill.tokens_per_s / fit.prefill.tokens_per_s if fit.prefill.tokens_per_s else 0
        click.echo(f"\nllama.cpp --fit (modelled: 1 GiB margin, -b 2048 -ub 512): "
                   f"~{fit.prefill.tokens_per_s:.0f} tok/s; the plan is {gain:.2f}x that")
    else:
        click.echo("\nllama.cpp --fit (modelled) finds no configuration that fits")
    click.echo("\nconfig snippet (rag --config FILE):\n" + best.engine_toml.rstrip())
    if compare:
        from ..tuning.choice import comparison_table

        click.echo("\n" + comparison_table(out["compare"]).rstrip())


@cli.command()
@click.option("--max-seconds", type=FiniteFloat(min=0), default=120, show_default=True,
              help="Time budget: no candidate starts that would overrun it (the baseline and --measure-hardware "
                   "always run whole).")
@click.option("--tokens", "n_tokens", type=click.IntRange(min=16), help="Prompt length measured per candidate.")
@click.option("--measure-hardware", is_flag=True, help="Also measure this machine and save it as the hardware profile.")
@json_option
@click.pass_context
@handles_errors
def tune(ctx, max_seconds, n_tokens, measure_hardware, as_json):
    """Measure candidate settings on this machine and keep the fastest for `rag ask`.

    Short real prefills of a handful of plans around the planner's estimate; the
    winner is written to a profile that later commands use for this model and context.
    """
    bar = None

    def progress(ev):
        nonlocal bar
        if as_json or not sys.stderr.isatty():
            return
        if bar is None and ev.kind in ("plan", "start"):
            bar = click.progressbar(length=max(1, ev.total), label="tuning", file=sys.stderr, show_pos=True)
            bar.__enter__()
        if bar is not None and ev.kind in ("result", "skip"):
            bar.update(1)

    with open_pipeline(ctx) as rag:
        try:
            result, path = rag.tune(max_seconds=max_seconds, n_tokens=n_tokens,
                                    measure_hardware=measure_hardware, progress=progress)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
    if as_json:
        echo_json({**result.to_dict(), "profile": str(path)})
        return
    click.echo(result.describe())
    click.echo(f"\nsaved: {path}")


@cli.command()
@click.argument("names", nargs=-1)
@click.option("--quick", is_flag=True, help="Shorter runs where a benchmark supports it.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write all results as JSON here. [default: bench-results/bench.json]")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw prefill tokens/s against n_ubatch to this PNG (needs matplotlib).")
@click.option("-v", "--verbose", is_flag=True, help="Show the benchmarks' own output.")
@handles_errors
def bench(names, quick, json_path, plot_path, verbose):
    """Run the benchmarks (ingest, prefill, cache; or NAMES) and print one table (from a source checkout)."""
    bench_mod = _bench_runner()

    if plot_path:
        bench_mod.require_matplotlib()

    def progress(ev):
        if ev.kind == "output" and verbose:
            click.echo(f"  {ev.line}", err=True)
        elif ev.kind == "start":
            click.echo(f"[{ev.index + 1}/{ev.total}] {ev.name} ...", err=True)
        elif ev.kind == "done":
            click.echo(f"[{ev.index + 1}/{ev.total}] {ev.name}: {ev.status} in {ev.seconds:.0f} s", err=True)
        elif ev.kind == "skip":
            click.echo(f"[{ev.index + 1}/{ev.total}] {ev.name}: skipped ({ev.message})", err=True)

    results = bench_mod.run_benchmarks(list(names) or None, quick=quick, progress=progress)
    click.echo(results.table())
    target = json_path or Path("bench-results") / "bench.json"
    results.write_json(target)
    click.echo(f"results: {target}")
    if plot_path:
        bench_mod.plot(results, plot_path)
        click.echo(f"plot: {plot_path}")
    if not results.ok:
        raise click.ClickException("some benchmarks failed")


def _bench_runner():
    """The benchmark runner (``devtools/bench.py``) of the source checkout this package runs from.

    The benchmarks and their runner are development tools that ``pip install`` does not install;
    an installed package has neither, and ``rag bench`` says so (exit status 2) instead of failing
    on an import.
    """
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "devtools" / "bench.py").is_file() or not (checkout / "benchmarks").is_dir():
        raise InputError("rag bench runs the benchmarks of a source checkout, and this installation is not one: "
                         "run it from a clone of the repository set up with ./setup.sh")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from devtools import bench

    return bench
