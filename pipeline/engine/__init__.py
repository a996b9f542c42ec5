"""The engine: everything that runs in llama.cpp, or in a server speaking for it.

The contract callers rely on (:mod:`.contract`), the one llama.cpp boundary
(:mod:`._llama`), the local generator (:mod:`.local`, :mod:`.loading`, :mod:`.templates`,
:mod:`.multiseq`, :mod:`.context_lock`) and its prefix-reuse policy (:mod:`.reuse`), the
embedder (:mod:`.embed`), expert offload (:mod:`.offload`), this machine (:mod:`.host`),
the prefix cache on disk (:mod:`.cache`), remote servers (:mod:`.remote`) and GGUF facts
(:mod:`.gguf`).
"""
