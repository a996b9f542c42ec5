# `make demo` sets everything up and answers a question about samples/; `make test` runs the whole test suite.
.PHONY: setup demo test bench docs clean

setup:
	./setup.sh

demo: setup
	.venv/bin/rag ingest samples/
	.venv/bin/rag ask --stats "How much faster was prefill with 8 layers' experts on the CPU?"

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
