"""Generated models, prompts and shelves for the tests of composed prompts and section states.

* :func:`moe_path` / :func:`model`: a tiny generated attention-only MoE model (its text is noise, its KV
  arithmetic is real), loaded directly; :func:`random_prompt`, :func:`decode` and :func:`answer` build,
  prefill and continue prompts of random tokens cut into sections.
* :func:`moe`, :func:`shelf`, :func:`settings`, :func:`pipeline`, :func:`ingest`: the same kind of model
  behind the public API, over four manuals (:data:`TOPICS`) about three times the context, with the
  fakes' hash embedder (no provisioned model).

Import the fixtures into a test module with the helpers it uses (``# noqa: F401`` for the fixtures).
"""

from __future__ import annotations

import numpy as np
import pytest

from devtools.synthetic import write_moe_model
from pipeline import Pipeline
from pipeline.engine import _llama
from pipeline.engine._llama import composing as mem
from pipeline.engine.reuse.compose import Piece
from support.fakes import HashEmbedder

# -- a model loaded directly, prompts of random tokens ----------------------------------------------


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return write_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", n_ctx_train=8192)


@pytest.fixture
def model(moe_path):
    m = _llama.load(moe_path, n_ctx=2048, n_batch=256, n_ubatch=256, threads=1, n_seq_max=2)
    yield m
    m.close()


def _tokens(rng, n):
    return tuple(int(t) for t in rng.integers(3, 250, size=n))


def random_prompt(seed=0, sizes=(150, 300, 90, 200)):
    rng = np.random.default_rng(seed)
    head = list(_tokens(rng, 24))
    pieces = [Piece(_tokens(rng, n), headers=(0, 1, 2)) for n in sizes]
    return head, pieces, list(_tokens(rng, 12))


def decode(model, tokens, pos):
    for lo in range(0, len(tokens), model.n_batch):
        mem.decode_outputs(model, np.asarray(tokens[lo:lo + model.n_batch], np.int32), pos + lo)


def answer(model, question, end, n=12):
    """Logits after the question, and the greedy continuation."""
    decode(model, question, end)
    first = mem.output_logits(model, 1)[0]
    out, pos = [], end + len(question)
    for _ in range(n):
        t = int(mem.output_logits(model, 1)[0].argmax())
        out.append(t)
        mem.decode_outputs(model, [t], pos)
        pos += 1
    return first, out


# -- the same kind of model through the public API, over a shelf larger than the context --------------

TOPICS = [("a-pumps.md", "pump"), ("b-valves.md", "valve"), ("c-sensors.md", "sensor"), ("d-cables.md", "cable")]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return write_moe_model(tmp_path_factory.mktemp("moe") / "moe.gguf", n_ctx_train=8192)


@pytest.fixture
def shelf(tmp_path):
    """Four manuals of 24 numbered paragraphs: about three times the context below."""
    docs = tmp_path / "shelf"
    docs.mkdir()
    for name, topic in TOPICS:
        paras = [f"Paragraph {i} of the {topic} manual: the {topic} unit {i} reports level {i * 7} "
                 f"and code {topic[:3].upper()}-{i:03d}." for i in range(24)]
        (docs / name).write_text("\n\n".join(paras) + "\n")
    return docs


def settings(model, tmp_path, **kw):
    return {"models.generator": str(model), "engine.n_ctx": 2048, "engine.threads": 1, "ask.max_tokens": 6,
            "summarize.max_tokens": 6, "chunking.size": 64, "chunking.overlap": 8, "chunking.section_tokens": 128,
            "cache.path": str(tmp_path / "cache"), "ask.compose": "on", **kw}


def pipeline(model, tmp_path, **kw) -> Pipeline:
    return Pipeline.from_config(overrides=settings(model, tmp_path, **kw), embedder=HashEmbedder())


def ingest(model, tmp_path, docs) -> None:
    with pipeline(model, tmp_path) as rag:
        rag.ingest([docs])
