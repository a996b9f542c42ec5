"""Development tools: generated test models and the benchmark runner."""
