"""``rag eval``: metrics checked by hand on toy rankings, question-file errors, and real runs."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import InputError
from pipeline.retrieval.evaluate import (Question, check_answer, load_questions, question_metrics, run,
                                         source_matches, targets_found)


def test_metrics_of_one_ranking_by_hand():
    # Two target pages (3 and 4): page 3 first at rank 2 (again at 4), page 4 at rank 5.
    found = [frozenset(), frozenset({3}), frozenset(), frozenset({3}), frozenset({4})]
    m = question_metrics(found, 2)
    assert m["rank"] == 2 and m["rr"] == 0.5
    assert m["recall@1"] == 0.0 and m["recall@5"] == 1.0 and m["recall@10"] == 1.0
    # DCG = 1/log2(3) + 1/log2(6) (the repeat of page 3 at rank 4 gains nothing); ideal = 1 + 1/log2(3)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(6)) / (1 + 1 / math.log2(3)))
    assert m["ndcg@10"] == pytest.approx(0.62405, abs=1e-5)  # 1.01778 / 1.63093


def test_metrics_when_nothing_or_everything_is_found():
    none = question_metrics([frozenset()] * 10, 1)
    assert none == {"rank": None, "rr": 0.0, "recall@1": 0.0, "recall@5": 0.0, "recall@10": 0.0, "ndcg@10": 0.0}
    top = question_metrics([frozenset({None})] + [frozenset()] * 9, 1)
    assert top["rank"] == 1 and top["rr"] == 1.0 and top["ndcg@10"] == 1.0 and top["recall@1"] == 1.0
    # found only at rank 7: in the top 10, not the top 5
    late = question_metrics([frozenset()] * 6 + [frozenset({None})], 1)
    assert (late["recall@5"], late["recall@10"], late["rr"]) == (0.0, 1.0, pytest.approx(1 / 7))
    assert late["ndcg@10"] == pytest.approx(1 / 3)  # 1 / log2(8)


def hit(source, page=None, text=""):
    return SimpleNamespace(source=source, page=page, text=text)


def test_run_averages_over_questions_by_hand():
    questions = [
        Question("q1", "docs/a.pdf", pages=(2,), id="1"),
        Question("q2", "b.md", evidence="The Exact  phrase", id="2"),
        Question("q3", "a.pdf", pages=(9,), id="3"),
    ]
    rankings = {
        "q1": [hit("/x/docs/a.pdf", 2), hit("/x/docs/a.pdf", 3)],  # rank 1
        "q2": [hit("/x/b.md", None, "other"), hit("/x/c.md", None, "the exact phrase"),
               hit("/x/b.md", None, "so the EXACT phrase is here")],  # rank 3 (c.md is the wrong source)
        "q3": [hit("/x/docs/a.pdf", 2)] * 10,  # never
    }
    report = run(questions, lambda q, setting: (rankings[q], {"lexical": 0.001}), settings=("lexical",))
    s = report.settings[0].summary()
    assert s["questions"] == 3
    assert s["mrr"] == pytest.approx((1 + 1 / 3 + 0) / 3, abs=1e-4)
    assert s["recall@1"] == pytest.approx(1 / 3, abs=1e-4)
    assert s["recall@5"] == s["recall@10"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["ndcg@10"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-4)  # 1/log2(4) = 0.5 for rank 3
    assert s["latency_ms"]["lexical"] == 1.0
    assert [q["id"] for q in report.settings[0].misses()] == ["3"]  # rank 3 is inside the top 5
    assert [q["id"] for q in report.settings[0].misses(k=1)] == ["2", "3"]


def test_sources_match_by_path_suffix_and_evidence_ignores_case_and_spacing():
    assert source_matches("samples/guide.pdf", "/home/u/samples/guide.pdf")
    assert source_matches("guide.pdf", "/home/u/samples/guide.pdf")
    assert not source_matches("ide.pdf", "/home/u/samples/guide.pdf")
    assert not source_matches("other/guide.pdf", "/home/u/samples/guide.pdf")
    q = Question("q", "n.txt", evidence="Keys  and\nvalues")
    assert targets_found(q, "/d/n.txt", None, "the KEYS and values of") == frozenset({None})
    assert targets_found(q, "/d/n.txt", None, "keys, values") == frozenset()


@pytest.mark.parametrize("line, message", [
    ('{"question": "q", "source": "a.pdf", "page": 3}', "unknown key(s) page"),
    ('{"question": "", "source": "a.pdf"}', "'question' must be a non-empty string"),
    ('{"question": "q"}', "'source' must name"),
    ('{"question": "q", "source": "a.pdf", "pages": [0]}', "page numbers from 1"),
    ('{"question": "q", "source": "a.pdf", "pages": ["3"]}', "page numbers from 1"),
    ('["q", "a.pdf"]', "must be a JSON object"),
    ('{"question": "q", "source": ', "not JSON"),
])
def test_bad_question_lines_name_the_line(tmp_path, line, message):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "fine", "source": "a.pdf", "pages": 2, "_note": "comment"}\n\n' + line + "\n")
    with pytest.raises(InputError) as err:
        load_questions(path)
    assert f"{path}:3" in str(err.value) and message in str(err.value)


def test_a_good_file_loads_with_comments_ignored(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": " Where? ", "source": "a.pdf", "pages": 2, "_excerpt": "x"}\n'
                    '{"question": "What?", "source": "b.md", "evidence": "the phrase", "answer": "42", "id": "b"}\n')
    qs = load_questions(path)
    assert qs == [Question("Where?", "a.pdf", pages=(2,), id="1"),
                  Question("What?", "b.md", evidence="the phrase", answer="42", id="b")]
    with pytest.raises(InputError, match="no such file"):
        load_questions(tmp_path / "missing.jsonl")


def test_answer_check_reads_citations():
    q = Question("q", "guide.pdf", pages=(4,), answer="Physical cores")
    sources = [{"n": 1, "source": "/d/guide.pdf", "pages": [2]}, {"n": 2, "source": "/d/guide.pdf", "pages": [4, 5]}]
    good = check_answer(q, "Use physical  cores [2].", sources)
    assert (good["answer_ok"], good["cited_ok"], good["given_ok"]) == (True, True, True)
    wrong_cite = check_answer(q, "Use logical cores [1].", sources)
    assert (wrong_cite["answer_ok"], wrong_cite["cited_ok"], wrong_cite["given_ok"]) == (False, False, True)


# -- real runs: llama.cpp embedder, Chroma, the CLI -------------------------------------------


def write_questions(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rag_eval_reports_every_setting_on_a_real_collection(make_pipeline, corpus, tmp_path):
    make_pipeline().ingest([corpus])
    questions = write_questions(tmp_path / "q.jsonl", [
        {"question": "Which function saves the KV state?", "source": "docs/manual.pdf", "pages": [1]},
        {"question": "What does error ERR_SOCKET_ZX81 mean?", "source": "notes.txt",
         "evidence": "appears when the server is unreachable"},
        {"question": "Which fruit is rich in potassium?", "source": "manual.pdf", "pages": [2]},
        {"question": "Is this in the collection?", "source": "manual.pdf", "pages": [7]},
    ])
    result = CliRunner().invoke(cli, ["eval", str(questions), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    summaries = {s["setting"]: s for s in data["settings"]}
    assert list(summaries) == ["dense", "lexical", "hybrid", "hybrid+rerank", "adaptive+rerank"]
    for s in summaries.values():
        assert s["questions"] == 4
        assert s["recall@10"] == 0.75  # the fourth question's page 7 does not exist
    assert summaries["lexical"]["recall@1"] == 0.75  # exact terms: BM25 ranks each page first
    assert set(summaries["hybrid+rerank"]["latency_ms"]) == {"embed_query", "dense", "lexical", "fuse",
                                                             "rerank", "total"}
    assert "rerank" not in summaries["hybrid"]["latency_ms"]
    assert data["unreachable"] == [{"id": "4", "reason": "no chunk of manual.pdf holds page(s) 7"}]

    table = CliRunner().invoke(cli, ["eval", str(questions), "-s", "lexical", "--misses"])
    assert table.exit_code == 0, table.output
    assert "| current config | lexical | 4 | 0.750 |" in table.output
    assert "miss@5 current config / lexical: [4]" in table.output


def test_rag_eval_compares_configs_side_by_side(make_pipeline, corpus, tmp_path, store_dir):
    make_pipeline().ingest([corpus])
    questions = write_questions(tmp_path / "q.jsonl", [
        {"question": "Which header file covers buffer types?", "source": "manual.pdf", "pages": [3]}])
    other = tmp_path / "other.toml"
    other.write_text(f'[store]\npath = "{store_dir}"\n[retrieval]\nrerank_dense_weight = 0.2\n')
    result = CliRunner().invoke(cli, ["eval", str(questions), "-s", "hybrid+rerank", "--compare", str(other),
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [d["label"] for d in data] == ["current config", str(other)]
    assert all(d["settings"][0]["recall@5"] == 1.0 for d in data)


def test_template_starts_a_question_set_from_the_collection(make_pipeline, corpus, tmp_path):
    make_pipeline().ingest([corpus])
    target = tmp_path / "starter.jsonl"
    result = CliRunner().invoke(cli, ["eval", "--template", str(target), "--per-document", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    pdf = [line for line in lines if line["source"].endswith("manual.pdf")]
    assert [line["pages"] for line in pdf] == [[1], [3]]  # two chunks spread over the document
    assert all(line["question"] == "" and line["_excerpt"] for line in lines)
    # unfilled, it is refused with the line named; filled in, it runs and every target is reachable
    refused = CliRunner().invoke(cli, ["eval", str(target)])
    assert refused.exit_code == 2 and "starter.jsonl:1" in refused.output and "fill in" in refused.output
    for line in lines:
        line["question"] = "what does this part say?"
    write_questions(target, lines)
    ran = CliRunner().invoke(cli, ["eval", str(target), "-s", "lexical", "--json"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.output)["unreachable"] == []
    again = CliRunner().invoke(cli, ["eval", "--template", str(target)])
    assert again.exit_code != 0 and "not overwriting" in again.output


def test_eval_without_questions_or_collection_is_a_clear_error(make_pipeline, tmp_path):
    missing = CliRunner().invoke(cli, ["eval"])
    assert missing.exit_code == 2 and "QUESTIONS is required" in missing.output
    questions = write_questions(tmp_path / "q.jsonl", [{"question": "q", "source": "a.pdf"}])
    empty = CliRunner().invoke(cli, ["eval", str(questions)])
    assert empty.exit_code != 0 and "Traceback" not in empty.output and "Error" in empty.output


def test_search_stats_reports_each_retrieval_stage(make_pipeline, corpus):
    make_pipeline().ingest([corpus])
    result = CliRunner().invoke(cli, ["search", "ERR_SOCKET_ZX81", "--stats"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("retrieval:"))
    for stage in ("embed query", "dense", "lexical", "fuse", "rerank", "total"):
        assert f"{stage} " in line and " ms" in line
    timings: dict = {}
    make_pipeline(retrieval__rerank="none").search("ERR_SOCKET_ZX81", timings=timings)
    assert set(timings) == {"embed_query", "dense", "lexical", "fuse"} and all(v >= 0 for v in timings.values())


def test_answers_are_generated_and_checked(make_pipeline, corpus, tmp_path):
    """--answers on the real generator (a short context and answer to keep it quick)."""
    make_pipeline().ingest([corpus])
    questions = write_questions(tmp_path / "q.jsonl", [
        {"question": "Which fruit is rich in potassium?", "source": "manual.pdf", "pages": [2], "answer": "banana"}])
    rag = make_pipeline(engine__n_ctx=1024, ask__max_tokens=8, ask__top_k=2)
    report = rag.evaluate(questions, settings=["lexical"], answers=True)
    [row] = report.answers
    assert row["id"] == "1" and isinstance(row["answer"], str) and row["answer"]
    assert row["given_ok"] is True  # page 2 was among the prompt's sources
    assert row["answer_ok"] == ("banana" in row["answer"].lower())
    assert row["cited_ok"] <= row["given_ok"] and all(isinstance(n, int) for n in row["cited"])
    data = report.to_dict()
    assert data["answers"]["summary"]["questions"] == 1
    assert data["answers"]["summary"]["expected_page_in_prompt"] == 1
