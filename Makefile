# `make demo` sets everything up and asks two questions about samples/; `make test` runs the whole test suite.
.PHONY: setup demo test bench docs clean

setup:
	./setup.sh

# `rag ingest` saves each section's KV state of samples/ (larger than the 8K context) for the model that will
# answer; then two different questions, each composed from those states, prefilling only its seams and
# itself; the last two lines compare them.
DEMO_QUESTIONS = "How much faster was prefill with 8 layers' experts on the CPU?" \
                 "What is the difference between n_batch and n_ubatch?"

# The generator is Gemma 3 270M (configs/gemma-3-270m.toml): better answers and faster prefill than the
# default SmolLM2-135M on the development set (docs/performance.md, "Generators").
demo: setup
	.venv/bin/rag models pull gemma-3-270m
	.venv/bin/rag --config configs/gemma-3-270m.toml ingest samples/
	.venv/bin/rag --config configs/gemma-3-270m.toml ask --max-tokens 64 $(DEMO_QUESTIONS)

test: setup
	.venv/bin/rag models pull gemma-3-270m   # a sliding-window model the prefix-cache tests use
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python benchmarks/ingest.py
	.venv/bin/python benchmarks/prefill.py

docs: .venv/bin/rag   # docs/settings.md, generated from the settings dataclasses
	.venv/bin/rag config --reference > docs/settings.md.tmp && mv docs/settings.md.tmp docs/settings.md

.venv/bin/rag:
	./setup.sh

clean:
	rm -rf .venv
