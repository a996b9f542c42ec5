"""The ``rag`` command: options map to keyword arguments of one :class:`pipeline.Pipeline` call.

No logic lives here beyond presentation: progress bars, tables, JSON, and
turning :class:`pipeline.errors.RagError` into a message and an exit status.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from .errors import RagError


class UserError(click.ClickException):
    """A :class:`RagError` shown as ``Error: message`` with the error's exit status."""

    def __init__(self, err: RagError):
        super().__init__(str(err))
        self.exit_code = err.exit_code


def _pipeline(ctx: click.Context, **overrides: Any):
    from .api import Pipeline

    config_path = ctx.find_root().params.get("config_path")
    return Pipeline.from_config(config_path, overrides=overrides, log=lambda m: click.echo(m, err=True))


def handles_errors(fn: Callable) -> Callable:
    """A :class:`RagError` becomes its message on stderr and its exit status; with ``--json``, also
    ``{"schema": 1, "error": {...}, "exit_code": N}`` on stdout (see :mod:`.schemas`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RagError as err:
            if kwargs.get("as_json"):
                _echo_json({"error": {"message": str(err), "type": type(err).__name__}, "exit_code": err.exit_code})
            raise UserError(err) from None
    return wrapper


def store_options(fn: Callable) -> Callable:
    """--collection and --store, shared by every command that opens a store."""
    fn = click.option("-c", "--collection", help="Collection (corpus) name. [default: from config, 'default']")(fn)
    fn = click.option("--store", "store_path", type=click.Path(file_okay=False, path_type=Path),
                      help="Store directory. [default: $RAG_HOME/store]")(fn)
    return fn


def json_option(fn: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def _store_overrides(collection: str | None, store_path: Path | None) -> dict[str, Any]:
    return {"store.collection": collection, "store.path": str(store_path) if store_path else None}


def _echo_json(data: Any) -> None:
    """One JSON output; objects carry the schema version (documented in docs/json.md)."""
    from .schemas import versioned

    if isinstance(data, dict):
        data = versioned(data)
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rag-pipeline", prog_name="rag")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              envvar="RAG_CONFIG", help="TOML settings file. [env: RAG_CONFIG]")
def cli(config_path: Path | None) -> None:
    """RAG over long documents with the shortest time-to-first-token.

    Settings come from the embedded defaults, a TOML file (--config), RAG_SECTION_KEY
    environment variables (e.g. RAG_STORE_COLLECTION), then the options of each command.
    """


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@store_options
@click.option("--prune", is_flag=True, help="Remove documents whose files disappeared from the given folders.")
@click.option("--strict", is_flag=True, help="Exit with status 1 if any file could not be read.")
@click.option("--warm", is_flag=True, help="Then save each document's prompt state (see `rag warm`).")
@json_option
@click.pass_context
@handles_errors
def ingest(ctx, paths, collection, store_path, prune, strict, warm, as_json):
    """Load, chunk, embed and store the documents under PATHS.

    PDF, Markdown, text and HTML files are indexed; other files are skipped. Unchanged
    files are not embedded again; changed files replace their old chunks.
    """
    rag = _pipeline(ctx, **_store_overrides(collection, store_path))
    bar = _IngestBar(enabled=not as_json and sys.stderr.isatty())
    try:
        report = rag.ingest(paths, prune=prune, progress=bar.event)
        bar.close()
        if not as_json:
            for f in report.failed:
                click.echo(f"failed: {f.path}: {f.reason}", err=True)
            click.echo(report.summary())
        warmed = _warm(rag, quiet=as_json) if warm else None
    finally:
        bar.close()
        rag.close()
    if as_json:
        data = report.to_dict()
        if warmed is not None:
            data["warm"] = warmed
        _echo_json(data)
    if strict and report.failed:
        ctx.exit(1)


def _warm(rag, *, quiet: bool) -> dict[str, str]:
    def show(source: str, outcome: str) -> None:
        if not quiet:
            click.echo(f"warm: {_display_path(source)}: {outcome}", err=True)

    outcomes = rag.warm(progress=show)
    if not quiet:
        counts = {k: list(outcomes.values()).count(k) for k in ("saved", "cached", "too long")}
        click.echo(f"warmed {len(outcomes)} documents: {counts['saved']} saved, {counts['cached']} already "
                   f"cached, {counts['too long']} too long for the context")
    return outcomes


@cli.command()
@store_options
@json_option
@click.pass_context
@handles_errors
def warm(ctx, collection, store_path, as_json):
    """Prefill and save each document's whole-document prompt, so the first question is fast too.

    Uses the layout of `rag ask --doc`; documents longer than the context are skipped.
    """
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        outcomes = _warm(rag, quiet=as_json)
    if as_json:
        _echo_json(outcomes)


@cli.group()
def cache():
    """Inspect or clear the prefix KV cache (saved prompt states)."""


def _prefix_cache(ctx):
    """The configured prefix cache (a context manager), or a user error when it is off."""
    rag = _pipeline(ctx)
    if rag.prefix_cache is None:
        raise click.ClickException("the prefix cache is off (cache.enabled = false)")
    return rag.prefix_cache


@cache.command("stats")
@json_option
@click.pass_context
@handles_errors
def cache_stats(ctx, as_json):
    """Show entries, size, hits and bytes per token of the prefix cache."""
    with _prefix_cache(ctx) as cache:
        st = cache.stats()
    if as_json:
        _echo_json(st)
        return
    for key, value in st.items():
        if not isinstance(value, (dict, list)):
            click.echo(f"{key + ':':22} {value:,}" if isinstance(value, int) else f"{key + ':':22} {value}")


@cache.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@handles_errors
def cache_clear(ctx, yes):
    """Delete every saved prefix state."""
    with _prefix_cache(ctx) as cache:
        if not yes:
            click.confirm(f"Delete every saved prefix state in {cache.directory}?", abort=True)
        n = cache.clear()
    click.echo(f"deleted {n} cached prefix states")


class _IngestBar:
    """A progress bar on stderr driven by the library's ingest events."""

    def __init__(self, *, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def event(self, ev) -> None:
        if not self.enabled:
            return
        if ev.kind == "plan":
            self.bar = click.progressbar(length=ev.total, label="embedding", file=sys.stderr,
                                         show_pos=True, item_show_func=lambda s: s)
            self.bar.__enter__()
        elif self.bar is not None and ev.kind == "chunks":
            self.bar.current_item = f"{Path(ev.path).name} ({ev.chunks} chunks)"
            self.bar.render_progress()
        elif self.bar is not None and ev.kind == "file":
            self.bar.update(1, Path(ev.path).name)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@cli.command()
@click.argument("query")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Number of hits. [default: from config, 5]")
@click.option("--dense/--no-dense", default=None, help="Use the vector (dense) side.")
@click.option("--lexical/--no-lexical", default=None, help="Use the BM25 (lexical) side.")
@store_options
@json_option
@click.pass_context
@handles_errors
def search(ctx, query, top_k, dense, lexical, collection, store_path, as_json):
    """Retrieve the chunks that best match QUERY (hybrid dense + BM25), without generating."""
    overrides = _store_overrides(collection, store_path)
    overrides.update({"retrieval.dense": dense, "retrieval.lexical": lexical})
    with _pipeline(ctx, **overrides) as rag:
        hits = rag.search(query, top_k=top_k)
    if as_json:
        _echo_json({"query": query, "hits": [h.to_dict() for h in hits]})
        return
    if not hits:
        click.echo("no matches", err=True)
        return
    for i, h in enumerate(hits, start=1):
        where = _display_path(h.source) + (f", page {h.page}" if h.page else "")
        click.secho(f"[{i}] {where}  score {h.score:.4f}  ({' + '.join(h.found_by)})", bold=True)
        click.echo(_indent(h.text))
        click.echo()


def _display_path(source: str) -> str:
    try:
        return str(Path(source).relative_to(Path.cwd()))
    except ValueError:
        return source


def _indent(text: str, width: int = 600) -> str:
    text = " ".join(text.split())
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0] + " …"
    return "    " + text


@cli.command()
@click.argument("question")
@click.option("--doc", type=click.Path(path_type=Path), help="Answer from this ingested document as a whole.")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Passages to retrieve. [default: from config, 8]")
@click.option("--stats", "show_stats", is_flag=True, help="Print the engine's figures (prefill, TTFT, decode).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0), help="Context length in tokens (engine.n_ctx).")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Longest answer in tokens (ask.max_tokens).")
@click.option("--temperature", type=click.FloatRange(0, 5), help="Sampling temperature; 0 is greedy (ask.temperature).")
@click.option("--system", "system_prompt", help="System prompt for this question (ask.system_prompt).")
@click.option("--stop", multiple=True, help="Stop the answer at this text (repeatable).")
@click.option("--chat", "chat_id", help="Continue (or start) the conversation ID: follow-ups keep the documents.")
@store_options
@json_option
@click.pass_context
@handles_errors
def ask(ctx, question, doc, top_k, show_stats, n_ctx, max_tokens, temperature, system_prompt, stop, chat_id,
        collection, store_path, as_json):
    """Answer QUESTION from the collection, streaming the answer, then its sources.

    Retrieves passages (hybrid search plus neighbouring chunks), packs as many as fit
    the context with the question last, and runs them through llama.cpp.
    """
    overrides = _store_overrides(collection, store_path)
    overrides.update({"engine.n_ctx": n_ctx, "ask.max_tokens": max_tokens})
    from .concurrency import iterate_interruptibly
    from .errors import Cancelled

    with _pipeline(ctx, **overrides) as rag:
        options = {"doc": doc, "top_k": top_k, "temperature": temperature, "system_prompt": system_prompt,
                   "stop": list(stop) or None,
                   "progress": _PrefillLine() if not as_json and sys.stderr.isatty() else None}
        stream = (rag.chat_stream(question, chat_id=chat_id, **options) if chat_id
                  else rag.ask_stream(question, **options))
        try:  # generated in a worker thread: Ctrl-C stops a prefill within one micro-batch
            for piece in iterate_interruptibly(stream):
                if not as_json:
                    click.echo(piece, nl=False)
        except KeyboardInterrupt:
            raise UserError(Cancelled("interrupted")) from None
        answer = stream.answer
        if as_json:
            _echo_json(answer.to_dict())
            return
    click.echo()
    if answer.sources:
        click.echo("\nSources:")
        for src in answer.sources:
            pages = src["pages"]
            where = "" if not pages else (f", page {pages[0]}" if len(pages) == 1 else f", pages {pages[0]}-{pages[-1]}")
            click.echo(f"  [{src['n']}] {_display_path(src['source'])}{where}")
    for note in answer.notes or []:
        click.echo(f"note: {note}", err=True)
    if show_stats:
        st = answer.stats
        click.echo(
            f"\nprompt {st.prompt_tokens:,} tokens ({st.cached_tokens:,} reused, cache: {st.cache}) | "
            f"prefill {st.prefill_seconds:.2f} s at {st.prefill_tokens_per_second:,.0f} tok/s | "
            f"TTFT {st.ttft_seconds:.2f} s | decode {st.decode_tokens} tokens at "
            f"{st.decode_tokens_per_second:.1f} tok/s | model load {st.load_seconds:.2f} s", err=True)


class _PrefillLine:
    """Prefill progress on one stderr line, shown once a prefill has taken more than a second."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, p) -> None:
        if p.seconds < 1.0 and not self.shown:
            return
        self.shown = True
        end = "\n" if p.finished else ""
        click.echo("\r\033[K" + p.describe() + end, err=True, nl=False)


@cli.command()
@store_options
@json_option
@click.pass_context
@handles_errors
def status(ctx, collection, store_path, as_json):
    """Show what a collection holds: documents, chunks, models and the store path."""
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        st = rag.status()
    if as_json:
        _echo_json(st.to_dict())
        return
    click.echo(f"store:       {st.store}")
    if not st.exists:
        others = f" (collections here: {', '.join(st.collections)})" if st.collections else ""
        click.echo(f"collection:  {st.collection} (does not exist yet{others})")
        return
    click.echo(f"collection:  {st.collection}")
    click.echo(f"documents:   {st.documents:,}")
    click.echo(f"chunks:      {st.chunks:,} ({st.tokens:,} tokens; chunk size {st.chunk_size}, overlap {st.chunk_overlap})")
    click.echo(f"embedder:    {st.embedder} ({st.dim} dimensions)")
    click.echo(f"generator:   {st.generator}")
    if len(st.collections) > 1:
        click.echo(f"collections: {', '.join(st.collections)}")
    for s in st.sources:
        pages = f", {s['pages']} pages" if s["pages"] else ""
        click.echo(f"  {_display_path(s['source'])}  ({s['format']}{pages}, {s['chunks']} chunks)")


@cli.command()
@store_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@handles_errors
def drop(ctx, collection, store_path, yes):
    """Delete a collection (its vectors, chunks and lexical index)."""
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        name = rag.config.store.collection
        if not yes:
            click.confirm(f"Delete the collection '{name}'?", abort=True)
        if rag.drop():
            click.echo(f"dropped collection '{name}'")
        else:
            raise click.ClickException(f"collection '{name}' does not exist")


@cli.group()
def models():
    """Show or provision the configured models."""


@models.command("list")
@json_option
@click.pass_context
@handles_errors
def models_list(ctx, as_json):
    """Show where each configured model is and whether it is ready."""
    from .models import describe

    rag = _pipeline(ctx)
    rows = {role: describe(getattr(rag.config.models, role), home=rag.config.home_path)
            for role in ("embedder", "generator")}
    if as_json:
        _echo_json(rows)
        return
    for role, info in rows.items():
        state = info["path"] if info["ready"] else f"not ready: {info['reason']}"
        click.echo(f"{role:9}  {info['ref']}\n           {state}")


@models.command("pull")
@click.argument("refs", nargs=-1)
@click.pass_context
@handles_errors
def models_pull(ctx, refs):
    """Download (and convert) the configured models, or REFS, into $RAG_HOME/models."""
    from .models import BUILTINS, resolve

    rag = _pipeline(ctx)
    if not refs:
        for role, path in rag.pull_models().items():
            click.echo(f"{role:9}  {path}")
        return
    for ref in refs:
        ref = ref if ":" in ref or ref.endswith(".gguf") or ref not in BUILTINS else f"builtin:{ref}"
        click.echo(f"{ref}  {resolve(ref, home=rag.config.home_path, log=lambda m: click.echo(m, err=True))}")


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
    with _pipeline(ctx) as rag:
        out = rag.plan(model, builtin_spec=builtin_spec, quant=quant, hardware=hardware, vram_gb=vram_gb,
                       ram_gb=ram_gb, n_ctx=n_ctx, kv=kv, n_batch=n_batch, n_ubatch=n_ubatch, compare=compare)
    best, fit = out["plan"], out["fit"]
    if as_json:
        data = {"plan": best.to_dict(), "llama_cpp_fit": fit.to_dict() if fit else None,
                "hardware": out["hardware"].to_dict()}
        if compare:
            data["compare"] = [r.to_dict() for r in out["compare"]]
        _echo_json(data)
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
        from .planner.plan import comparison_table

        click.echo("\n" + comparison_table(out["compare"]).rstrip())


@cli.command()
@click.option("--max-seconds", type=click.FloatRange(min=0), default=120, show_default=True,
              help="Time budget for the measurements.")
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

    with _pipeline(ctx) as rag:
        try:
            result, path = rag.tune(max_seconds=max_seconds, n_tokens=n_tokens,
                                    measure_hardware=measure_hardware, progress=progress)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
    if as_json:
        _echo_json({**result.to_dict(), "profile": str(path)})
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
    """Run the benchmarks (ingest, prefill, cache; or NAMES) and print one table."""
    from .dev import bench as bench_mod

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


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (keep 127.0.0.1 "
              "unless a token is set and the network is trusted).")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="TCP port.")
@click.option("--max-body", type=click.IntRange(min=1024), default=1 << 20, show_default=True,
              help="Largest request body in bytes.")
@store_options
@click.pass_context
@handles_errors
def serve(ctx, host, port, max_body, collection, store_path):
    """Serve the collection over HTTP: OpenAI-compatible /v1/chat/completions with sources,
    /search, /ingest, /status, /health. Set RAG_SERVE_TOKEN to require a bearer token.

    This process owns the store and the models; ingests posted to it run in its own
    writer while searches and answers go on.
    """
    import os

    from .serve import TOKEN_ENV, run

    token = os.environ.get(TOKEN_ENV) or None
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        click.echo(f"warning: listening on {host} without {TOKEN_ENV}: anyone who can reach it can use it",
                   err=True)
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        run(rag, host=host, port=port, token=token, max_body=max_body, log=lambda m: click.echo(m, err=True))


@cli.command("config")
@click.pass_context
@handles_errors
def show_config(ctx):
    """Print the effective settings as TOML."""
    from .config import to_toml

    click.echo(to_toml(_pipeline(ctx).config), nl=False)


def main() -> None:
    cli(prog_name="rag")
