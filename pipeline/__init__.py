"""Retrieval-augmented answers over long documents, built for the shortest time-to-first-token.

The public API::

    from pipeline import Pipeline
    with Pipeline.from_config() as rag:
        rag.ingest(["docs/"])
        for hit in rag.search("what does --n-cpu-moe do?"):
            print(hit.source, hit.page, hit.score)

Heavy modules (llama.cpp, Chroma) load only when first used: every name below is
imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Pipeline": "api", "CollectionStatus": "collection", "AskRequest": "ask.request",
    "Answer": "ask.answer", "AnswerStream": "ask.answer", "AskStats": "ask.answer",
    "AskOptions": "ask.request", "AsyncAnswerStream": "ask.aio", "CancelToken": "engine.context_lock",
    "PrefillProgress": "ask.progress",
    "Config": "config", "load_config": "config",
    "Hit": "records", "Passage": "records",
    "IngestReport": "ingest.run", "IngestEvent": "ingest.run", "FileOutcome": "ingest.run",
    "Summary": "summarize.outputs", "SummaryEvent": "summarize.outputs", "SummaryRun": "summarize.run",
    "WarmJob": "warm.job", "WarmProgress": "warm.progress",
    "EngineStats": "engine.contract", "TextEmbedder": "engine.contract", "TextGenerator": "engine.contract",
    "RagError": "errors", "ConfigError": "errors", "InputError": "errors", "ModelError": "errors",
    "StoreError": "errors", "StoreBusyError": "errors", "EngineError": "errors", "LoadError": "errors",
    "Cancelled": "errors", "EngineClosed": "errors",
}
__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from .ask.aio import AsyncAnswerStream
    from .ask.answer import Answer, AnswerStream, AskStats
    from .api import Pipeline
    from .collection import CollectionStatus
    from .config import Config, load_config
    from .engine.context_lock import CancelToken
    from .engine.contract import EngineStats, TextEmbedder, TextGenerator
    from .errors import (Cancelled, ConfigError, EngineClosed, EngineError, InputError, LoadError, ModelError,
                         RagError, StoreBusyError, StoreError)
    from .ingest.run import FileOutcome, IngestEvent, IngestReport
    from .ask.request import AskOptions, AskRequest
    from .ask.progress import PrefillProgress
    from .records import Hit, Passage
    from .summarize.run import SummaryRun
    from .summarize.outputs import Summary, SummaryEvent
    from .warm.job import WarmJob
    from .warm.progress import WarmProgress


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
