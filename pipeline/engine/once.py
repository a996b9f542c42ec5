"""A lazily built attribute that is built once, however many threads ask for it first.

Models, engines, caches and the store are built on first use (so ``rag --help`` and most
tests start at once); two threads asking at the same moment must not load a model twice.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Any, Callable


class once(cached_property):
    """``functools.cached_property`` that computes its value once even when threads race for it.

    (Python 3.12 dropped cached_property's lock.) The value lands in the instance's
    ``__dict__``, so a value put there beforehand (an injected stage) wins, as before.
    """

    def __init__(self, func: Callable[[Any], Any]):
        super().__init__(func)
        self._mu = threading.RLock()

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        cache = instance.__dict__
        if self.attrname in cache:
            return cache[self.attrname]
        with self._mu:
            if self.attrname not in cache:
                cache[self.attrname] = self.func(instance)
            return cache[self.attrname]


__all__ = ["once"]
