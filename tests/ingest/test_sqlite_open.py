"""Opening SQLite files that several processes share: a new file opened by many at the same moment."""

import threading

import pytest

from pipeline._sqlite import connect
from pipeline.summarize.jobstore import SQLiteJobStore


def _open_at_once(open_one, paths, workers=6) -> list[Exception]:
    errors: list[Exception] = []
    for path in paths:
        start = threading.Barrier(workers)

        def one(path=path, start=start):
            start.wait()
            try:
                open_one(path)
            except Exception as exc:  # noqa: BLE001 - every failure is the finding
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return errors


@pytest.mark.parametrize("what", ["connection", "job store"])
def test_a_new_file_opened_by_many_at_once_opens_for_all(tmp_path, what):
    """SQLite answers "database is locked" at once, without its busy wait, to a connection switching a
    new file to WAL while another does; and two creators of a job database raced on its schema row.
    Before the fix a few of every hundred rounds failed one opener."""
    def open_one(path):
        if what == "connection":
            db = connect(path, timeout=30)
            db.execute("CREATE TABLE IF NOT EXISTS t (x)")
            db.close()
        else:
            SQLiteJobStore(path).close()

    errors = _open_at_once(open_one, [tmp_path / f"{i}.sqlite" for i in range(100)])
    assert errors == []
