"""The one stable digest: a short hash of JSON-serialisable parts, the same in every process and version.

Content-addressed keys are made with it: a summarisation job's units and results
(:mod:`pipeline.summarize.job`). (A remote model's name keeps the older form of
:func:`pipeline.engine.remote.client.digest`: collections store it as the embedder's identity.)
"""

from __future__ import annotations

import hashlib
import json


def digest(*parts) -> str:
    """32 hex digits of SHA-256 over ``parts`` as canonical JSON (sorted keys, no spaces, UTF-8)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


__all__ = ["digest"]
