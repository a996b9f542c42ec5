"""OpenAI-compatible servers behind the engine's contract (``models.generator/embedder = "openai:..."``).

:mod:`.client` (references, the HTTP client, dialects, retries), :mod:`.generator` and
:mod:`.embedder` (the :class:`~pipeline.engine.contract.TextGenerator` and
:class:`~pipeline.engine.contract.TextEmbedder` on servers), :mod:`.routing` (prefix-aware
routing over several servers).
"""
