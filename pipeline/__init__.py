"""Retrieval-augmented answers over long documents, built for the shortest time-to-first-token.

The public API::

    from pipeline import Pipeline
    with Pipeline.from_config() as rag:
        rag.ingest(["docs/"])
        for hit in rag.search("what does --n-cpu-moe do?"):
            print(hit.source, hit.page, hit.score)

Heavy modules (llama.cpp, Chroma) load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Pipeline", "Config", "load_config", "RagError", "__version__"]

if TYPE_CHECKING:
    from .api import Pipeline
    from .config import Config, load_config
    from .errors import RagError


def __getattr__(name: str):
    if name == "Pipeline":
        from .api import Pipeline

        return Pipeline
    if name in ("Config", "load_config"):
        from . import config

        return getattr(config, name)
    if name == "RagError":
        from .errors import RagError

        return RagError
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
