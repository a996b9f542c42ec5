"""The prefix cache's key scheme: namespaces, and chain hashes of token blocks.

An entry belongs to a *namespace*: a hash of the model file's identity and of every
setting that changes the KV contents (see :func:`namespace` and
:func:`pipeline.models.file_identity`); states are only ever looked up within one
namespace. Within it, an entry is keyed by the hash of its tokens, so a changed
document changes the tokens and its old states are simply never found again (never
used again, they are the first evicted: :mod:`.budget`).

Token lists are chain-hashed in blocks of :data:`BLOCK` tokens
(``h_k = sha256(h_{k-1} || block_k as little-endian int32)``). An entry of ``n``
tokens is indexed under ``h_{n // BLOCK}`` (:data:`SHORT_BLOCK_HASH` when ``n <
BLOCK``) and stores ``full_hash = sha256(all n tokens)``: a lookup computes the
chain hashes of its query once and finds every candidate with one indexed query
(:mod:`.index`), then checks candidates' ``full_hash`` against its own prefix
of that length, longest first. Its cost grows with the query's length, not with
the number of entries.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from typing import Any, Sequence

BLOCK = 256
"""Tokens per block of the chain hash."""

FORMAT = 1
"""Version of the index schema and key scheme; part of every namespace."""

SHORT_BLOCK_HASH = hashlib.sha256(b"rag prefix cache: fewer than one block").hexdigest()
"""The ``block_hash`` of entries shorter than one block."""

_CHAIN_SEED = hashlib.sha256(b"rag prefix cache: chain seed").digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as little-endian int32, the form every hash here is computed on."""
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - no such platform in use
        arr = array("l", tokens)
    if sys.byteorder != "little":  # pragma: no cover
        arr.byteswap()
    return arr.tobytes()


def chain_hashes(data: bytes | memoryview, block: int = BLOCK) -> list[str]:
    """Hex chain hashes ``h_1..h_m`` of the ``m`` full blocks of ``data`` (from :func:`token_bytes`)."""
    view = memoryview(data)
    step = 4 * block
    out: list[str] = []
    h = _CHAIN_SEED
    for k in range(len(view) // step):
        h = hashlib.sha256(h + view[k * step:(k + 1) * step]).digest()
        out.append(h.hex())
    return out


def block_hash(n_tokens: int, chain: Sequence[str], block: int = BLOCK) -> str:
    """The index key of an entry of ``n_tokens`` tokens whose chain hashes are ``chain``."""
    k = n_tokens // block
    return chain[k - 1] if k else SHORT_BLOCK_HASH


def full_hash(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def namespace(model_identity: str, **settings: Any) -> str:
    """The namespace of states made by one model with settings that change the KV contents.

    Pass every setting that changes what the KV cache holds, or how it is laid out:
    context length, K and V cache types, flash attention (it changes the V layout),
    RoPE scaling and frequency settings. Leave out what does not (where experts or
    layers live, threads, batch sizes). Values must be JSON types. The llama.cpp
    binding's version and this module's :data:`FORMAT` are added here, since the
    state format may change between builds.
    """
    payload = {"format": FORMAT, "block": BLOCK, "llama_cpp": _binding_version(),
               "model": model_identity, "settings": settings}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _binding_version() -> str:
    try:  # the installed distribution's metadata: no need to load llama.cpp for it
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        from .._llama import binding_version

        return binding_version()


__all__ = ["BLOCK", "FORMAT", "SHORT_BLOCK_HASH", "block_hash", "chain_hashes", "full_hash", "namespace",
           "token_bytes"]
