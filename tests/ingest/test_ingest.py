"""Ingest and search through the Python API, on real llama.cpp and real Chroma."""

from __future__ import annotations

import os
import time

import pytest

from pipeline.errors import ConfigError, InputError, StoreError

pytestmark = pytest.mark.slow  # the real default models (see conftest.py)


def statuses(report):
    return {os.path.basename(f.path): f.status for f in report.files}


def test_first_ingest_indexes_every_supported_format(make_pipeline, corpus):
    rag = make_pipeline()
    report = rag.ingest([corpus])
    assert statuses(report) == {"guide.md": "new", "notes.txt": "new", "page.html": "new",
                                "manual.pdf": "new", "image.png": "skipped"}
    assert report.chunks >= 4 and report.tokens > 0
    st = rag.status()
    assert st.exists and st.documents == 4 and st.chunks == report.chunks
    assert st.dense_chunks == st.chunks  # both sides agree
    assert st.embedder == "builtin:all-MiniLM-L6-v2" and st.dim == 384


def test_chunks_keep_source_page_offsets_and_hash(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    with rag.store() as store:
        docs = store.documents()
        pdf = docs[str((corpus / "manual.pdf").resolve())]
        assert pdf.pages == 3 and pdf.format == "pdf" and pdf.title == "Manual"
        chunks = store.catalog.chunks(store.name, pdf.source)
        assert [c.page for c in chunks] == [1, 2, 3]
        assert all(c.content_hash == pdf.content_hash for c in chunks)
        assert [c.index for c in chunks] == [0, 1, 2]
        md = docs[str((corpus / "guide.md").resolve())]
        text = (corpus / "guide.md").read_text()
        for c in store.catalog.chunks(store.name, md.source):
            assert c.page is None
            assert text[c.start:c.end] == c.text  # offsets point into the original text


def test_chunk_size_respects_tokens(make_pipeline, tmp_path):
    rag = make_pipeline(chunking__size=48, chunking__overlap=8)
    doc = tmp_path / "long.txt"
    doc.write_text(" ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(300)))
    report = rag.ingest([doc])
    assert report.chunks > 10
    with rag.store() as store:
        for c in store.catalog.chunks(store.name, str(doc.resolve())):
            assert rag.embedder.count_tokens(c.text) <= 48
            assert c.tokens <= 48


def test_chunk_size_above_embedder_maximum_is_refused(make_pipeline, corpus):
    rag = make_pipeline(chunking__size=600, chunking__overlap=10)
    with pytest.raises(ConfigError, match="maximum of 510 tokens"):
        rag.ingest([corpus])


def test_second_run_embeds_nothing(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    again = rag.ingest([corpus])
    assert again.chunks == 0
    assert set(statuses(again).values()) == {"unchanged", "skipped"}
    assert "nothing to embed" in again.summary()


def test_touched_but_identical_file_is_not_reembedded(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    path = corpus / "notes.txt"
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000_000))
    again = rag.ingest([corpus])
    assert again.chunks == 0 and statuses(again)["notes.txt"] == "unchanged"


def test_changed_file_replaces_its_chunks(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    before = rag.status().chunks
    (corpus / "notes.txt").write_text("Completely new content about the Zanzibar archipelago.\n")
    report = rag.ingest([corpus])
    assert statuses(report)["notes.txt"] == "changed"
    st = rag.status()
    assert st.documents == 4
    assert st.chunks == st.dense_chunks  # old chunks gone from both sides, no duplicates
    assert st.chunks == before  # one chunk replaced by one chunk
    hits = rag.search("Zanzibar archipelago", top_k=3)
    assert hits[0].source.endswith("notes.txt")
    assert all("ERR_SOCKET_ZX81" not in h.text for h in rag.search("ERR_SOCKET_ZX81", top_k=10))


def test_removed_file_is_reported_then_pruned(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    (corpus / "guide.md").unlink()
    report = rag.ingest([corpus])
    assert statuses(report)["guide.md"] == "missing"
    assert rag.status().documents == 4
    report = rag.ingest([corpus], prune=True)
    assert statuses(report)["guide.md"] == "removed"
    st = rag.status()
    assert st.documents == 3 and st.chunks == st.dense_chunks
    assert all(not h.source.endswith("guide.md") for h in rag.search("n-cpu-moe expert tensors", top_k=10))


def test_prune_only_touches_the_given_folders(make_pipeline, corpus, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.md").write_text("# Kept\n\nThis document lives in another folder.\n")
    rag = make_pipeline()
    rag.ingest([corpus, other])
    report = rag.ingest([corpus], prune=True)
    assert "removed" not in statuses(report).values()
    assert rag.status().documents == 5


def test_unreadable_files_are_reported_and_the_rest_ingested(make_pipeline, corpus):
    from support.pdfs import make_corrupt_pdf, make_encrypted_pdf

    make_corrupt_pdf(corpus / "broken.pdf")
    make_encrypted_pdf(corpus / "secret.pdf", ["Top secret text."], "hunter2")
    (corpus / "empty.md").write_text("   \n")
    (corpus / "blob.txt").write_bytes(bytes(range(256)) * 20)
    rag = make_pipeline()
    report = rag.ingest([corpus])
    reasons = {os.path.basename(f.path): f.reason for f in report.failed}
    assert set(reasons) == {"broken.pdf", "secret.pdf", "empty.md", "blob.txt"}
    assert "corrupt" in reasons["broken.pdf"]
    assert "encrypted" in reasons["secret.pdf"]
    assert "empty" in reasons["empty.md"]
    assert "binary" in reasons["blob.txt"]
    assert rag.status().documents == 4


def test_missing_path_fails_before_anything_is_stored(make_pipeline, corpus, store_dir):
    rag = make_pipeline()
    with pytest.raises(InputError, match="does not exist"):
        rag.ingest([corpus, corpus / "nope"])
    assert not store_dir.exists()


def test_hybrid_search_finds_exact_terms_and_paraphrases(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    exact = rag.search("ERR_SOCKET_ZX81", top_k=3)
    assert exact[0].source.endswith("notes.txt") and "lexical" in exact[0].found_by
    para = rag.search("which fruit is a good source of potassium?", top_k=3)
    assert para[0].source.endswith("manual.pdf") and para[0].page == 2
    assert "dense" in para[0].found_by
    scores = [h.score for h in rag.search("flash attention memory", top_k=5)]
    assert scores == sorted(scores, reverse=True)


def test_each_side_can_be_switched_off(make_pipeline, corpus):
    rag = make_pipeline()
    rag.ingest([corpus])
    dense_only = make_pipeline(retrieval__lexical=False).search("ERR_SOCKET_ZX81", top_k=5)
    assert dense_only and all(h.found_by == ("dense",) for h in dense_only)
    lexical_only = make_pipeline(retrieval__dense=False).search("ERR_SOCKET_ZX81", top_k=5)
    assert [h.found_by for h in lexical_only] == [("lexical",)]
    with pytest.raises(ConfigError):
        make_pipeline(retrieval__dense=False, retrieval__lexical=False)


def test_search_on_missing_collection_is_a_clear_error(make_pipeline, corpus):
    make_pipeline().ingest([corpus])
    with pytest.raises(StoreError, match="collection 'papers' does not exist.*collections here: default"):
        make_pipeline(store__collection="papers").search("anything")


def test_collections_are_separate(make_pipeline, corpus, tmp_path):
    a = make_pipeline(store__collection="alpha")
    b = make_pipeline(store__collection="beta")
    a.ingest([corpus / "notes.txt"])
    b.ingest([corpus / "guide.md"])
    assert [h.source for h in a.search("expert tensors CPU memory", top_k=5)] == [
        str((corpus / "notes.txt").resolve())]
    assert a.status().documents == 1 and b.status().documents == 1


def test_changing_the_chunking_of_an_existing_collection_is_refused(make_pipeline, corpus):
    make_pipeline().ingest([corpus])
    with pytest.raises(StoreError, match="chunked with size 256"):
        make_pipeline(chunking__size=128).ingest([corpus])
    assert make_pipeline().status().chunks > 0  # nothing was lost


def test_mmr_trades_redundant_hits_for_diverse_ones(make_pipeline, tmp_path):
    from pipeline.retrieval.search import search

    docs = tmp_path / "dup"
    docs.mkdir()
    for i in range(4):  # four copies of one passage, and one different passage on the same topic
        (docs / f"copy{i}.md").write_text("Flash attention lowers memory traffic during prompt processing.\n")
    (docs / "other.md").write_text("Large micro-batches amortise the copies of expert weights to the GPU.\n")
    rag = make_pipeline()
    rag.ingest([docs])
    with rag.store() as store:
        plain = search("prompt processing speed", store=store, embedder=rag.embedder, top_k=2)
        diverse = search("prompt processing speed", store=store, embedder=rag.embedder, top_k=2,
                         use_mmr=True, mmr_lambda=0.3)
    assert all("copy" in h.source for h in plain)
    assert {("copy" in h.source) for h in diverse} == {True, False}


def test_ask_on_an_empty_collection_says_so(make_pipeline, tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "only.md").write_text("# Only\n\nA single short document.\n")
    rag = make_pipeline()
    rag.ingest([folder])
    (folder / "only.md").unlink()
    assert rag.ingest([folder], prune=True).count("removed") == 1
    with pytest.raises(StoreError, match="is empty"):
        make_pipeline(engine__n_ctx=512).ask("anything")
