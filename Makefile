# `make demo` sets everything up and runs rag on samples/; `make test` runs the whole test suite.
.PHONY: setup demo test bench clean

setup:
	./setup.sh

demo: setup
	.venv/bin/rag ingest samples/
	.venv/bin/rag search "How many layers' experts were kept on the CPU, and what did -ub change?"

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python benchmarks/ingest.py

clean:
	rm -rf .venv
