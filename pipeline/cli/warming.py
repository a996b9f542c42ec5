"""``rag warm``, and how warming shows: its progress from the first second, in tokens with the time left,
and what it saved, left or measured."""

from __future__ import annotations

import sys
import time

import click

from .common import cli, display_path, echo_json, handles_errors, json_option, open_pipeline, printable, \
    store_options, store_overrides


class WarmLine:
    """Warming's progress on stderr: on a terminal one line kept up to date (stage, tokens done of the total,
    rate, time left); elsewhere (a pipe, a log) a line at each new stage and every ``every`` seconds.
    Nothing with ``quiet``."""

    every = 10.0

    def __init__(self, *, quiet: bool, label: str = "warming"):
        self.quiet, self.label = quiet, label
        self.tty = sys.stderr.isatty()
        self.stage, self.last, self.width = "", 0.0, 0

    def show(self, p) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        new_stage = p.stage != self.stage
        if not self.tty and not new_stage and now - self.last < self.every:
            return
        self.stage, self.last = p.stage, now
        text = f"{self.label}: {p.stage}"
        if p.total:
            text += f": {p.done:,} of {p.total:,} {p.unit}"
            eta = p.eta
            if p.rate and eta is not None:
                text += f", {p.rate:,.0f} {p.unit}/s, about {_duration(eta)} left"
        if self.tty:
            click.echo("\r" + text.ljust(self.width), err=True, nl=False)
            self.width = len(text)
        else:
            click.echo(text + " (Ctrl-C stops it; what is saved is kept)", err=True)

    def close(self) -> None:
        if self.tty and self.width and not self.quiet:
            click.echo("", err=True)
        self.width = 0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def follow(job, *, quiet: bool) -> dict:
    """Wait for a warming started by an ingest (a :class:`~pipeline.warm.job.WarmJob`), showing its progress;
    Ctrl-C cancels it, keeping what it saved, and says how to go on. Its report."""
    line = WarmLine(quiet=quiet, label="section states" if job.setting == "auto" else "warming")
    try:
        report = job.wait(on_progress=line.show)
    except KeyboardInterrupt:
        job.cancel()
        line.close()
        if not quiet:
            click.echo("stopping: the documents are ingested; the states saved so far are kept ...", err=True)
        report = {**job.wait(), "interrupted": True}
    line.close()
    if not quiet:
        say(report)
    return report


def say(report: dict) -> None:
    """What a warming did, for people (on stdout; notes on stderr)."""
    states = report.get("section_states", report)
    if "prefixes" in report and report.get("mode") == "whole":
        _say_prefixes(report, purpose=report.get("purpose", "ask"))
    elif states.get("mode") == "sections" and "saved" in states:
        say_sections(states)
    elif report.get("cancelled"):
        click.echo(f"section states {report['reason']}", err=True)
    elif report.get("calibration"):  # measured, and over the budget: states would not be used
        say_calibration(report["calibration"])
    elif report.get("failed") or report.get("reason", "").startswith("the collection's sections"):
        click.echo(f"note: {printable(report['reason'])}", err=True)


def say_sections(report: dict) -> None:
    chosen = report.get("chosen", report["sections"])
    click.echo(f"section states: {chosen} of {report['sections']} sections of {report['documents']} documents "
               f"({report['tokens']:,} tokens): {report['saved']} saved now, {report['cached']} saved before"
               f"{f', {n} not saved' if (n := report.get('not_saved')) else ''}; "
               f"{report['prefilled_tokens']:,} tokens prefilled in {report['seconds']:.1f} s, "
               f"{report['bytes_written'] / 1e6:,.1f} MB written")
    if report.get("left"):
        click.echo(f"section states left for the questions that need them to compute: {report['left']} sections "
                   f"({report['left_tokens']:,} tokens): {report['left_reason']}", err=True)
    say_calibration(report.get("calibration"))
    for note in report.get("notes", []):
        click.echo(f"note: {printable(note)}", err=True)
    if report.get("interrupted") or report.get("cancelled"):
        click.echo("interrupted: the states saved so far are kept; `rag warm --sections` (or the next "
                   "`rag ingest`) saves the rest", err=True)


def say_calibration(c: dict | None) -> None:
    if c:
        verdict = "questions are composed" if c["allowed"] else "over ask.compose_max_kl: questions stay exact"
        spread = (f" (spread {c['kl_spread']:.4f} over {c['prompts']} prompts)" if c.get("prompts", 1) > 1
                  else " (one prompt)")
        click.echo(f"composition calibrated: mean KL {c['kl']:.4f} nats{spread}, budget {c['budget']}, top-1 "
                   f"{c['top1']:.1%} over {c['tokens']} tokens: {verdict}")


def _say_prefixes(report: dict, *, purpose: str) -> None:
    items = report["prefixes"]
    own = items[1:] if purpose == "all" else items  # each document's own prefix, in whole mode
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
    click.echo(f"{report['prefilled_tokens']:,} tokens prefilled, {report['bytes_written'] / 1e6:,.1f} MB of "
               "states written")


@cli.command()
@store_options
@click.option("--for", "purpose", type=click.Choice(["ask", "summarize", "all"]), default="ask", show_default=True,
              help="When the collection fits whole: its one prefix (ask), each document's own prefix "
                   "(summarize, ask --doc), or both.")
@click.option("--sections", is_flag=True,
              help="Save each section's own state, for prompts composed from them, calibrating composition "
                   "first (ask.compose = auto): for collections larger than the context.")
@json_option
@click.pass_context
@handles_errors
def warm(ctx, collection, store_path, purpose, sections, as_json):
    """Prefill and save the prompt states the next questions will start from, so the first one is fast too.

    The whole collection's prefix when it fits the context (what `rag ask` packs then; with
    `--for summarize`, each document's own prefix, what its summaries start from). A collection
    larger than the context gets each section's own state, any question's prompt then being composed
    from them: composition is calibrated first where it is not yet (`ask.compose = "auto"`), and the
    sections are saved most useful first within the room the cache has for them (`--sections` asks
    for that whatever the size). Ctrl-C stops it; what is saved is kept.
    """
    overrides = store_overrides(collection, store_path)
    with open_pipeline(ctx, **overrides) as rag:
        line = WarmLine(quiet=as_json, label="section states")

        def show(prefix: str, outcome: str) -> None:
            if not as_json:
                click.echo(f"warm: {display_path(prefix)}: {outcome}", err=True)

        try:
            report = (rag.warm_sections(progress=line.show) if sections
                      else rag.warm(progress=show, purpose=purpose, states_progress=line.show))
        finally:
            line.close()
    if as_json:
        echo_json(report)
    else:
        say(report)


__all__ = ["WarmLine", "follow", "say", "say_calibration", "say_sections"]
