"""GGUF files: what a model file says, read without loading it, and conversion into the format.

:mod:`.header` (a fast reader of the metadata and tensor table), :mod:`.info` (the model's
facts: architecture, layers and their kinds, attention shapes, context, chat template),
:mod:`.ggml` (ggml type sizes, KV cache types), :mod:`.convert` (sentence-transformers
BERT → GGUF).
"""
