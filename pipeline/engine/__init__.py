"""The engine: everything that runs in llama.cpp (generator, embedder, prefix cache, offload, GGUF files)."""
