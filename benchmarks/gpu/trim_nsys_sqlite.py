"""Copy of an Nsight Systems sqlite export holding only what ``sglang_mmtrace.profiling.nsys`` reads.

    python benchmarks/gpu/trim_nsys_sqlite.py IN.sqlite OUT.sqlite

Keeps the plugin's NVTX domain (its ranges, and the marks that name a batch range's requests), the CUDA API calls on the threads that pushed its ranges (inside
the ranges' time window) and the GPU operations they launched; small enough to commit as a real
test input for the reader.
"""

from __future__ import annotations

import sqlite3
import sys

from sglang_mmtrace.profiling.nsys import DOMAIN_CREATE, GPU_TABLES, MARK, PUSH_POP, START_END


def trim(src: str, dst: str) -> None:
    db = sqlite3.connect(dst)
    db.execute("ATTACH DATABASE ? AS s", (f"file:{src}?mode=ro",))
    tables = {r[0] for r in db.execute("SELECT name FROM s.sqlite_master WHERE type='table'")}
    db.execute("CREATE TABLE StringIds AS SELECT * FROM s.StringIds")
    db.execute(
        "CREATE TABLE NVTX_EVENTS AS SELECT * FROM s.NVTX_EVENTS WHERE eventType = ? OR (eventType IN (?, ?, ?) "
        "AND domainId IN (SELECT domainId FROM s.NVTX_EVENTS WHERE eventType = ? AND "
        "COALESCE(text, (SELECT value FROM s.StringIds WHERE id = textId)) = 'sglang_mmtrace'))",
        (DOMAIN_CREATE, PUSH_POP, START_END, MARK, DOMAIN_CREATE),
    )
    lo, hi = db.execute("SELECT MIN(start), MAX(end) FROM NVTX_EVENTS WHERE eventType = ?", (PUSH_POP,)).fetchone()
    db.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME AS SELECT * FROM s.CUPTI_ACTIVITY_KIND_RUNTIME WHERE start BETWEEN ? AND ? "
        "AND globalTid IN (SELECT DISTINCT globalTid FROM NVTX_EVENTS WHERE eventType = ?)",
        (lo, hi, PUSH_POP),
    )
    for t in GPU_TABLES:
        if t in tables:
            db.execute(
                f"CREATE TABLE {t} AS SELECT g.* FROM s.{t} g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                "ON r.correlationId = g.correlationId AND (r.globalTid >> 24) = (g.globalPid >> 24)"
            )
    db.commit()
    db.execute("DETACH DATABASE s")
    db.execute("VACUUM")
    db.close()


if __name__ == "__main__":
    trim(sys.argv[1], sys.argv[2])
