"""OpenAI's chat completion shapes: the whole response, stream chunks as server-sent events, usage.

Two extra fields carry what retrieval adds: ``sources`` (the numbered documents, on the
first streamed chunk and on the whole response) and ``stats`` (the engine's figures, on
the last chunk and on the whole response).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ask.answer import Answer


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


def chunk(cid: str, created: int, model: str, delta: dict | None, *, finish: str | None = None,
          sources: list | None = None) -> dict:
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if sources is not None:
        out["sources"] = sources
    return out


def finish_reason(answer: "Answer | None", limit: int) -> str:
    return "length" if answer is not None and answer.stats.decode_tokens >= limit else "stop"


def usage(answer: "Answer") -> dict:
    st = answer.stats
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.decode_tokens,
            "total_tokens": st.prompt_tokens + st.decode_tokens,
            "prompt_tokens_details": {"cached_tokens": st.cached_tokens}}


def completion(cid: str, created: int, model: str, answer: "Answer", limit: int) -> dict:
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": finish_reason(answer, limit)}],
            "usage": usage(answer), "sources": answer.sources, "stats": answer.stats.to_dict()}


def usage_chunk(cid: str, created: int, model: str, answer: "Answer") -> dict:
    out = chunk(cid, created, model, None)
    out["choices"] = []
    out["usage"] = usage(answer)
    return out
