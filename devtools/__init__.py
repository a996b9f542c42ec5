"""Development tools: generated test models, the benchmark runner, throwaway servers, the GPU kit.

They live beside the ``pipeline`` package, not in it, so that ``pip install`` carries only the
product; tests and benchmarks import them from the source checkout (the repository root on
``sys.path``), and ``rag bench`` loads the runner from the checkout it runs in.
"""
