"""Conversations: follow-up questions over the same documents, with the document prefix kept.

A follow-up ("And how is it invalidated?") is a poor retrieval query on its own, so
retrieval uses a *condensed* standalone query: the conversation's earlier user
questions and the follow-up, latest last (deterministic and free; a small model
asked to rewrite the question costs a generation and, at 135M parameters, often
loses the question). The documents are those the first question retrieved plus
whatever the condensed query adds, and earlier turns go *after* the documents,
just before the new question, so the documents' prefix state (in the KV cache or
on disk) serves every turn of the conversation:

    system · documents · Question: q1 / Answer: a1 · … · Question: qN · (answer)

``rag ask --chat ID`` and ``Pipeline.chat(..., chat_id=ID)`` keep the turns in
``chats/ID.json`` in the store directory; the HTTP server takes them from the request's messages.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Sequence

from ..errors import InputError

_CHAT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: "$" would let "c1\n" through
# Earlier turns kept in the prompt; older ones still shape the retrieval query.
MAX_TURNS_IN_PROMPT = 6


def user_questions(history: Sequence[dict]) -> list[str]:
    return [t["content"] for t in history if t.get("role") == "user" and t.get("content", "").strip()]


def condense(history: Sequence[dict], question: str, *, keep: int = 2) -> str:
    """A standalone retrieval query for ``question``: the last ``keep`` earlier questions and it."""
    return "\n".join([*user_questions(history)[-keep:], question])


def transcript(history: Sequence[dict], question: str) -> str:
    """What follows "Question: " in the prompt: earlier turns, then the new question.

    ``q1`` / ``a1`` / ``q2`` become "q1\nAnswer: a1\n\nQuestion: q2": the layout of one turn, repeated.
    """
    parts: list[str] = []
    for t in list(history)[-2 * MAX_TURNS_IN_PROMPT:]:
        content = t.get("content", "").strip()
        if t.get("role") == "user":
            parts.append(content)
        elif t.get("role") == "assistant" and parts:
            parts[-1] += "\nAnswer: " + content
    return "\n\nQuestion: ".join([*parts, question])


class ChatStore:
    """Conversations on disk, one JSON file each, written atomically."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._lock = threading.Lock()

    def path(self, chat_id: str) -> Path:
        if not isinstance(chat_id, str) or not _CHAT_ID.fullmatch(chat_id):
            raise InputError(f"invalid chat id {chat_id!r}: use up to 128 letters, digits, '.', '_' and '-'")
        return self.directory / f"{chat_id}.json"

    def history(self, chat_id: str) -> list[dict]:
        path = self.path(chat_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise InputError(f"the conversation file {path} cannot be read ({exc}); delete it to start over") from None
        turns = data.get("turns") if isinstance(data, dict) else None
        if not isinstance(turns, list):
            raise InputError(f"the conversation file {path} is not a conversation; delete it to start over")
        return [{"role": t["role"], "content": t["content"]} for t in turns
                if isinstance(t, dict) and t.get("role") in ("user", "assistant") and isinstance(t.get("content"), str)]

    def append(self, chat_id: str, question: str, answer: str) -> None:
        with self._lock:
            turns = self.history(chat_id) + [{"role": "user", "content": question},
                                             {"role": "assistant", "content": answer}]
            path = self.path(chat_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".chat-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"schema": 1, "id": chat_id, "turns": turns}, fh, ensure_ascii=False, indent=1)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
