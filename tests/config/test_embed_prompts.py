"""Query and document prefixes of instruction-tuned embedders, on generated BERT models run by llama.cpp.

A random-weight BERT (``tests/support/tiny_bert.py``) converted by the product's converter carries the
name of its folder as ``general.name``: named like an e5 model it must get e5's prefixes, named
like nothing known it must get none, and explicit settings win over both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline import Pipeline
from pipeline.config import load_config
from pipeline.engine.embed_prompts import AUTO, Prompts, known_prompts, resolve
from pipeline.errors import StoreError
from support.tiny_bert import write_bert_gguf


@pytest.mark.parametrize("names, family, query, document", [
    (("multilingual-e5-small",), "e5", "query: ", "passage: "),
    (("E5 Base v2",), "e5", "query: ", "passage: "),
    (("nomic-embed-text-v1.5",), "nomic-embed", "search_query: ", "search_document: "),
    (("model", "", "nomic-bert"), "nomic-embed", "search_query: ", "search_document: "),  # by architecture
    (("bge-small-en-v1.5",), "bge", "Represent this sentence for searching relevant passages: ", ""),
    (("mxbai-embed-large-v1",), "mxbai-embed", "Represent this sentence for searching relevant passages: ", ""),
    (("Qwen3 Embedding 0.6B", "qwen3"), "qwen3-embedding",
     "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:", ""),
    (("all-MiniLM-L6-v2", "bert"), "", "", ""),
    (("bge-m3",), "", "", ""),  # trained without prefixes
    (("zebrae5x",), "", "", ""),  # "e5" inside a word is not e5
])
def test_known_families_get_their_own_prefixes(names, family, query, document):
    assert known_prompts(*names) == Prompts(query, document, family)


def test_settings_win_over_the_models_own():
    names = ("e5-small-v2",)
    assert resolve(AUTO, AUTO, names=names) == Prompts("query: ", "passage: ", "e5")
    assert resolve("", "", names=names) == Prompts("", "")
    assert resolve("q> ", AUTO, names=names) == Prompts("q> ", "passage: ", "e5")
    assert resolve(AUTO, AUTO, names=("tiny-bert",)) == Prompts()


def test_prefixes_are_settings_with_an_environment_override(tmp_path):
    c = load_config(environ={"RAG_MODELS_EMBEDDER_QUERY_PREFIX": "query: ",
                             "RAG_MODELS_EMBEDDER_DOCUMENT_PREFIX": ""})
    assert (c.models.embedder_query_prefix, c.models.embedder_document_prefix) == ("query: ", "")
    assert load_config().models.embedder_query_prefix == AUTO


# --- a generated BERT model through the pipeline ----------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("bert")
    return {"e5": write_bert_gguf(base / "e5.gguf", name="e5-small-tiny"),
            "plain": write_bert_gguf(base / "plain.gguf", name="tiny-bert")}


@pytest.fixture
def open_pipeline(tmp_path):
    made = []

    def make(model: Path, collection: str = "default", **more) -> Pipeline:
        rag = Pipeline.from_config(overrides={"models.embedder": str(model), "store.path": str(tmp_path / "store"),
                                              "store.collection": collection, "embed.threads": 1, **more})
        made.append(rag)
        return rag

    yield make
    for rag in made:
        rag.close()


@pytest.fixture
def docs(tmp_path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "animals.md").write_text("# Animals\n\nGiraffes sleep less than two hours a day.\n\n"
                                       "Zebras run fast and lions hunt at dusk.\n", encoding="utf-8")
    return folder


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, atol=1e-5))


def test_a_model_named_e5_embeds_queries_and_chunks_with_e5_prefixes(models, open_pipeline, docs):
    rag = open_pipeline(models["e5"])
    e = rag.embedder
    assert e.prompts == Prompts("query: ", "passage: ", "e5")
    inner = e.inner
    q = "how long do giraffes sleep"
    assert close(e.embed_query([q])[0], inner.embed(["query: " + q])[0])
    assert not close(e.embed_query([q])[0], inner.embed([q])[0])
    assert close(e.embed(["giraffes"])[0], inner.embed(["passage: giraffes"])[0])
    assert e.identity != inner.identity and e.identity.startswith(inner.identity)
    assert e.max_tokens == inner.max_tokens - len(inner.tokenize("passage: "))

    rag.ingest([docs])
    hit = rag.search(q, top_k=1)[0]
    with rag.store(create=False) as store:
        stored = store.vectors([hit.chunk_id])[hit.chunk_id]
    # The query went in with its prefix: the reported similarity is to the prefixed query's vector.
    assert hit.dense_similarity == pytest.approx(float(stored @ inner.embed(["query: " + q])[0]), abs=1e-3)


def test_the_document_prefix_changes_the_stored_vectors(models, open_pipeline, docs):
    with_prefix = open_pipeline(models["e5"], collection="auto")
    with_prefix.ingest([docs])
    explicit = open_pipeline(models["e5"], collection="explicit", **{"models.embedder_document_prefix": "passage: "})
    explicit.ingest([docs])
    without = open_pipeline(models["e5"], collection="bare", **{"models.embedder_document_prefix": ""})
    without.ingest([docs])

    def vectors(rag):
        with rag.store(create=False) as store:
            ids = [c.chunk_id for c in store.catalog.chunks(store.name, next(iter(store.documents())))]
            got = store.vectors(ids)
            return np.stack([got[i] for i in ids])

    assert close(vectors(with_prefix), vectors(explicit))
    assert not close(vectors(with_prefix), vectors(without))


def test_a_collection_refuses_an_embedder_with_another_document_prefix(models, open_pipeline, docs):
    open_pipeline(models["e5"]).ingest([docs])
    other = open_pipeline(models["e5"], **{"models.embedder_document_prefix": ""})
    with pytest.raises(StoreError, match="document prefix"):
        other.search("giraffes")


def test_an_unknown_model_gets_no_prefix_and_keeps_its_identity(models, open_pipeline, docs):
    rag = open_pipeline(models["plain"])
    e = rag.embedder
    assert e.prompts == Prompts()
    assert e.identity == e.inner.identity  # collections built before prefixes existed stay valid
    q = "giraffes sleep"
    assert close(e.embed_query([q])[0], e.inner.embed([q])[0])
    rag.ingest([docs])
    assert rag.search(q, top_k=1)[0].source.endswith("animals.md")
