"""An embedder on OpenAI-compatible servers (``models.embedder = "openai:..."``).

It fulfils :class:`~pipeline.engine.contract.TextEmbedder`: chunk sizes are measured in
the server's own tokens (its tokenize endpoint), vectors come from ``/v1/embeddings``
and are L2-normalised here. Requests are retried like the generator's
(:class:`.remote.Retry`), across the listed servers in order. An encoder run by
llama.cpp must see each input in one micro-batch, so the server has to run with
``n_ctx = n_batch = n_ubatch`` of at least ``remote.embed_max_tokens + 2``
(``--n_ctx 512 --n_batch 512 --n_ubatch 512`` for MiniLM); no longer input is sent.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from ..contract import EmbedderBase
from .client import RemoteRef, Retry, Server, TokenText, api_key, digest, expect, expect_tokens, not_the_api
from ...errors import EngineError, redact

_BATCH = 32  # inputs per request
_PROBE = "The quick brown fox jumps over the lazy dog."


class RemoteEmbedder(EmbedderBase):
    def __init__(self, ref: RemoteRef, remote):
        self.ref = ref
        self.remote = remote
        key = api_key(remote.api_key_env)
        self.servers = [Server(u, connect_timeout=remote.connect_timeout, read_timeout=remote.read_timeout,
                               api_key=key) for u in ref.urls]
        self.retry = Retry(max_wait=remote.max_wait)
        self.texts = TokenText()
        self.model_path = Path(ref.model or "openai-embedder")

    @cached_property
    def _dialect(self) -> str:
        return self.retry.run(lambda s: s.dialect, self.servers, what="connecting to the embedder server")

    def _tokenize_raw(self, text: str) -> list[int]:
        def call(server: Server) -> list[int]:
            if self._dialect == "llama-server":
                return expect_tokens(server.post_json("/tokenize", {"content": text, "add_special": True}, root=True),
                                     url=server.url, path="/tokenize")
            body = {"input": text, **({"model": self.ref.model} if self.ref.model else {})}
            return expect_tokens(server.post_json("/extras/tokenize", body, root=True), url=server.url,
                                 path="/extras/tokenize")

        return self.retry.run(call, self.servers, what="tokenizing on the embedder server")

    @cached_property
    def _specials(self) -> tuple[list[int], list[int]]:
        """The tokens the server puts around every input ([CLS] and [SEP] for BERT)."""
        empty = self._tokenize_raw("")
        return (empty[:1], empty[1:]) if len(empty) >= 1 else ([], [])

    @property
    def max_tokens(self) -> int:
        return self.remote.embed_max_tokens

    def tokenize(self, text: str) -> list[int]:
        tokens = self._tokenize_raw(text)
        head, tail = self._specials
        if head and tokens[:len(head)] == head:
            tokens = tokens[len(head):]
        if tail and tokens[-len(tail):] == tail:
            tokens = tokens[:-len(tail)]
        return tokens

    def sequence(self, text: str) -> list[int]:
        head, tail = self._specials
        content = self.tokenize(text)
        if len(content) > self.max_tokens:
            content = content[: self.max_tokens]
        else:
            self.texts.remember(content, text)
        return head + content + tail

    def _inputs(self, seqs: Sequence[Sequence[int]]) -> list:
        head, tail = self._specials
        if self._dialect == "llama-server":
            return [list(s) for s in seqs]
        out = []
        for seq in seqs:
            content = list(seq[len(head):len(seq) - len(tail)] if tail else seq[len(head):])
            text = self.texts.text(content)
            if text is None:  # a cut input: its text from the server (no control tokens in the content)
                text = self.retry.run(lambda s: expect(s.post_json("/extras/detokenize", {"tokens": content},
                                                                   root=True), "text", str, url=s.url,
                                                       path="/extras/detokenize"),
                                      self.servers, what="detokenizing on the embedder server")
            out.append(text)
        return out

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        rows: list[np.ndarray] = []
        for lo in range(0, len(seqs), _BATCH):
            inputs = self._inputs(seqs[lo:lo + _BATCH])
            body = {"input": inputs, **({"model": self.ref.model} if self.ref.model else {})}
            data = self.retry.run(lambda s: (s.url, s.post_json("/embeddings", body)), self.servers,
                                  what="embedding on the server")
            items = _vectors(*data)
            if len(items) != len(inputs):
                raise EngineError(f"the embedder server returned {len(items)} vectors for {len(inputs)} inputs")
            for vec in items:
                if vec.ndim != 1:
                    raise EngineError("the embedder server returned per-token vectors, not one per input: "
                                      "start it with mean pooling (an embedding model, --embedding true)")
                rows.append(vec)
        if not rows:
            return np.empty((0, self.dim), dtype=np.float32)
        out = np.vstack(rows)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    @cached_property
    def _probe(self) -> np.ndarray:
        return self.embed([_PROBE])[0]

    @property
    def dim(self) -> int:
        return int(self._probe.shape[0])

    @cached_property
    def identity(self) -> str:
        """The model by what it computes: its name and its vector for a fixed text (rounded), so the same
        model on another server (or URL) is the same embedder, and another model is not."""
        probe = [round(float(x), 3) for x in self._probe[:32]]
        return "openai-" + digest(self.ref.model, self.dim, probe)

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __repr__(self) -> str:
        return f"RemoteEmbedder({', '.join(redact(u) for u in self.ref.urls)})"


def _vectors(url: str, data: dict) -> list[np.ndarray]:
    """The vectors of an ``/embeddings`` answer, in input order; an answer of another shape (vectors that
    are not lists of finite numbers) is :func:`~.client.not_the_api`."""
    items = expect(data, "data", list, url=url, path="/embeddings")
    if not all(isinstance(d, dict) and isinstance(d.get("embedding"), list)
               and isinstance(d.get("index", 0), int) for d in items):
        raise not_the_api(url, "/embeddings", "'data' holds something other than embeddings")
    out = []
    for item in sorted(items, key=lambda d: d.get("index", 0)):
        try:
            vec = np.asarray(item["embedding"], dtype=np.float32)
        except (TypeError, ValueError):
            vec = None
        if vec is None or vec.size == 0 or vec.dtype != np.float32 or not np.isfinite(vec).all():
            raise not_the_api(url, "/embeddings", "an embedding that is not a list of finite numbers")
        out.append(vec)
    return out


def remote_embedder(ref: str, remote) -> RemoteEmbedder:
    """The embedder an ``openai:`` reference names."""
    return RemoteEmbedder(RemoteRef.parse(ref), remote)


__all__ = ["RemoteEmbedder", "remote_embedder"]
