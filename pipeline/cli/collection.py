"""Building and keeping a collection: ``rag ingest``, ``rag warm``, ``rag cache``, ``rag status``, ``rag sections``, ``rag drop``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import ConfigError, InputError
from .common import (UserError, cli, display_path, echo_json, handles_errors, json_option, open_pipeline, printable,
                     store_options, store_overrides)


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
    and every section's KV state is saved, so that every question, the first included, is
    composed from them (`ingest.warm = "auto"`; `--no-warm` skips it, Ctrl-C stops it).
    """
    rag = open_pipeline(ctx, **store_overrides(collection, store_path))
    bar = IngestProgress(bar=sys.stderr.isatty())
    try:
        report = rag.ingest(paths, prune=prune, include=include, exclude=exclude,
                            follow_symlinks=follow_symlinks, progress=bar.event)
        bar.close()
        if not as_json:
            for f in report.notable_skips:
                click.echo(f"skipped: {display_path(f.path)}: {printable(f.reason)}", err=True)
            for f in report.failed:
                click.echo(f"failed: {display_path(f.path)}: {printable(f.reason)}", err=True)
            click.echo(report.summary())
        setting = rag.config.ingest.warm if warm is None else ("on" if warm else "off")
        warmed = (_warm(rag, quiet=as_json) if setting == "on" else
                  _warm_auto(rag, quiet=as_json) if setting == "auto" else None)
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
    if strict and report.failed:
        ctx.exit(1)


def _warm(rag, *, quiet: bool, purpose: str = "ask") -> dict:
    def show(prefix: str, outcome: str) -> None:
        if not quiet:
            click.echo(f"warm: {display_path(prefix)}: {outcome}", err=True)

    report = rag.warm(progress=show, purpose=purpose)
    if not quiet and "section_states" in report:
        _say_sections(report["section_states"])
    elif not quiet:
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
@click.option("--sections", is_flag=True,
              help="Save every section's own state, for prompts composed from them, and calibrate composition "
                   "(ask.compose = auto): for collections larger than the context.")
@json_option
@click.pass_context
@handles_errors
def warm(ctx, collection, store_path, purpose, sections, as_json):
    """Prefill and save the prompt prefixes the next questions will hit, so the first one is fast too.

    The whole collection's prefix when it fits the context (what `rag ask` packs then; with
    `--for summarize`, each document's own prefix, what its summaries start from), else each
    document's leading sections. With `--sections`, every section once, on its own: any
    question's prompt is then composed from those states; with `ask.compose = "auto"` (the
    default) composition is also calibrated on one prompt of the collection's own sections.
    """
    overrides = store_overrides(collection, store_path)
    with open_pipeline(ctx, **overrides) as rag:
        report = _warm_sections(rag, quiet=as_json) if sections else _warm(rag, quiet=as_json, purpose=purpose)
    if as_json:
        echo_json(report)


def _warm_auto(rag, *, quiet: bool) -> dict:
    """``ingest.warm = "auto"``: section states where the collection is larger than the context."""
    import time

    last = time.monotonic()

    def lines(progress):
        def every(done: int, total: int) -> None:  # off a terminal: a line every 10 s, as embedding does
            nonlocal last
            if progress is not None:
                progress(done, total)
            elif not quiet and time.monotonic() - last >= IngestProgress.every:
                last = time.monotonic()
                click.echo(f"section states: {done:,} of {total:,} tokens (Ctrl-C or `--no-warm` skips this)",
                           err=True)
        return rag.warm_auto(progress=every)

    try:
        report = _counted(lines, label="section states", quiet=quiet)
    except KeyboardInterrupt:  # the ingest is complete: Ctrl-C skips only what comes after it
        reason = ("interrupted: the documents are ingested; the states saved so far are kept, and `rag warm "
                  "--sections` (or the next `rag ingest`) saves the rest")
        if not quiet:
            click.echo(f"\nsection states {reason}", err=True)
        return {"warmed": False, "reason": reason}
    if not quiet and report["warmed"]:
        _say_sections(report)
    elif not quiet and report.get("calibration"):  # measured, and over the budget: states would not be used
        _say_calibration(report["calibration"])
    elif not quiet and (report.get("failed") or "cache.max_gb" in report["reason"]):
        click.echo(f"note: {printable(report['reason'])}", err=True)
    return report


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


def _warm_sections(rag, *, quiet: bool) -> dict:
    report = _counted(rag.warm_sections, label="section states", quiet=quiet)
    if not quiet:
        _say_sections(report)
    return report


def _say_sections(report: dict) -> None:
    click.echo(f"warmed {report['sections']} sections of {report['documents']} documents "
               f"({report['tokens']:,} tokens): {report['saved']} saved, {report['cached']} already saved"
               f"{f', {n} not saved' if (n := report.get('not_saved')) else ''}; "
               f"{report['prefilled_tokens']:,} tokens prefilled in {report['seconds']:.1f} s, "
               f"{report['bytes_written'] / 1e6:,.1f} MB of states written")
    _say_calibration(report.get("calibration"))
    for note in report["notes"]:
        click.echo(f"note: {printable(note)}", err=True)


def _say_calibration(c: dict | None) -> None:
    if c:
        verdict = "questions are composed" if c["allowed"] else "over ask.compose_max_kl: questions stay exact"
        click.echo(f"composition calibrated: mean KL {c['kl']:.4f} nats (budget {c['budget']}), top-1 "
                   f"{c['top1']:.1%} over {c['tokens']} tokens: {verdict}")


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
    if c["kl"] is None:
        tail = "composing" if c["allowed"] else "not calibrated yet (measured after the first answer over sections)"
        return f"{head}, {c['model']}: {tail}"
    verdict = "composing" if c["allowed"] else "exact (over the budget)"
    return (f"{head}, {printable(str(c['model']))}: mean KL {c['kl']:.4f} nats (budget {c['budget']}), top-1 "
            f"{c['top1']:.1%} over {c['tokens']} tokens, seams {c['seams']}: {verdict}")


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
