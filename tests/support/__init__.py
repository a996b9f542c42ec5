"""The test suite's shared helpers: fakes of the engine's interfaces, generated PDFs and BERT models,
real servers and a real browser started for a test, a small full disk, and the processes some tests run.

Every test module imports them by package (``from support.fakes import HashEmbedder``); ``tests/`` is
on ``sys.path`` through ``tests/conftest.py``.
"""
