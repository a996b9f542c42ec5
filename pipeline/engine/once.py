"""A lazily built attribute that is built once, however many threads ask for it first, and a module
imported when first used.

Models, engines, caches and the store are built on first use (so ``rag --help`` and most
tests start at once); two threads asking at the same moment must not load a model twice.
"""

from __future__ import annotations

import importlib
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


class Later:
    """Stands for the module ``name`` (relative to ``package``) and imports it at the first attribute read:
    :mod:`pipeline.api` names the ask path and the collection's operations this way, so that what they
    import (retrieval, packing, the store, ingest) loads beside the generator's model, not before it."""

    def __init__(self, name: str, package: str | None = None):
        self._name, self._package = name, package

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name, self._package), attr)


__all__ = ["Later", "once"]
