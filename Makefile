# `make demo` sets everything up and asks two questions about samples/; `make test` runs the whole test suite.
.PHONY: setup demo test bench docs clean

setup:
	./setup.sh

# `rag ingest` calibrates composition on samples/ (larger than the 8K context) and saves each section's KV
# state; then two different questions, each composed from those states, prefilling only its seams and
# itself; the last two lines compare them.
DEMO_QUESTIONS = "How much faster was prefill with 8 layers' experts on the CPU?" \
                 "What is the difference between n_batch and n_ubatch?"

demo: setup
	.venv/bin/rag ingest samples/
	.venv/bin/rag ask --max-tokens 64 $(DEMO_QUESTIONS)

# Two worker processes, each taking whole test files (module fixtures set up once): many tests wait on a
# subprocess, a server or a file; TEST_WORKERS=0 runs the suite in this process alone.
TEST_WORKERS ?= 2

test: setup
	.venv/bin/rag models pull SmolLM2-135M-Instruct   # a model with a chat template, for the template tests
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: setup
	.venv/bin/python benchmarks/ingest.py
	.venv/bin/python benchmarks/prefill.py

docs: .venv/bin/rag   # docs/settings.md, generated from the settings dataclasses
	.venv/bin/rag config --reference > docs/settings.md.tmp && mv docs/settings.md.tmp docs/settings.md

.venv/bin/rag:
	./setup.sh

clean:
	rm -rf .venv
