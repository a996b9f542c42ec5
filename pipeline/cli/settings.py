"""What the commands run with: ``rag config`` (the effective settings) and ``rag models`` (list, pull)."""

from __future__ import annotations

import click

from .common import cli, echo_json, handles_errors, json_option, open_pipeline, printable


@cli.command("config")
@click.option("--reference", is_flag=True,
              help="Print every setting (type, default, RAG_* variable, meaning) as Markdown instead.")
@click.pass_context
@handles_errors
def show_config(ctx, reference):
    """Print the effective settings as TOML, with the home, store and cache paths resolved.

    Credentials in URLs (``user:pass@``, ``?token=``) are printed as ``***``. With --reference,
    the settings reference (docs/settings.md) instead: defaults, not the effective values."""
    if reference:
        from ..config.reference import reference_markdown

        click.echo(reference_markdown(), nl=False)
        return
    from ..config import to_toml
    from ..errors import redact

    text = to_toml(open_pipeline(ctx).config.resolved())
    shown = redact(text)
    if shown != text:
        shown = "# credentials in URLs are shown as ***\n" + shown
    click.echo(shown, nl=False)


@cli.group()
def models():
    """Show or provision the configured models."""


@models.command("list")
@json_option
@click.pass_context
@handles_errors
def models_list(ctx, as_json):
    """Show where each configured model is and whether it is ready, then every model in $RAG_HOME/models."""
    from ..models import available_builtins, describe, models_dir, present

    rag = open_pipeline(ctx)
    home = rag.config.home_path
    rows = {role: describe(getattr(rag.config.models, role), home=home) for role in ("embedder", "generator")}
    found = [{**m, "configured": [role for role, info in rows.items() if info["path"] == m["path"]]}
             for m in present(home)]
    if as_json:
        echo_json({**rows, "present": found, "available": available_builtins(home)})
        return
    for role, info in rows.items():
        state = (info["path"] or "an OpenAI-compatible server") if info["ready"] else f"not ready: {info['reason']}"
        click.echo(f"{role:9}  {info['ref']}\n           {printable(state)}")
    click.echo(f"\nin {printable(str(models_dir(home)))}:" if found else f"\nno models in {models_dir(home)}")
    width = max((len(m["ref"]) for m in found), default=0)
    for m in found:
        mark = f"  ({', '.join(m['configured'])})" if m["configured"] else ""
        click.echo(f"  {'*' if mark else ' '} {printable(m['ref']):{width}}  {m['bytes'] / 2**20:8,.1f} MiB{mark}")
    for ref in available_builtins(home):
        click.echo(f"    {ref}  (not provisioned: rag models pull {ref.removeprefix('builtin:')})")


@models.command("pull")
@click.argument("refs", nargs=-1)
@click.pass_context
@handles_errors
def models_pull(ctx, refs):
    """Download (and convert) the configured models, or REFS, into $RAG_HOME/models."""
    from ..models import BUILTINS, resolve

    rag = open_pipeline(ctx)
    if not refs:
        for role, path in rag.pull_models().items():
            click.echo(f"{role:9}  {path}")
        return
    for ref in refs:
        ref = ref if ":" in ref or ref.endswith(".gguf") or ref not in BUILTINS else f"builtin:{ref}"
        click.echo(f"{ref}  {resolve(ref, home=rag.config.home_path, log=lambda m: click.echo(m, err=True))}")
