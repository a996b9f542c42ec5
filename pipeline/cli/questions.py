"""Questions over a collection: ``rag search``, ``rag ask``, ``rag eval``, ``rag serve``."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Iterator

import click

from ..ask.started import process_start  # early: where the kernel cannot tell the process's start, this is it
from .common import (QueryCommand, UserError, cli, display_path, echo_json, handles_errors, json_option, open_pipeline,
                     printable, store_options, store_overrides)


@cli.command(cls=QueryCommand)
@click.argument("query")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Number of hits. [default: from config, 5]")
@click.option("--dense/--no-dense", default=None, help="Use the vector (dense) side.")
@click.option("--lexical/--no-lexical", default=None, help="Use the BM25 (lexical) side.")
@click.option("--rerank/--no-rerank", default=None, help="Rerank the fused candidates (retrieval.rerank).")
@click.option("--stats", "show_stats", is_flag=True, help="Print the time each retrieval stage took.")
@store_options
@json_option
@click.pass_context
@handles_errors
def search(ctx, query, top_k, dense, lexical, rerank, show_stats, collection, store_path, as_json):
    """Retrieve the chunks that best match QUERY (hybrid dense + BM25, reranked), without generating.

    A QUERY that starts with a dash goes after --: rag search -- --n-cpu-moe
    """
    overrides = store_overrides(collection, store_path)
    overrides.update({"retrieval.dense": dense, "retrieval.lexical": lexical,
                      "retrieval.rerank": None if rerank is None else ("scores" if rerank else "none")})
    timings: dict[str, float] = {}
    with open_pipeline(ctx, **overrides) as rag:
        hits = rag.search(query, top_k=top_k, timings=timings)
    if show_stats and not as_json:
        click.echo(_retrieval_line(timings), err=True)
    if as_json:
        echo_json({"query": query, "hits": [h.to_dict() for h in hits]})
        return
    if not hits:
        click.echo("no matches", err=True)
        return
    for i, h in enumerate(hits, start=1):
        where = display_path(h.source) + (f", page {h.page}" if h.page else "")
        click.secho(f"[{i}] {where}  score {h.score:.4f}  ({' + '.join(h.found_by)})", bold=True)
        click.echo(_indent(h.text))
        click.echo()


def _retrieval_line(seconds: dict[str, float]) -> str:
    """One line of retrieval latency per stage, in milliseconds."""
    names = {"embed_query": "embed query", "dense": "dense", "lexical": "lexical", "fuse": "fuse",
             "rerank": "rerank"}
    parts = [f"{label} {seconds[key] * 1000:.1f} ms" for key, label in names.items() if key in seconds]
    return "retrieval: " + " | ".join(parts) + f" | total {sum(seconds.values()) * 1000:.1f} ms"


def _indent(text: str, width: int = 600) -> str:
    text = printable(" ".join(text.split()))
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0] + " …"
    return "    " + text


@cli.command(cls=QueryCommand)
@click.argument("question", nargs=-1, required=True)
@click.option("--doc", "docs", multiple=True, type=click.Path(path_type=Path),
              help="Answer from this ingested document (repeatable).")
@click.option("--source", "sources", multiple=True, type=click.Path(path_type=Path),
              help="Answer from the documents under this folder or path (repeatable).")
@click.option("--mode", type=click.Choice(["auto", "passages"]),
              help="auto: whole documents when they fit, else fixed sections, so questions share a cached "
                   "prefix; passages: retrieved passages. [default: from config, auto]")
@click.option("-k", "--top-k", type=click.IntRange(min=1), help="Passages to retrieve, or hits cited. [default: from config, 8]")
@click.option("--stats", "show_stats", is_flag=True, help="Print the engine's figures (prefill, TTFT, reuse, decode).")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=0), help="Context length in tokens (engine.n_ctx).")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Longest answer in tokens (ask.max_tokens).")
@click.option("--temperature", type=click.FloatRange(0, 5), help="Sampling temperature; 0 is greedy (ask.temperature).")
@click.option("--system", "system_prompt", help="System prompt for this question (ask.system_prompt).")
@click.option("--stop", multiple=True, help="End the answer at this text (repeatable; added to the template's stops).")
@click.option("--chat", "chat_id", help="Continue (or start) the conversation ID: a follow-up keeps the documents' "
              "cached prefix, earlier turns go after them.")
@store_options
@json_option
@click.pass_context
@handles_errors
def ask(ctx, question, docs, sources, mode, top_k, show_stats, n_ctx, max_tokens, temperature, system_prompt, stop,
        chat_id, collection, store_path, as_json):
    """Answer QUESTION from the collection, streaming the answer, then its sources.

    By default (auto) the prompt holds every document whole when they fit the context,
    else the fixed sections that best match the question, always in document order, so
    the next question reuses the prompt's prefix and prefills only itself. Pages are
    marked in the prompt; sources list the pages that matched best.
    Several questions are answered one after another with the model loaded once, then
    compared: time to first token, tokens prefilled and reused (with --json, one JSON
    object per line). A QUESTION that starts with a dash goes after --.
    """
    from ..ask.request import AskRequest

    overrides = store_overrides(collection, store_path)
    overrides.update({"engine.n_ctx": n_ctx, "ask.max_tokens": max_tokens})
    progress = _PrefillLine if not as_json and sys.stderr.isatty() else None
    # The first answer's wait counts from the command's start; a later one's, from its own turn.
    requests = [AskRequest(q, doc=docs, source=sources, mode=mode, top_k=top_k, temperature=temperature,
                           system_prompt=system_prompt, stop=stop, chat_id=chat_id,
                           progress=progress() if progress else None, start=process_start() if i == 0 else None)
                for i, q in enumerate(question)]
    several = len(requests) > 1
    answers = []
    with open_pipeline(ctx, **overrides) as rag:
        rag.preload()  # the generator loads while the rest starts and retrieval runs
        for i, request in enumerate(requests, start=1):
            if several and not as_json:
                click.secho(("\n" if i > 1 else "") + f"Q{i}: {printable(request.question)}", bold=True)
            answer = _answer(rag, request, live=not as_json)
            answers.append(answer)
            if as_json:
                if several:
                    from ..schemas import versioned

                    click.echo(json.dumps(versioned(answer.to_dict()), ensure_ascii=False))
                else:
                    echo_json(answer.to_dict())
                continue
            _echo_answer(answer, show_stats=show_stats)
        try:
            rag.settle(log=lambda m: click.echo(m, err=True))
        except KeyboardInterrupt:
            click.echo("composition calibration skipped: it runs after a later answer", err=True)
    if several and not as_json:
        click.echo()
        for line in _comparison(answers):
            click.echo(line)


def _answer(rag, request, *, live: bool):
    """One answer, streamed to stdout when ``live``."""
    from ..errors import Cancelled

    stream = rag.chat_stream(request) if request.chat_id else rag.ask_stream(request)
    try:  # generated in a worker thread: Ctrl-C stops a prefill within one micro-batch
        for piece in iterate_interruptibly(stream):
            if live:
                click.echo(piece, nl=False)
    except KeyboardInterrupt:
        raise UserError(Cancelled("interrupted")) from None
    return stream.answer


def _echo_answer(answer, *, show_stats: bool) -> None:
    from ..engine.contract import CacheKind

    click.echo()
    if answer.sources:
        click.echo("\nSources:")
        for src in answer.sources:
            pages = _pages(src["pages"])
            click.echo(f"  [{src['n']}] {display_path(src['source'])}{', ' + pages if pages else ''}")
    for note in answer.notes or []:
        click.echo(f"note: {printable(note)}", err=True)
    if show_stats:
        st = answer.stats
        reuse = f"{st.cached_tokens:,} reused, cache: {st.cache}"
        if st.cache is CacheKind.COMPOSED:
            reuse += f", {st.composed_sections} sections from their states, {st.recomputed_tokens:,} recomputed"
        packed = f"mode {st.mode}" + (f" ({len(st.sections)} sections)" if st.sections else "")
        click.echo(
            f"\n{packed} | prompt {st.prompt_tokens:,} tokens ({reuse}) | "
            f"prefill {st.prefill_seconds:.2f} s at {st.prefill_tokens_per_second:,.0f} tok/s | "
            f"TTFT {st.ttft_seconds:.2f} s{_first_token(st)} | decode {st.decode_tokens} tokens at "
            f"{st.decode_tokens_per_second:.1f} tok/s | model load {st.load_seconds:.2f} s", err=True)
        if st.plan:
            other = f"; exact {st.predicted_exact_seconds:.2f} s" if st.plan == "composed" else ""
            click.echo(f"plan: {st.plan}, predicted {st.predicted_seconds:.2f} s to the first token{other}; "
                       f"measured {st.ttft_seconds:.2f} s", err=True)
        if answer.retrieval:
            click.echo(_retrieval_line(answer.retrieval), err=True)
        if st.reuse_lost:
            click.echo(f"reuse: {st.reuse_lost}", err=True)


def _first_token(st) -> str:
    """The wait a person saw for the first answer text, beside the engine's TTFT."""
    if st.start_to_first_token_seconds is None:
        return ""
    since = {"process": "the start", "import": "the start", "call": "the question"}.get(st.start_point, "the start")
    return f" (from {since} {st.start_to_first_token_seconds:.2f} s)"


def _comparison(answers) -> list[str]:
    """One line per answer: time to first token, tokens prefilled and reused, against the first."""
    first = answers[0].stats
    lines = []
    for i, a in enumerate(answers, start=1):
        st = a.stats
        line = (f"question {i}: {st.ttft_seconds:.1f} s to the first token ({st.prefill_tokens:,} tokens prefilled, "
                f"{st.cached_tokens:,} of {st.prompt_tokens:,} reused)")
        if i > 1 and st.ttft_seconds > 0 and first.ttft_seconds > 0:
            ratio = first.ttft_seconds / st.ttft_seconds
            line += f", {ratio:.1f}x faster than question 1" if ratio >= 1.5 else ", about as soon as question 1"
        lines.append(line)
    return lines


class _PrefillLine:
    """Prefill progress on one stderr line, shown once a prefill has taken more than a second."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, p) -> None:
        if p.seconds < 1.0 and not self.shown:
            return
        self.shown = True
        click.echo("\r\033[K" + p.describe() + ("\n" if p.finished else ""), err=True, nl=False)


def _pages(pages: list[int]) -> str:
    """[3, 4, 5, 9] as "pages 3-5, 9"."""
    runs: list[list[int]] = []
    for p in pages:
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return "" if not pages else ("page " if len(pages) == 1 else "pages ") + text


@cli.command("eval")
@click.argument("questions", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-s", "--setting", "settings", multiple=True,
              type=click.Choice(["dense", "lexical", "hybrid", "hybrid+mmr", "hybrid+rerank", "adaptive",
                                 "adaptive+rerank"]),
              help="Retrieval setting to measure (repeatable); adaptive+rerank is the default configuration. "
                   "[default: dense, lexical, hybrid, hybrid+rerank, adaptive+rerank]")
@click.option("--compare", "compare", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also run with this TOML config (repeatable); results side by side.")
@click.option("--answers", is_flag=True, help="Also answer each question and check the answer and its citations (slow).")
@click.option("--packed", is_flag=True,
              help="Also check whether each answer's page is inside the prompt `rag ask` would build (no generation).")
@click.option("--misses", is_flag=True, help="List the questions whose page is not in the top 5, per setting.")
@click.option("--template", "write_template", is_flag=True,
              help="Write a starter question set from the collection to QUESTIONS (or stdout) and stop.")
@click.option("--per-document", type=click.IntRange(min=1), default=5, show_default=True,
              help="Template lines per document.")
@store_options
@json_option
@click.pass_context
@handles_errors
def eval_(ctx, questions, settings, compare, answers, packed, misses, write_template, per_document, collection,
          store_path, as_json):
    """Measure whether retrieval finds the page that holds each answer in QUESTIONS (JSONL).

    Prints recall@1/5/10, MRR, nDCG@10 and the median query latency per stage for each
    retrieval setting. Each line of QUESTIONS: {"question": ..., "source": "docs/manual.pdf",
    "pages": [12], "answer": "optional substring"}; for documents without pages, "evidence"
    (a phrase of the passage) instead of "pages". `--template` starts such a file.
    """
    from ..api import Pipeline

    overrides = store_overrides(collection, store_path)
    if write_template:
        with open_pipeline(ctx, **overrides) as rag:
            lines = rag.eval_template(per_document=per_document)
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        if questions is None:
            click.echo(text, nl=False)
        else:
            if questions.exists():
                raise click.ClickException(f"{questions} exists; not overwriting it")
            questions.write_text(text, encoding="utf-8")
            click.echo(f"wrote {len(lines)} template lines to {questions}: write each question in your own "
                       "words, fill in 'answer' if you like, and delete lines you do not want", err=True)
        return
    if questions is None:
        raise click.UsageError("QUESTIONS is required (or use --template)")
    base = ctx.find_root().params.get("config_path")
    runs = [(str(base) if base else "current config", base, overrides)]
    runs += [(str(path), path, {}) for path in compare]
    reports = []
    for label, path, extra in runs:
        live = not as_json and sys.stderr.isatty()
        show = (lambda qid, n: click.echo(f"\r{label}: {n} questions", nl=False, err=True)) if live else None
        with Pipeline.from_config(path, overrides=extra, log=lambda m: click.echo(m, err=True)) as rag:
            reports.append(rag.evaluate(questions, settings=settings or None, answers=answers, packed=packed,
                                        label=label, progress=show))
        if live:
            click.echo(err=True)
    if as_json:
        data = [r.to_dict() for r in reports]
        echo_json(data[0] if len(data) == 1 else data)
        return
    from ..retrieval.evaluate import table

    click.echo(table(reports))
    for r in reports:
        for u in r.unreachable:
            click.echo(f"warning: {r.label}: question {u['id']}: {u['reason']} (counted as a miss)", err=True)
        if misses:
            for s in r.settings:
                for q in s.misses():
                    top = ", ".join(f"{Path(t['source']).name} p{t['page']}" if t["page"] else Path(t["source"]).name
                                    for t in q["top"])
                    click.echo(f"miss@5 {r.label} / {s.name}: [{q['id']}] {q['question']} (rank {q['rank']}; top: {top})")
        if r.packed is not None:
            from ..retrieval.evaluate import packed_summary

            p = packed_summary(r.packed)
            modes = ", ".join(f"{m} {n}" for m, n in sorted(p["modes"].items()))
            click.echo(f"page in prompt ({r.label}): {p['share']:.3f} ({p['in_prompt']} of {p['questions']}; "
                       f"prompts built as `rag ask` builds them: {modes}; median {p['median_tokens']:,.0f} tokens)")
            if misses:
                for q in r.packed:
                    if not q["in_prompt"]:
                        click.echo(f"not in prompt {r.label}: [{q['id']}] {q['question']}")
        if r.answers is not None:
            from ..retrieval.evaluate import answer_summary

            a = answer_summary(r.answers)
            click.echo(f"answers ({r.label}): {a['answer_contains_expected']}/{a['with_expected_answer']} contain the "
                       f"expected text; {a['cites_expected_page']}/{a['questions']} cite the expected page; "
                       f"{a['expected_page_in_prompt']}/{a['questions']} had it in the prompt")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Off loopback it needs RAG_SERVE_TOKEN (or --insecure).")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="TCP port.")
@click.option("--max-body", type=click.IntRange(min=1024), default=1 << 20, show_default=True,
              help="Largest request body in bytes.")
@click.option("--max-upload", type=click.IntRange(min=1024), default=64 << 20, show_default=True,
              help="Largest document added from the page (PUT /upload), in bytes.")
@click.option("--allow", "allow", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder POST /ingest may read and the page may add documents to (repeatable). "
                   "[default: serve.allow; none: both are off]")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME[:PORT]",
              help="Another Host name to answer for, e.g. a reverse proxy's (repeatable). "
                   "[default: serve.allow_hosts]")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="A site whose browser pages may call the server, e.g. https://app.example (repeatable). "
                   "[default: serve.cors_origins]")
@click.option("--insecure", is_flag=True, help="Listen off loopback without RAG_SERVE_TOKEN.")
@click.option("--quiet", is_flag=True, help="No access log (one line per request: method, path, status, time).")
@store_options
@click.pass_context
@handles_errors
def serve(ctx, host, port, max_body, max_upload, allow, allow_hosts, cors_origins, insecure, quiet, collection,
          store_path):
    """Serve the collection over HTTP: OpenAI-compatible /v1/chat/completions with sources,
    /search, /ingest, /status, /health. Set RAG_SERVE_TOKEN to require a bearer token.

    It answers only requests for the address it listens on (or --allow-host names),
    from its own origin (or --cors-origin ones), with JSON bodies; /ingest reads only
    inside the --allow folders. This process owns the store and the models; ingests
    posted to it run in its own writer while searches and answers go on.
    """
    import os

    from ..serve import TOKEN_ENV, run

    token = os.environ.get(TOKEN_ENV) or None
    overrides = store_overrides(collection, store_path)
    overrides.update({"serve.allow": tuple(str(p) for p in allow) or None,
                      "serve.allow_hosts": tuple(allow_hosts) or None,
                      "serve.cors_origins": tuple(cors_origins) or None})
    with open_pipeline(ctx, **overrides) as rag:
        run(rag, host=host, port=port, token=token, max_body=max_body, max_upload=max_upload, insecure=insecure,
            quiet=quiet, log=lambda m: click.echo(m, err=True))


def iterate_interruptibly(stream) -> Iterator[str]:
    """The pieces of an :class:`~pipeline.ask.answer.AnswerStream`, generated in a worker thread, so that
    Ctrl-C in the main thread is seen at once (a signal reaches Python only between bytecodes,
    never inside a ``llama_decode``) and cancels it: the decode stops within one micro-batch."""
    import queue as queue_mod

    q: queue_mod.Queue = queue_mod.Queue(maxsize=64)
    end = object()

    def work() -> None:
        try:
            with stream:
                for piece in stream:
                    q.put(piece)
            q.put(end)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            q.put(exc)

    worker = threading.Thread(target=work, name="rag-ask", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue_mod.Empty:
                continue
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    except (KeyboardInterrupt, GeneratorExit):
        stream.cancel()
        while worker.is_alive():  # drain so the worker is never stuck on a full queue
            try:
                q.get(timeout=0.05)
            except queue_mod.Empty:
                pass
        raise
