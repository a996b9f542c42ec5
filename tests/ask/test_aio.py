"""The asyncio API on real models: a responsive event loop under 8 concurrent questions, prompt cancel."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from pipeline.errors import Cancelled, InputError

from test_concurrency import FAST
from test_concurrency import QUESTIONS as ALL_QUESTIONS

QUESTIONS = ALL_QUESTIONS[:4]


def test_eight_concurrent_aask_keep_the_loop_responsive(make_pipeline, ingested):
    rag = make_pipeline(**FAST)
    expected = {q: rag.ask(q).text for q in QUESTIONS}

    async def main():
        ticks: list[float] = []
        stop = asyncio.Event()

        async def heartbeat():
            while not stop.is_set():
                await asyncio.sleep(0.01)
                ticks.append(time.perf_counter())

        done_at: list[float] = []

        async def timed(question):
            answer = await rag.aask(question)
            done_at.append(time.perf_counter())
            return answer

        beat = asyncio.create_task(heartbeat())
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(timed(QUESTIONS[i % 4]) for i in range(8)))
        hits = await rag.asearch("tomato", top_k=1)
        pieces = [p async for p in rag.aask_stream(QUESTIONS[0])]
        stop.set()
        await beat
        return answers, hits, pieces, ticks, t0, done_at

    answers, hits, pieces, ticks, t0, done_at = asyncio.run(main())
    assert [a.text for a in answers] == [expected[QUESTIONS[i % 4]] for i in range(8)]
    assert hits and "".join(pieces).strip() == expected[QUESTIONS[0]]
    # A loop that a model call blocked would not tick until that call returned; here it keeps
    # ticking while every answer is in flight. Counted in ticks, not milliseconds, so a loaded
    # machine's scheduling delays do not decide it.
    flights = [t0] + sorted(done_at)
    busy = [sum(1 for t in ticks if a < t < b) for a, b in zip(flights, flights[1:])]
    assert busy[0] >= 5 and sum(busy) >= 20, f"heartbeats between answers: {busy}"


def _doc(path, topic: str, n: int = 60):
    path.write_text("\n\n".join(f"Note {i} on {topic}: the {topic} index of item {i} is {i * 7}, "
                                f"recorded by station {i % 5}." for i in range(n)))
    return path


def test_cancelling_a_stream_stops_its_prefill_within_one_micro_batch(make_pipeline, tmp_path):
    a, b = _doc(tmp_path / "a.md", "granite", 24), _doc(tmp_path / "b.md", "basalt", 24)
    make_pipeline().ingest([a, b])
    ubatch = 16
    rag = make_pipeline(engine__n_ctx=1024, engine__n_batch=1024, engine__n_ubatch=ubatch, engine__threads=1,
                        ask__max_tokens=2, cache__enabled=False)
    full = rag.ask("What is the index of item 3?", doc=a)  # one uncancelled prefill, for its pace
    per_ubatch = full.stats.prefill_seconds / math.ceil(full.stats.prefill_tokens / ubatch)
    assert full.stats.prefill_tokens > 10 * ubatch

    async def main():
        stream = rag.aask_stream("What is the index of item 3?", doc=b)

        async def consume():
            return [p async for p in stream]

        task = asyncio.create_task(consume())
        while not rag.engine.lock.busy:  # retrieval done, the stream has the engine: prefill begins
            await asyncio.sleep(0.005)
        await asyncio.sleep(3 * per_ubatch)  # a few micro-batches into a prefill of dozens
        assert not task.done()
        t_cancel = time.perf_counter()
        task.cancel()
        await asyncio.to_thread(stream.finished.wait, 60)
        latency = time.perf_counter() - t_cancel
        with pytest.raises(asyncio.CancelledError):
            await task
        after = await rag.aask("What is the index of item 4?", doc=a)  # the engine is free again
        return stream, latency, after

    stream, latency, after = asyncio.run(main())
    assert stream.answer is None and after.text
    # Most of the prefill was left when it was cancelled: an uncancelled prefill would have run on for
    # most of the full prefill's time, a cancelled one stops within about one micro-batch of it. The
    # bound is a share of the full prefill measured in the same run, so a loaded machine moves both.
    assert latency < full.stats.prefill_seconds / 3, \
        f"stopped after {latency:.3f} s; the whole prefill takes {full.stats.prefill_seconds:.3f} s"


def test_cancel_token_on_a_sync_call_and_errors_reach_the_awaiting_task(make_pipeline, ingested):
    rag = make_pipeline(**FAST)

    async def main():
        with pytest.raises(InputError):
            await rag.aask("   ")
        stream = rag.aask_stream(QUESTIONS[1])
        got = []
        async for piece in stream:
            got.append(piece)
            await stream.aclose()  # leaving early cancels the call and gives the engine back
        await asyncio.to_thread(stream.finished.wait, 30)
        return got, await rag.aask(QUESTIONS[1])

    got, again = asyncio.run(main())
    assert len(got) == 1 and again.text.startswith(got[0].strip())
    with pytest.raises(Cancelled):
        from pipeline.engine.context_lock import CancelToken

        token = CancelToken()
        token.cancel()
        rag.ask(QUESTIONS[0], cancel=token)


def test_leaving_an_async_for_or_an_async_with_early_cancels_the_call(make_pipeline, ingested):
    """An abandoned stream used to decode to max_tokens while holding the engine, and every other
    question waited behind it."""
    import gc

    rag = make_pipeline(**{**FAST, "ask__max_tokens": 600})

    async def main():
        stream = rag.aask_stream(QUESTIONS[0])
        dropped, finished = stream.cancel_token, stream.finished
        async for _ in stream:
            break
        del stream  # as `async for piece in rag.aask_stream(q): break` drops its stream
        gc.collect()
        async with rag.aask_stream(QUESTIONS[1]) as stream:
            left = stream.cancel_token
            async for _ in stream:
                break
        return dropped, finished, left, stream.finished

    dropped, finished, left, left_finished = asyncio.run(main())
    assert dropped.cancelled and left.cancelled
    assert finished.wait(60) and left_finished.wait(60)  # both gave the engine back
    assert rag.ask(QUESTIONS[2], max_tokens=4).text
