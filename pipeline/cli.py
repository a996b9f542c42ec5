"""The ``rag`` command: options map to keyword arguments of one :class:`pipeline.Pipeline` call.

No logic lives here beyond presentation: progress bars, tables, JSON, and
turning :class:`pipeline.errors.RagError` into a message and an exit status.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import click

from .errors import ConfigError, InputError, RagError


class UserError(click.ClickException):
    """A :class:`RagError` shown as ``Error: message`` (one line) with the error's exit status."""

    def __init__(self, err: RagError):
        super().__init__(_printable(str(err)))
        self.exit_code = err.exit_code


class QueryCommand(click.Command):
    """A command whose text argument may start with a dash (``rag search -- --n-cpu-moe``):
    an unknown option's error says how to pass such text."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            token = next((a for a in given if a.startswith(exc.option_name)), exc.option_name)
            what = next(p.human_readable_name for p in self.params if isinstance(p, click.Argument)).lower()
            exc.message += (f" A {what} that starts with a dash goes after --: "
                            f"{ctx.command_path} -- {shlex.quote(token)}")
            raise


class FiniteFloat(click.FloatRange):
    """A number within a range that is not NaN or infinite (``float()`` accepts both, and a NaN
    passes every range check)."""

    name = "number"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def _pipeline(ctx: click.Context, **overrides: Any):
    from .api import Pipeline

    config_path = ctx.find_root().params.get("config_path")
    return Pipeline.from_config(config_path, overrides=overrides, log=lambda m: click.echo(_printable(m), err=True))


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
    """One JSON output; objects carry the schema version (see docs/json.md)."""
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
@click.option("--strict", is_flag=True, help="Exit with status 1 if any file or folder could not be read.")
@click.option("--include", "include", multiple=True, metavar="GLOB",
              help="Only files matching GLOB (name, or path under the folder if it has a '/'); repeatable.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB",
              help="Leave out files and folders matching GLOB; repeatable.")
@click.option("--follow-symlinks", is_flag=True, default=None,
              help="Also follow symlinks that leave the folder. [default: ingest.follow_symlinks]")
@click.option("--warm", is_flag=True, help="Then prefill and save the prompt prefixes questions will hit (see `rag warm`).")
@json_option
@click.pass_context
@handles_errors
def ingest(ctx, paths, collection, store_path, prune, strict, include, exclude, follow_symlinks, warm,
           as_json):
    """Load, chunk, embed and store the documents under PATHS.

    PDF, Markdown, text and HTML files are indexed (also gzip-compressed, e.g. README.md.gz),
    and files whose name says nothing (README, NEWS) when their content is text; other files
    are skipped. Unchanged files are not embedded again; changed files replace their old chunks.
    """
    rag = _pipeline(ctx, **_store_overrides(collection, store_path))
    bar = _IngestProgress(bar=sys.stderr.isatty())
    try:
        report = rag.ingest(paths, prune=prune, include=include, exclude=exclude,
                            follow_symlinks=follow_symlinks, progress=bar.event)
        bar.close()
        if not as_json:
            for f in report.notable_skips:
                click.echo(f"skipped: {_display_path(f.path)}: {_printable(f.reason)}", err=True)
            for f in report.failed:
                click.echo(f"failed: {_display_path(f.path)}: {_printable(f.reason)}", err=True)
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


def _warm(rag, *, quiet: bool, purpose: str = "ask") -> dict:
    def show(prefix: str, outcome: str) -> None:
        if not quiet:
            click.echo(f"warm: {_display_path(prefix)}: {outcome}", err=True)

    report = rag.warm(progress=show, purpose=purpose)
    if not quiet:
        items = report["prefixes"]
        counts = {k: sum(1 for i in items if i["outcome"] == k) for k in ("saved", "cached", "too short", "too long")}
        spent = (f"{report['prefilled_tokens']:,} tokens prefilled, {report['bytes_written'] / 1e6:,.1f} MB of "
                 "states written")
        own = items[1:] if purpose == "all" else items  # each document's own prefix, in whole mode
        if report["mode"] == "whole":
            if purpose != "summarize":
                item = items[0]
                click.echo(f"warmed {item['prefix']}, {item['tokens']:,} tokens in one prefix: {item['outcome']}")
            if purpose != "ask":
                click.echo(f"warmed each document's own prefix (what `rag summarize` and `rag ask --doc` start "
                           f"from): {sum(i['outcome'] == 'saved' for i in own)} saved, "
                           f"{sum(i['outcome'] == 'cached' for i in own)} already cached, "
                           f"{sum(i['outcome'] == 'too short' for i in own)} too short to save")
            elif len(items) == 1 and items[0]["documents"] > 1:
                click.echo("summaries and `rag ask --doc` start from each document's own prefix: "
                           "`rag warm --for summarize` saves those too", err=True)
        else:
            click.echo(f"warmed the leading sections of {len(items)} documents (the collection does not fit the "
                       f"context whole): {counts['saved']} saved, {counts['cached']} already cached, "
                       f"{counts['too short']} too short to save, {counts['too long']} too long for the context")
        click.echo(spent)
    return report


@cli.command()
@store_options
@click.option("--for", "purpose", type=click.Choice(["ask", "summarize", "all"]), default="ask", show_default=True,
              help="When the collection fits whole: its one prefix (ask), each document's own prefix "
                   "(summarize, ask --doc), or both.")
@json_option
@click.pass_context
@handles_errors
def warm(ctx, collection, store_path, purpose, as_json):
    """Prefill and save the prompt prefixes the next questions will hit, so the first one is fast too.

    The whole collection's prefix when it fits the context (what `rag ask` packs then; with
    `--for summarize`, each document's own prefix, what its summaries start from), else each
    document's leading sections.
    """
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        report = _warm(rag, quiet=as_json, purpose=purpose)
    if as_json:
        _echo_json(report)


@cli.group()
def cache():
    """Inspect or clear the prefix KV cache (saved prompt states)."""


def _prefix_cache(ctx):
    """The configured prefix cache (a context manager), or a user error when it is off."""
    rag = _pipeline(ctx)
    if rag.prefix_cache is None:
        raise UserError(ConfigError("the prefix cache is off (cache.enabled = false)"))
    return rag.prefix_cache


@cache.command("stats")
@json_option
@click.pass_context
@handles_errors
def cache_stats(ctx, as_json):
    """Show entries, size, hits and bytes per token of the prefix cache."""
    with _prefix_cache(ctx) as cache:
        st = cache.stats()
        _echo_notes(cache.take_notes())
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
            click.confirm(f"Delete every saved prefix state in {_printable(str(cache.directory))}?", abort=True)
        n = cache.clear()
        _echo_notes(cache.take_notes())
    click.echo(f"deleted {n} cached prefix states")


def _echo_notes(notes: list[str]) -> None:
    for note in notes:
        click.echo(f"note: {note}", err=True)


class _IngestProgress:
    """Ingest progress on stderr, driven by the library's events, measured in bytes and tokens.

    On a terminal, a bar over the bytes to embed (so one long file moves it too). Otherwise
    (a pipe, a log, ``--json`` in a script) one line every ``every`` seconds, and nothing for a
    run shorter than that.
    """

    every = 10.0

    def __init__(self, *, bar: bool):
        self.use_bar = bar
        self.bar = None
        self.started = self.last = 0.0
        self.shown = 0

    def event(self, ev) -> None:
        import time

        if ev.kind == "plan":
            self.started = self.last = time.monotonic()
            if self.use_bar:
                self.bar = click.progressbar(length=max(1, ev.total_bytes), label="embedding",
                                             file=sys.stderr, show_percent=True, show_eta=True,
                                             item_show_func=lambda s: s)
                self.bar.__enter__()
            return
        detail = f"{ev.done_chunks:,} chunks, {ev.done_tokens:,} tokens"
        if ev.kind == "chunks":
            detail += f" | {_printable(Path(ev.path).name)} {ev.chunks:,}/{ev.file_chunks:,} chunks"
        if self.bar is not None:
            self.bar.current_item = detail
            self.bar.update(ev.done_bytes - self.shown)
            self.shown = ev.done_bytes
        elif not self.use_bar and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            elapsed = self.last - self.started
            share = ev.done_bytes / ev.total_bytes if ev.total_bytes else 0.0
            rate = f", {ev.done_tokens / elapsed:,.0f} tokens/s" if elapsed > 0 else ""
            size = (f"{ev.total_bytes / 2**20:,.1f} MB" if ev.total_bytes >= 2**20
                    else f"{ev.total_bytes / 1024:,.0f} KB")
            click.echo(f"embedding: {share:.0%} of {size}, {detail}{rate}", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@cli.command(cls=QueryCommand)
@click.argument("query")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Number of hits. [default: from config, 5]")
@click.option("--dense/--no-dense", default=None, help="Use the vector (dense) side.")
@click.option("--lexical/--no-lexical", default=None, help="Use the BM25 (lexical) side.")
@click.option("--rerank/--no-rerank", default=None, help="Rerank the fused candidates (retrieval.rerank).")
@click.option("--stats", "show_stats", is_flag=True, help="Print the time each retrieval stage took.")
@store_options
@json_option
@click.pass_context
@handles_errors
def search(ctx, query, top_k, dense, lexical, rerank, show_stats, collection, store_path, as_json):
    """Retrieve the chunks that best match QUERY (hybrid dense + BM25, reranked), without generating.

    A QUERY that starts with a dash goes after --: rag search -- --n-cpu-moe
    """
    overrides = _store_overrides(collection, store_path)
    overrides.update({"retrieval.dense": dense, "retrieval.lexical": lexical,
                      "retrieval.rerank": None if rerank is None else ("scores" if rerank else "none")})
    timings: dict[str, float] = {}
    with _pipeline(ctx, **overrides) as rag:
        hits = rag.search(query, top_k=top_k, timings=timings)
    if show_stats and not as_json:
        click.echo(_retrieval_line(timings), err=True)
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


def _retrieval_line(seconds: dict[str, float]) -> str:
    """One line of retrieval latency per stage, in milliseconds."""
    names = {"embed_query": "embed query", "dense": "dense", "lexical": "lexical", "fuse": "fuse",
             "rerank": "rerank"}
    parts = [f"{label} {seconds[key] * 1000:.1f} ms" for key, label in names.items() if key in seconds]
    return "retrieval: " + " | ".join(parts) + f" | total {sum(seconds.values()) * 1000:.1f} ms"


def _display_path(source: str) -> str:
    """A document's path for people: relative to the working directory where it lies below it, and
    quoted as a Python string literal when it holds characters that could forge output lines."""
    try:
        shown = str(Path(source).relative_to(Path.cwd()))
    except ValueError:
        shown = source
    return shown if shown.isprintable() else repr(shown)


def _printable(text: str) -> str:
    """``text`` on one line: newlines, escape sequences and other non-printing characters escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _indent(text: str, width: int = 600) -> str:
    text = _printable(" ".join(text.split()))
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0] + " …"
    return "    " + text


@cli.command(cls=QueryCommand)
@click.argument("question")
@click.option("--doc", "docs", multiple=True, type=click.Path(path_type=Path),
              help="Answer from this ingested document (repeatable).")
@click.option("--source", "sources", multiple=True, type=click.Path(path_type=Path),
              help="Answer from the documents under this folder or path (repeatable).")
@click.option("--mode", type=click.Choice(["auto", "passages"]),
              help="auto: whole documents when they fit, else fixed sections, so questions share a cached "
                   "prefix; passages: retrieved passages. [default: from config, auto]")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Passages to retrieve, or hits cited. [default: from config, 8]")
@click.option("--stats", "show_stats", is_flag=True, help="Print the engine's figures (prefill, TTFT, reuse, decode).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0), help="Context length in tokens (engine.n_ctx).")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Longest answer in tokens (ask.max_tokens).")
@click.option("--temperature", type=click.FloatRange(0, 5), help="Sampling temperature; 0 is greedy (ask.temperature).")
@click.option("--system", "system_prompt", help="System prompt for this question (ask.system_prompt).")
@click.option("--stop", multiple=True, help="End the answer at this text (repeatable; added to the template's stops).")
@click.option("--chat", "chat_id", help="Continue (or start) the conversation ID: a follow-up keeps the documents' "
              "cached prefix, earlier turns go after them.")
@store_options
@json_option
@click.pass_context
@handles_errors
def ask(ctx, question, docs, sources, mode, top_k, show_stats, n_ctx, max_tokens, temperature, system_prompt, stop,
        chat_id, collection, store_path, as_json):
    """Answer QUESTION from the collection, streaming the answer, then its sources.

    By default (auto) the prompt holds every document whole when they fit the context,
    else the fixed sections that best match the question, always in document order, so
    the next question reuses the prompt's prefix and prefills only itself. Pages are
    marked in the prompt; sources list the pages that matched best.
    A QUESTION that starts with a dash goes after --.
    """
    from .concurrency import iterate_interruptibly
    from .errors import Cancelled

    overrides = _store_overrides(collection, store_path)
    overrides.update({"engine.n_ctx": n_ctx, "ask.max_tokens": max_tokens})
    with _pipeline(ctx, **overrides) as rag:
        options = dict(doc=list(docs) or None, source=list(sources) or None, mode=mode, top_k=top_k,
                       temperature=temperature, system_prompt=system_prompt, stop=list(stop) or None,
                       progress=_PrefillLine() if not as_json and sys.stderr.isatty() else None)
        stream = rag.chat_stream(question, chat_id=chat_id, **options) if chat_id else \
            rag.ask_stream(question, **options)
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
            pages = _pages(src["pages"])
            click.echo(f"  [{src['n']}] {_display_path(src['source'])}{', ' + pages if pages else ''}")
    for note in answer.notes or []:
        click.echo(f"note: {_printable(note)}", err=True)
    if show_stats:
        st = answer.stats
        reuse = f"{st.cached_tokens:,} reused, cache: {st.cache}"
        packed = f"mode {st.mode}" + (f" ({len(st.sections)} sections)" if st.sections else "")
        click.echo(
            f"\n{packed} | prompt {st.prompt_tokens:,} tokens ({reuse}) | "
            f"prefill {st.prefill_seconds:.2f} s at {st.prefill_tokens_per_second:,.0f} tok/s | "
            f"TTFT {st.ttft_seconds:.2f} s | decode {st.decode_tokens} tokens at "
            f"{st.decode_tokens_per_second:.1f} tok/s | model load {st.load_seconds:.2f} s", err=True)
        if answer.retrieval:
            click.echo(_retrieval_line(answer.retrieval), err=True)
        if st.reuse_lost:
            click.echo(f"reuse: {st.reuse_lost}", err=True)


class _PrefillLine:
    """Prefill progress on one stderr line, shown once a prefill has taken more than a second."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, p) -> None:
        if p.seconds < 1.0 and not self.shown:
            return
        self.shown = True
        click.echo("\r\033[K" + p.describe() + ("\n" if p.finished else ""), err=True, nl=False)


def _pages(pages: list[int]) -> str:
    """[3, 4, 5, 9] as "pages 3-5, 9"."""
    runs: list[list[int]] = []
    for p in pages:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return "" if not pages else ("page " if len(pages) == 1 else "pages ") + text


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
    click.echo(f"store:       {_printable(st.store)}")
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
        missing = InputError(f"collection '{name}' does not exist in {rag.config.store_path}")
        if not rag.status().exists:
            raise UserError(missing)
        if not yes:
            click.confirm(f"Delete the collection '{name}'?", abort=True)
        if not rag.drop():
            raise UserError(missing)
        click.echo(f"dropped collection '{name}'")


@cli.group()
def models():
    """Show or provision the configured models."""


@models.command("list")
@json_option
@click.pass_context
@handles_errors
def models_list(ctx, as_json):
    """Show where each configured model is and whether it is ready, then every model in $RAG_HOME/models."""
    from .models import available_builtins, describe, models_dir, present

    rag = _pipeline(ctx)
    home = rag.config.home_path
    rows = {role: describe(getattr(rag.config.models, role), home=home) for role in ("embedder", "generator")}
    found = [{**m, "configured": [role for role, info in rows.items() if info["path"] == m["path"]]}
             for m in present(home)]
    if as_json:
        _echo_json({**rows, "present": found, "available": available_builtins(home)})
        return
    for role, info in rows.items():
        state = (info["path"] or "an OpenAI-compatible server") if info["ready"] else f"not ready: {info['reason']}"
        click.echo(f"{role:9}  {info['ref']}\n           {_printable(state)}")
    click.echo(f"\nin {_printable(str(models_dir(home)))}:" if found else f"\nno models in {models_dir(home)}")
    width = max((len(m["ref"]) for m in found), default=0)
    for m in found:
        mark = f"  ({', '.join(m['configured'])})" if m["configured"] else ""
        click.echo(f"  {'*' if mark else ' '} {_printable(m['ref']):{width}}  {m['bytes'] / 2**20:8,.1f} MiB{mark}")
    for ref in available_builtins(home):
        click.echo(f"    {ref}  (not provisioned: rag models pull {ref.removeprefix('builtin:')})")


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
@click.option("--max-seconds", type=FiniteFloat(min=0), default=120, show_default=True,
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


@cli.command("eval")
@click.argument("questions", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-s", "--setting", "settings", multiple=True,
              type=click.Choice(["dense", "lexical", "hybrid", "hybrid+mmr", "hybrid+rerank"]),
              help="Retrieval setting to measure (repeatable). [default: dense, lexical, hybrid, hybrid+rerank]")
@click.option("--compare", "compare", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also run with this TOML config (repeatable); results side by side.")
@click.option("--answers", is_flag=True, help="Also answer each question and check the answer and its citations (slow).")
@click.option("--misses", is_flag=True, help="List the questions whose page is not in the top 5, per setting.")
@click.option("--template", "write_template", is_flag=True,
              help="Write a starter question set from the collection to QUESTIONS (or stdout) and stop.")
@click.option("--per-document", type=click.IntRange(min=1), default=5, show_default=True,
              help="Template lines per document.")
@store_options
@json_option
@click.pass_context
@handles_errors
def eval_(ctx, questions, settings, compare, answers, misses, write_template, per_document, collection,
          store_path, as_json):
    """Measure whether retrieval finds the page that holds each answer in QUESTIONS (JSONL).

    Prints recall@1/5/10, MRR, nDCG@10 and the median query latency per stage for each
    retrieval setting. Each line of QUESTIONS: {"question": ..., "source": "docs/manual.pdf",
    "pages": [12], "answer": "optional substring"}; for documents without pages, "evidence"
    (a phrase of the passage) instead of "pages". `--template` starts such a file.
    """
    from .api import Pipeline

    overrides = _store_overrides(collection, store_path)
    if write_template:
        with _pipeline(ctx, **overrides) as rag:
            lines = rag.eval_template(per_document=per_document)
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        if questions is None:
            click.echo(text, nl=False)
        else:
            if questions.exists():
                raise click.ClickException(f"{questions} exists; not overwriting it")
            questions.write_text(text, encoding="utf-8")
            click.echo(f"wrote {len(lines)} template lines to {questions}: write each question in your own "
                       "words, fill in 'answer' if you like, and delete lines you do not want", err=True)
        return
    if questions is None:
        raise click.UsageError("QUESTIONS is required (or use --template)")
    base = ctx.find_root().params.get("config_path")
    runs = [(str(base) if base else "current config", base, overrides)]
    runs += [(str(path), path, {}) for path in compare]
    reports = []
    for label, path, extra in runs:
        live = not as_json and sys.stderr.isatty()
        show = (lambda qid, n: click.echo(f"\r{label}: {n} questions", nl=False, err=True)) if live else None
        with Pipeline.from_config(path, overrides=extra, log=lambda m: click.echo(m, err=True)) as rag:
            reports.append(rag.evaluate(questions, settings=settings or None, answers=answers, label=label,
                                        progress=show))
        if live:
            click.echo(err=True)
    if as_json:
        data = [r.to_dict() for r in reports]
        _echo_json(data[0] if len(data) == 1 else data)
        return
    from .evaluate import table

    click.echo(table(reports))
    for r in reports:
        for u in r.unreachable:
            click.echo(f"warning: {r.label}: question {u['id']}: {u['reason']} (counted as a miss)", err=True)
        if misses:
            for s in r.settings:
                for q in s.misses():
                    top = ", ".join(f"{Path(t['source']).name} p{t['page']}" if t["page"] else Path(t["source"]).name
                                    for t in q["top"])
                    click.echo(f"miss@5 {r.label} / {s.name}: [{q['id']}] {q['question']} (rank {q['rank']}; top: {top})")
        if r.answers is not None:
            from .evaluate import answer_summary

            a = answer_summary(r.answers)
            click.echo(f"answers ({r.label}): {a['answer_contains_expected']}/{a['with_expected_answer']} contain the "
                       f"expected text; {a['cites_expected_page']}/{a['questions']} cite the expected page; "
                       f"{a['expected_page_in_prompt']}/{a['questions']} had it in the prompt")


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@store_options
@click.option("-p", "--prompt", "prompts", multiple=True,
              help="An instruction; repeat for several summaries per document. [default: summarize.prompt]")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Instructions from a file, one per line (blank lines and lines starting with # ignored).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write one Markdown file per document and prompt here (NAME.summary.md, or "
                   "NAME.summary-N.md with several prompts).")
@click.option("--jsonl", type=click.Path(dir_okay=False, path_type=Path),
              help="Write one JSON line per document and prompt to this file.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Longest summary in tokens (summarize.max_tokens).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0), help="Context length in tokens (engine.n_ctx).")
@click.option("--status", "show_status", is_flag=True, help="Show how far this job has got; run nothing.")
@click.option("--restart", is_flag=True, help="Discard this job's finished work and start it again.")
@json_option
@click.pass_context
@handles_errors
def summarize(ctx, paths, collection, store_path, prompts, prompt_file, out_dir, jsonl, max_tokens, n_ctx,
              show_status, restart, as_json):
    """Summarise the documents under PATHS (default: the whole collection), resumably.

    New or changed files are ingested first. A document that fits the context is
    summarised whole (the prefix of `rag ask --doc`, so a warmed document costs only the
    instruction); a longer one map-reduce over its sections. Finished work is kept in the
    store: run the same command again after an interruption and only the rest is done.
    Summaries go to stdout unless --out or --jsonl is given. Exit status 1 if any
    document could not be summarised.
    """
    prompts = list(prompts)
    if prompt_file is not None:
        try:
            lines = prompt_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--prompt-file") from None
        from_file = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not from_file:
            raise click.BadParameter(f"{prompt_file} holds no instruction", param_hint="--prompt-file")
        prompts += from_file
    overrides = _store_overrides(collection, store_path)
    overrides["engine.n_ctx"] = n_ctx
    with _pipeline(ctx, **overrides) as rag:
        if show_status:
            st = rag.summary_status(list(paths) or None, prompts=prompts or None, max_tokens=max_tokens)
            _echo_json(st) if as_json else _print_summary_status(st)
            return
        bar = _SummaryBar(enabled=not as_json and sys.stderr.isatty())
        run = rag.summarize(list(paths) or None, prompts=prompts or None, max_tokens=max_tokens, restart=restart,
                            out_dir=out_dir, jsonl=jsonl, progress=bar.event)
        summaries = []
        try:
            for s in run:
                summaries.append(s)
                if not s.ok and not as_json:
                    bar.clear()
                    click.echo(f"failed: {_display_path(s.source)}: {s.error}", err=True)
                elif not as_json and out_dir is None and jsonl is None:
                    bar.clear()
                    several = run.report is not None and run.report.prompts > 1
                    title = f"## {_display_path(s.source)}" + (f" — prompt {s.prompt_index}" if several else "")
                    click.echo(f"{title} ({s.method_label})\n\n{s.text}\n")
        finally:
            bar.close()
    report = run.report
    if as_json:
        _echo_json({**report.to_dict(), "summaries": [s.to_dict() for s in summaries]})
    else:
        click.echo(report.describe(), err=True)
    if report.failed:
        ctx.exit(1)


def _print_summary_status(st: dict) -> None:
    click.echo(f"job {st['job_id']} ({st['collection']}): {st['state']}, "
               f"{st['summaries_done']} of {st['summaries']} summaries done")
    for item in st["items"]:
        how = f" ({item['method']}" + (f", {item['sections']} sections)" if item["method"] == "map-reduce" else ")") \
            if item["method"] else (f" ({item['units_done']} units done)" if item["units_done"] else "")
        click.echo(f"  {_display_path(item['source'])}  prompt {item['prompt_index']}: {item['state']}{how}")
    for source in st.get("not_ingested", []):
        click.echo(f"  {_display_path(source)}: not ingested")


class _SummaryBar:
    """A progress bar on stderr (documents, tokens, ETA) driven by the library's summary events."""

    def __init__(self, *, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.label = ""

    def event(self, ev) -> None:
        if not self.enabled:
            return
        if ev.kind == "plan":
            self.bar = click.progressbar(length=max(ev.tokens, 1), label="summarizing", file=sys.stderr,
                                         show_eta=True, show_percent=True,
                                         item_show_func=lambda item: item)
            self.bar.__enter__()
            return
        if self.bar is None:
            return
        done = ev.documents_done
        self.bar.label = f"documents {done}/{ev.documents}, tokens {ev.tokens_done:,}/{ev.tokens:,}"
        self.bar.update(ev.tokens_done - self.bar.pos, ev.detail or Path(ev.source).name)

    def clear(self) -> None:
        if self.bar is not None:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (keep 127.0.0.1 unless a token is set and the network is trusted).")
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
        click.echo(f"warning: listening on {host} without {TOKEN_ENV}: anyone who can reach it can use it", err=True)
    with _pipeline(ctx, **_store_overrides(collection, store_path)) as rag:
        run(rag, host=host, port=port, token=token, max_body=max_body, log=lambda m: click.echo(m, err=True))


@cli.command("config")
@click.pass_context
@handles_errors
def show_config(ctx):
    """Print the effective settings as TOML, with the home, store and cache paths resolved.

    Credentials in URLs (``user:pass@``, ``?token=``) are printed as ``***``."""
    from .config import to_toml
    from .errors import redact

    text = to_toml(_pipeline(ctx).config.resolved())
    shown = redact(text)
    if shown != text:
        shown = "# credentials in URLs are shown as ***\n" + shown
    click.echo(shown, nl=False)


def main() -> None:
    cli(prog_name="rag")
