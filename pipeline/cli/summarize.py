"""``rag summarize``: batch summaries, resumable, with a progress bar and the job's status."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import (cli, display_path, echo_json, handles_errors, json_option, open_pipeline, store_options,
                     store_overrides)

#: The largest --prompt-file read (instructions are lines of text).
MAX_PROMPT_FILE = 1 << 20


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
            with open(prompt_file, "rb") as fh:
                raw = fh.read(MAX_PROMPT_FILE + 1)  # bounded: /dev/zero never ends
            if len(raw) > MAX_PROMPT_FILE:
                raise click.BadParameter(f"{prompt_file} is larger than {MAX_PROMPT_FILE // 1024} KiB",
                                         param_hint="--prompt-file")
            lines = raw.decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--prompt-file") from None
        from_file = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not from_file:
            raise click.BadParameter(f"{prompt_file} holds no instruction", param_hint="--prompt-file")
        prompts += from_file
    overrides = store_overrides(collection, store_path)
    overrides["engine.n_ctx"] = n_ctx
    with open_pipeline(ctx, **overrides) as rag:
        if show_status:
            st = rag.summary_status(list(paths) or None, prompts=prompts or None, max_tokens=max_tokens)
            echo_json(st) if as_json else _print_summary_status(st)
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
                    click.echo(f"failed: {display_path(s.source)}: {s.error}", err=True)
                elif not as_json and out_dir is None and jsonl is None:
                    bar.clear()
                    several = run.report is not None and run.report.prompts > 1
                    title = f"## {display_path(s.source)}" + (f" — prompt {s.prompt_index}" if several else "")
                    click.echo(f"{title} ({s.method_label})\n\n{s.text}\n")
        finally:
            bar.close()
    report = run.report
    if as_json:
        echo_json({**report.to_dict(), "summaries": [s.to_dict() for s in summaries]})
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
        click.echo(f"  {display_path(item['source'])}  prompt {item['prompt_index']}: {item['state']}{how}")
    for source in st.get("not_ingested", []):
        click.echo(f"  {display_path(source)}: not ingested")


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
