"""Building and keeping a collection: ``rag ingest``, ``rag cache``, ``rag status``, ``rag sections``, ``rag drop``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import ConfigError, InputError
from .common import (UserError, cli, display_path, echo_json, handles_errors, json_option, open_pipeline, printable,
                     store_options, store_overrides)
from .warming import follow


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@store_options
@click.option("--prune", is_flag=True, help="Remove documents whose files disappeared from the given folders.")
@click.option("--strict", is_flag=True, help="Exit with status 1 if any file or folder could not be read "
              "(without it, only when every file failed).")
@click.option("--include", "include", multiple=True, metavar="GLOB",
              help="Only files matching GLOB (name, or path under the folder if it has a '/'); repeatable.")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB",
              help="Leave out files and folders matching GLOB; repeatable.")
@click.option("--follow-symlinks", is_flag=True, default=None,
              help="Also follow symlinks that leave the folder. [default: ingest.follow_symlinks]")
@click.option("--warm/--no-warm", default=None,
              help="Then prefill and save the states questions start from (see `rag warm`), or not. [default: "
                   "ingest.warm, \"auto\": section states where the collection is larger than the context]")
@json_option
@click.pass_context
@handles_errors
def ingest(ctx, paths, collection, store_path, prune, strict, include, exclude, follow_symlinks, warm,
           as_json):
    """Load, chunk, embed and store the documents under PATHS.

    PDF, Markdown, text and HTML files are indexed (also gzip-compressed, e.g. README.md.gz),
    and files whose name says nothing (README, NEWS) when their content is text; other files
    are skipped. Unchanged files are not embedded again; changed files replace their old chunks.

    Then, for a collection larger than the context, composition is calibrated on its own sections
    and the sections' KV states are saved (the most useful first, as many as the cache has room
    for), so that every question, the first included, is composed from them (`ingest.warm =
    "auto"`; `--no-warm` skips it, Ctrl-C stops it keeping what is saved).
    """
    rag = open_pipeline(ctx, **store_overrides(collection, store_path))
    bar = IngestProgress(bar=sys.stderr.isatty())
    warmed = None
    try:
        report = rag.ingest(paths, prune=prune, include=include, exclude=exclude,
                            follow_symlinks=follow_symlinks, progress=bar.event, warm=warm)
        bar.close()
        if not as_json:
            for f in report.notable_skips:
                click.echo(f"skipped: {display_path(f.path)}: {printable(f.reason)}", err=True)
            for f in report.failed:
                click.echo(f"failed: {display_path(f.path)}: {printable(f.reason)}", err=True)
            click.echo(report.summary())
        if report.warming is not None:
            warmed = follow(report.warming, quiet=as_json)
    finally:
        bar.close()
        rag.close()
    if as_json:
        data = report.to_dict()
        if warmed is not None:
            data["warm"] = warmed
        echo_json(data)
    if report.nothing_read:  # every file failed: say so, whatever the options
        click.echo(f"no file could be ingested: {len(report.failed)} failed", err=True)
        ctx.exit(1)
    if report.nothing_found:  # every file skipped: not one document
        click.echo(f"no document found: the {len(report.files)} file(s) under {', '.join(map(str, paths))} were "
                   "skipped (PDF, Markdown, text and HTML files are read)", err=True)
        ctx.exit(1)
    if strict and report.failed:
        ctx.exit(1)


def _counted(call, *, label: str, quiet: bool):
    """``call(progress=...)`` with a progress bar on a terminal's stderr, driven by the library's
    ``progress(done, total)`` callback; none when ``quiet`` or stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        return call(progress=None)
    bar = click.progressbar(length=1, label=label, file=sys.stderr, show_pos=True)

    def advance(done: int, total: int) -> None:
        bar.length = max(total, 1)
        bar.update(done - bar.pos)

    try:
        return call(progress=advance)
    finally:
        bar.render_finish()


@cli.group()
def cache():
    """Inspect or clear the prefix KV cache (saved prompt states)."""


def _prefix_cache(ctx):
    """The configured prefix cache (a context manager), or a user error when it is off."""
    rag = open_pipeline(ctx)
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
        echo_json(st)
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
            click.confirm(f"Delete every saved prefix state in {printable(str(cache.directory))}?", abort=True)
        n = cache.clear()
        _echo_notes(cache.take_notes())
    click.echo(f"deleted {n} cached prefix states")


def _echo_notes(notes: list[str]) -> None:
    for note in notes:
        click.echo(f"note: {note}", err=True)


class IngestProgress:
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
            detail += f" | {printable(Path(ev.path).name)} {ev.chunks:,}/{ev.file_chunks:,} chunks"
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


@cli.command()
@store_options
@json_option
@click.pass_context
@handles_errors
def status(ctx, collection, store_path, as_json):
    """Show what a collection holds (documents, chunks, store path), then what a bug report needs:
    versions, the llama.cpp build (instruction sets or CUDA architectures), the models with their
    sizes and the prefix cache's size and hits."""
    from ..engine.system_report import system_report

    with open_pipeline(ctx, **store_overrides(collection, store_path)) as rag:
        st = rag.status()
        composition = rag.calibration()
        report = system_report(rag.config)
    if as_json:
        echo_json({**st.to_dict(), "composition": composition, "system": report.to_dict()})
        return
    click.echo(f"store:       {printable(st.store)}")
    if not st.exists:
        others = f" (collections here: {', '.join(st.collections)})" if st.collections else ""
        click.echo(f"collection:  {st.collection} (does not exist yet{others})")
    else:
        _echo_collection(st)
    click.echo(_composition_line(composition))
    click.echo("\n" + _printable_lines(report.describe()))


def _composition_line(c: dict) -> str:
    """What ``ask.compose`` decides for the generator, and its calibration."""
    head = f"composition: {c['mode']}"
    if c["mode"] == "off":
        return head + " (prompts over sections are prefilled exactly)"
    model = printable(str(c["model"]))
    if c["kl"] is None:
        tail = ("composing" if c["allowed"] else
                "not calibrated yet (`rag ingest` measures it for a collection larger than the context)"
                if c.get("reason", "").startswith("composition is not calibrated") else
                f"exact ({printable(c.get('reason', ''))})")
        return f"{head}, {model}: {tail}"
    verdict = "composing" if c["allowed"] else "exact (over the budget)"
    spread = f", spread {c['kl_spread']:.4f}" if c.get("prompts", 1) > 1 else ""
    return (f"{head}, {model}: mean KL {c['kl']:.4f} nats over {c.get('prompts', 1)} prompt(s){spread} (budget "
            f"{c['budget']}), top-1 {c['top1']:.1%} over {c['tokens']} tokens, seams {c['seams']}: {verdict}")


def _printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.splitlines())


def _echo_collection(st) -> None:
    click.echo(f"collection:  {st.collection}")
    click.echo(f"documents:   {st.documents:,}")
    click.echo(f"chunks:      {st.chunks:,} ({st.tokens:,} tokens; chunk size {st.chunk_size}, overlap {st.chunk_overlap})")
    click.echo(f"embedder:    {st.embedder} ({st.dim} dimensions)")
    click.echo(f"generator:   {st.generator}")
    if len(st.collections) > 1:
        click.echo(f"collections: {', '.join(st.collections)}")
    for s in st.sources:
        pages = f", {s['pages']} pages" if s["pages"] else ""
        click.echo(f"  {display_path(s['source'])}  ({s['format']}{pages}, {s['chunks']} chunks)")


@cli.command()
@store_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@handles_errors
def drop(ctx, collection, store_path, yes):
    """Delete a collection (its vectors, chunks and lexical index)."""
    with open_pipeline(ctx, **store_overrides(collection, store_path)) as rag:
        name = rag.config.store.collection
        missing = InputError(f"collection '{name}' does not exist in {rag.config.store_path}")
        if not rag.status().exists:
            raise UserError(missing)
        if not yes:
            click.confirm(f"Delete the collection '{name}'?", abort=True)
        if not rag.drop():
            raise UserError(missing)
        click.echo(f"dropped collection '{name}'")


@cli.command()
@store_options
@click.option("--recut", is_flag=True,
              help="Cut again, from the stored chunks, every document whose sections have another size than "
                   "the settings' (nothing is embedded; prompts over them prefill again once).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0),
              help="Context length in tokens (engine.n_ctx) the default size is derived from, as `rag ask --ctx`.")
@json_option
@click.pass_context
@handles_errors
def sections(ctx, collection, store_path, recut, n_ctx, as_json):
    """Show how the collection's documents are cut into sections (the units prompts are packed from
    when the documents do not fit the context), against the size new documents get; --recut cuts
    the others again at that size."""
    with open_pipeline(ctx, **store_overrides(collection, store_path), **{"engine.n_ctx": n_ctx}) as rag:
        report = (_counted(rag.recut_sections, label="documents", quiet=as_json) if recut
                  else rag.sections())
    if as_json:
        echo_json(report.to_dict())
        return

    def count(n: int, what: str) -> str:
        return f"{n:,} {what}" + ("" if n == 1 else "s")

    click.echo(f"collection '{report.collection}': {count(report.documents, 'document')}, "
               f"{count(report.sections, 'section')}")
    for target, (docs, n) in sorted(report.by_target.items(), reverse=True):
        mark = "" if target == report.target else "  (another size than the settings')"
        click.echo(f"  cut at {target:,} tokens: {count(n, 'section')} in {count(docs, 'document')}{mark}")
    if report.uncut:
        click.echo(f"  not cut yet: {count(report.uncut, 'document')} (cut when first packed)")
    click.echo(f"new documents are cut at {report.target:,} tokens (chunking.section_tokens; 0 = from the context)")
    if recut:
        click.echo(f"cut {count(report.recut, 'document')} again" if report.recut else "nothing to cut again")
    elif report.stale:
        click.echo(f"`rag sections --recut` cuts the other {count(report.stale, 'document')} again "
                   f"at {report.target:,} tokens")
