"""Real servers for the shared-store tests, started on 127.0.0.1 and stopped by the fixtures
(the servers themselves: :mod:`devtools.servers`).

* :func:`chroma_url`: a Chroma server (the ``chroma`` command that the chromadb package
  installs) on a free port, over a fresh directory, one per test.
* :func:`pg_url`: a fresh database in a throwaway PostgreSQL cluster (Debian's postgresql
  package), one cluster per test session. When no PostgreSQL can be found the tests skip
  with a reason that says so loudly and how to install it (``.ci/run`` installs it on a
  fresh machine).

Import the fixtures into a test module: ``from support.servers import chroma_url, pg_cluster, pg_url  # noqa: F401``.
"""

from __future__ import annotations

import pytest

from devtools.servers import ChromaServer, PostgresCluster, ServerError, free_port, postgres_bin

__all__ = ["chroma_url", "pg_cluster", "pg_url", "free_port"]


@pytest.fixture
def chroma_url(tmp_path):
    """The URL of a fresh Chroma server for this test."""
    try:
        server = ChromaServer(tmp_path / "chroma-server").start()
    except ServerError as exc:
        pytest.fail(str(exc))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def pg_cluster():
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL NOT FOUND: no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin, so the "
                    "PostgreSQL catalog tests did not run. Install it: apt-get install -y postgresql "
                    "(.ci/run does this on a fresh machine)")
    try:
        cluster = PostgresCluster(bindir).start()
    except ServerError as exc:
        pytest.fail(str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """The URL of a fresh, empty database for this test."""
    return pg_cluster.create_database()
