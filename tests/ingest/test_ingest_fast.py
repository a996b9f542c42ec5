"""Ingest and retrieval through the Python API with the fake embedder: real loaders, chunker, Chroma and
catalog, no model. The same behaviours on the real embedder are in ``test_ingest.py`` (slow)."""

from __future__ import annotations

import os
import time

import pytest
from support.fakes import HashEmbedder

from pipeline.errors import ConfigError, InputError, StoreError


def statuses(report):
    return {os.path.basename(f.path): f.status for f in report.files}


def test_ingest_indexes_every_supported_format_with_the_embedders_identity(fake_pipeline, corpus):
    embedder = HashEmbedder(dim=48)
    rag = fake_pipeline(embedder=embedder)
    report = rag.ingest([corpus])
    assert statuses(report) == {"guide.md": "new", "notes.txt": "new", "page.html": "new",
                                "manual.pdf": "new", "image.png": "skipped"}
    st = rag.status()
    assert st.documents == 4 and st.chunks == report.chunks == st.dense_chunks == embedder.embedded
    assert st.embedder == str(embedder.model_path) and st.dim == 48


def test_chunks_keep_source_page_offsets_and_hash(fake_pipeline, corpus):
    rag = fake_pipeline()
    rag.ingest([corpus])
    with rag.store() as store:
        pdf = store.documents()[str((corpus / "manual.pdf").resolve())]
        chunks = store.catalog.chunks(store.name, pdf.source)
        assert pdf.pages == 3 and [c.page for c in chunks] == [1, 2, 3]
        assert all(c.content_hash == pdf.content_hash for c in chunks)
        md = str((corpus / "guide.md").resolve())
        text = (corpus / "guide.md").read_text()
        assert all(text[c.start:c.end] == c.text for c in store.catalog.chunks(store.name, md))


def test_chunks_never_exceed_the_size_in_embedder_tokens(fake_pipeline, tmp_path):
    embedder = HashEmbedder(max_tokens=64)
    rag = fake_pipeline(embedder=embedder, chunking__size=48, chunking__overlap=8)
    doc = tmp_path / "long.txt"
    doc.write_text(" ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(300)))
    assert rag.ingest([doc]).chunks > 10
    with rag.store() as store:
        assert all(embedder.count_tokens(c.text) <= 48 for c in store.catalog.chunks(store.name, str(doc.resolve())))
    with pytest.raises(ConfigError, match="maximum of 64 tokens"):
        fake_pipeline(embedder=embedder, chunking__size=100, chunking__overlap=8,
                      store__collection="other").ingest([doc])


def test_unchanged_files_are_not_embedded_again(fake_pipeline, corpus):
    embedder = HashEmbedder()
    rag = fake_pipeline(embedder=embedder)
    rag.ingest([corpus])
    embedded = embedder.embedded
    os.utime(corpus / "notes.txt", ns=(time.time_ns(), time.time_ns() + 10_000_000_000))  # touched only
    again = rag.ingest([corpus])
    assert again.chunks == 0 and embedder.embedded == embedded
    assert set(statuses(again).values()) == {"unchanged", "skipped"} and "nothing to embed" in again.summary()


def test_a_changed_file_replaces_its_chunks_on_both_sides(fake_pipeline, corpus):
    rag = fake_pipeline()
    rag.ingest([corpus])
    before = rag.status().chunks
    (corpus / "notes.txt").write_text("Completely new content about the Zanzibar archipelago.\n")
    assert statuses(rag.ingest([corpus]))["notes.txt"] == "changed"
    st = rag.status()
    assert st.documents == 4 and st.chunks == st.dense_chunks == before
    assert rag.search("Zanzibar archipelago", top_k=3)[0].source.endswith("notes.txt")
    assert all("ERR_SOCKET_ZX81" not in h.text for h in rag.search("ERR_SOCKET_ZX81", top_k=10))


def test_removed_files_are_reported_then_pruned_only_under_the_given_folders(fake_pipeline, corpus, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.md").write_text("# Kept\n\nThis document lives in another folder.\n")
    rag = fake_pipeline()
    rag.ingest([corpus, other])
    (corpus / "guide.md").unlink()
    assert statuses(rag.ingest([corpus]))["guide.md"] == "missing" and rag.status().documents == 5
    assert statuses(rag.ingest([corpus], prune=True))["guide.md"] == "removed"
    st = rag.status()
    assert st.documents == 4 and st.chunks == st.dense_chunks
    assert all(not h.source.endswith("guide.md") for h in rag.search("n-cpu-moe expert tensors", top_k=10))


def test_unreadable_files_are_reported_and_the_rest_ingested(fake_pipeline, corpus):
    from support.pdfs import make_corrupt_pdf

    make_corrupt_pdf(corpus / "broken.pdf")
    (corpus / "empty.md").write_text("   \n")
    rag = fake_pipeline()
    report = rag.ingest([corpus])
    assert {os.path.basename(f.path) for f in report.failed} == {"broken.pdf", "empty.md"}
    assert rag.status().documents == 4


def test_a_missing_path_fails_before_anything_is_stored(fake_pipeline, corpus, tmp_store):
    with pytest.raises(InputError, match="does not exist"):
        fake_pipeline().ingest([corpus, corpus / "nope"])
    assert not tmp_store.exists()


def test_hybrid_search_fuses_both_sides_and_each_can_be_switched_off(fake_pipeline, corpus):
    rag = fake_pipeline()
    rag.ingest([corpus])
    exact = rag.search("ERR_SOCKET_ZX81", top_k=3)
    assert exact[0].source.endswith("notes.txt") and set(exact[0].found_by) == {"dense", "lexical"}
    scores = [h.score for h in rag.search("flash attention memory", top_k=5)]
    assert scores == sorted(scores, reverse=True)
    assert all(h.found_by == ("dense",) for h in fake_pipeline(retrieval__lexical=False).search("ERR_SOCKET_ZX81"))
    assert [h.found_by for h in fake_pipeline(retrieval__dense=False).search("ERR_SOCKET_ZX81")] == [("lexical",)]


def test_collections_are_separate_and_a_missing_one_is_named(fake_pipeline, corpus):
    a = fake_pipeline(store__collection="alpha")
    b = fake_pipeline(store__collection="beta")
    a.ingest([corpus / "notes.txt"])
    b.ingest([corpus / "guide.md"])
    assert {h.source for h in a.search("expert tensors CPU memory", top_k=5)} == {str((corpus / "notes.txt").resolve())}
    assert a.status().documents == 1 and b.status().documents == 1
    with pytest.raises(StoreError, match="collection 'papers' does not exist.*collections here: alpha, beta"):
        fake_pipeline(store__collection="papers").search("anything")


def test_a_collection_refuses_another_chunking_or_embedder(fake_pipeline, corpus):
    fake_pipeline().ingest([corpus])
    with pytest.raises(StoreError, match="chunked with size 256"):
        fake_pipeline(chunking__size=128).ingest([corpus])
    with pytest.raises(StoreError):
        fake_pipeline(embedder=HashEmbedder(dim=32)).ingest([corpus])
    assert fake_pipeline().status().chunks > 0  # nothing was lost


def test_mmr_trades_redundant_hits_for_diverse_ones(fake_pipeline, tmp_path):
    from pipeline.retrieval.search import search

    docs = tmp_path / "dup"
    docs.mkdir()
    for i in range(4):  # four copies of one passage, and one different passage on the same topic
        (docs / f"copy{i}.md").write_text("Flash attention lowers memory traffic during prompt processing.\n")
    (docs / "other.md").write_text("Large micro-batches amortise prompt processing copies of expert weights.\n")
    rag = fake_pipeline()
    rag.ingest([docs])
    with rag.store() as store:
        plain = search("prompt processing memory traffic", store=store, embedder=rag.embedder, top_k=2)
        diverse = search("prompt processing memory traffic", store=store, embedder=rag.embedder, top_k=2,
                         use_mmr=True, mmr_lambda=0.3)
    assert all("copy" in h.source for h in plain)
    assert {("copy" in h.source) for h in diverse} == {True, False}
