"""The ``rag`` command: options map to keyword arguments of one :class:`pipeline.Pipeline` call.

No logic lives here beyond presentation: progress bars, tables, JSON, and
turning :class:`pipeline.errors.RagError` into a message and an exit status.

The commands, one module per concept: :mod:`.collection` (ingest, cache, status, sections,
drop), :mod:`.warming` (warm, and how warming shows), :mod:`.questions` (search, ask, eval,
serve), :mod:`.summarize`, :mod:`.tuning` (plan, tune, bench) and :mod:`.settings` (config, models); what they share (the root
group, the shared options, errors) is in :mod:`.common`.
"""

from __future__ import annotations

from . import collection, questions, settings, summarize, tuning, warming  # noqa: F401  (each adds its commands)
from .common import cli

__all__ = ["cli", "main"]


def main() -> None:
    cli(prog_name="rag")
