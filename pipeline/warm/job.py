"""Warming after an ingest: one meaning of ``ingest.warm`` for ``rag ingest``, ``rag serve`` and an app.

:func:`after_ingest` is what every entry point runs once documents are ingested: ``"auto"``
(the default) saves section states where the collection is larger than the context and the
model composes (:func:`.sections.warm_auto`), ``"on"`` what ``rag warm`` saves whatever the
collection's size (:func:`.prefixes.warm`), ``"off"`` nothing. The work runs in a thread
(:class:`WarmJob`): it gives the engine to any question that arrives meanwhile, between two of
its steps, so in a long-lived process (``rag serve``, an app) a question always runs first; a
command that exits when it is done (``rag ingest``) waits for it (:meth:`WarmJob.wait`),
drawing its progress. Cancelling keeps every state already saved; the next warming saves the rest.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Callable

from ..engine.context_lock import CancelToken
from ..errors import Cancelled, RagError
from .progress import WarmProgress

if TYPE_CHECKING:
    from ..runtime import Runtime

SETTINGS = ("auto", "on", "off")

#: What a cancelled warming says (a later ingest, the process stopping, Ctrl-C).
CANCELLED = ("cancelled: the states saved so far are kept; `rag warm --sections` (or the next `rag ingest`) "
             "saves the rest")


class WarmJob:
    """Warming running in its own thread: ``progress`` (a :class:`~.progress.WarmProgress`, the latest),
    then ``report`` (what it did or why it did nothing, a dict) once ``done``. Safe to read from any
    thread; :meth:`cancel` stops it within a micro-batch."""

    def __init__(self, setting: str, run: Callable[[Callable[[WarmProgress], None], CancelToken], dict]):
        self.setting = setting
        self.progress = WarmProgress(stage="waiting for the engine")
        self.report: dict | None = None
        self._run = run
        self._cancel = CancelToken()
        self._changed = threading.Condition()
        self._version = 0
        self._thread = threading.Thread(target=self._main, name="rag-warm", daemon=True)

    def start(self) -> WarmJob:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            report = self._run(self._seen, self._cancel)
        except Cancelled:
            report = {"warmed": False, "reason": CANCELLED, "cancelled": True}
        except RagError as exc:
            report = {"warmed": False, "reason": f"states not saved: {exc}", "failed": True}
        except Exception as exc:  # noqa: BLE001 - warming never takes its process down; the ingest stands
            report = {"warmed": False, "reason": f"states not saved: internal error: {type(exc).__name__}: {exc}",
                      "failed": True}
        with self._changed:
            self.report = report
            self._version += 1
            self._changed.notify_all()

    def _seen(self, progress: WarmProgress) -> None:
        with self._changed:
            self.progress = dataclasses.replace(progress)
            self._version += 1
            self._changed.notify_all()

    @property
    def done(self) -> bool:
        return self.report is not None

    def cancel(self) -> None:
        """Stop it (within a micro-batch); the states saved so far are kept."""
        self._cancel.cancel()

    def wait(self, *, on_progress: Callable[[WarmProgress], None] | None = None, every: float = 0.2) -> dict:
        """Wait for the report, telling ``on_progress`` of each new look at it (on this thread, at most every
        ``every`` seconds: where a command draws its bar). Ctrl-C (KeyboardInterrupt) reaches this thread
        between two looks: the caller decides what it means (``rag ingest`` cancels)."""
        seen = -1
        while True:
            with self._changed:
                if self._version == seen and self.report is None:
                    self._changed.wait(every)
                version, progress, report = self._version, self.progress, self.report
            if on_progress is not None and version != seen and report is None:
                on_progress(progress)
            seen = version
            if report is not None:
                return report

    def to_dict(self) -> dict:
        """What a status shows: ``state`` ("running" or "done"), its progress, and its report once done."""
        if self.report is None:
            return {"state": "running", "setting": self.setting, **self.progress.to_dict()}
        return {"state": "done", "setting": self.setting, **self.report}


def after_ingest(rt: "Runtime", setting: str) -> WarmJob | None:
    """Start the warming ``setting`` (``ingest.warm``, or the caller's override) asks for after an ingest;
    None for ``"off"``."""
    if setting not in SETTINGS:
        raise ValueError(f"ingest.warm must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "off":
        return None
    if setting == "auto":
        from .sections import warm_auto

        def run(progress, cancel):
            return warm_auto(rt, progress=progress, cancel=cancel)
    else:
        from .prefixes import warm

        def run(progress, cancel):
            out = warm(rt, states_progress=progress, cancel=cancel)
            return {"warmed": True, **out}
    return WarmJob(setting, run).start()


__all__ = ["CANCELLED", "SETTINGS", "WarmJob", "after_ingest"]
