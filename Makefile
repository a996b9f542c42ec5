# `make demo` sets everything up and answers a question about samples/; `make test` runs the whole test suite.
.PHONY: setup demo test bench clean

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

clean:
	rm -rf .venv
