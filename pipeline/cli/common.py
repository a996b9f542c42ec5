"""What every ``rag`` command shares: the root group, the shared options, the pipeline a command
calls, errors as a message and an exit status, and output that no file name can forge.
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

from ..errors import RagError


class UserError(click.ClickException):
    """A :class:`RagError` shown as ``Error: message`` (one line) with the error's exit status."""

    def __init__(self, err: RagError):
        super().__init__(printable(str(err)))
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


def open_pipeline(ctx: click.Context, **overrides: Any):
    """The pipeline a command calls: ``--config`` (or ``RAG_CONFIG``), the environment, then the command's
    ``overrides`` (dotted keys; None values are left out); warnings and progress notes go to stderr."""
    from ..api import Pipeline

    config_path = ctx.find_root().params.get("config_path")
    return Pipeline.from_config(config_path, overrides=overrides, log=lambda m: click.echo(printable(m), err=True))


def handles_errors(fn: Callable) -> Callable:
    """A :class:`RagError` becomes its message on stderr and its exit status; with ``--json``, also
    ``{"schema": 1, "error": {...}, "exit_code": N}`` on stdout (see :mod:`pipeline.schemas`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RagError as err:
            if kwargs.get("as_json"):
                echo_json({"error": {"message": str(err), "type": type(err).__name__}, "exit_code": err.exit_code})
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


def store_overrides(collection: str | None, store_path: Path | None) -> dict[str, Any]:
    """The settings ``--collection`` and ``--store`` override."""
    return {"store.collection": collection, "store.path": str(store_path) if store_path else None}


def echo_json(data: Any) -> None:
    """One JSON output; objects carry the schema version (see docs/app.md, JSON outputs)."""
    from ..schemas import versioned

    if isinstance(data, dict):
        data = versioned(data)
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def display_path(source: str) -> str:
    """A document's path for people: relative to the working directory where it lies below it, and
    quoted as a Python string literal when it holds characters that could forge output lines."""
    try:
        shown = str(Path(source).relative_to(Path.cwd()))
    except ValueError:
        shown = source
    return shown if shown.isprintable() else repr(shown)


def printable(text: str) -> str:
    """``text`` on one line: newlines, escape sequences and other non-printing characters escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _version(ctx: click.Context, _param, value: bool) -> None:
    """``rag --version``: this package's and llama-cpp-python's versions (llama.cpp is not loaded)."""
    if not value or ctx.resilient_parsing:
        return
    from ..engine.system_report import llama_cpp_python_version, rag_version

    click.echo(f"rag {rag_version()} (llama-cpp-python {llama_cpp_python_version()}, "
               f"Python {sys.version.split()[0]})")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version of rag and of llama-cpp-python, and exit.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              envvar="RAG_CONFIG", help="TOML settings file. [env: RAG_CONFIG]")
def cli(config_path: Path | None) -> None:
    """RAG over long documents with the shortest time-to-first-token.

    Settings come from the embedded defaults, a TOML file (--config), RAG_SECTION_KEY
    environment variables (e.g. RAG_STORE_COLLECTION), then the options of each command.
    """
