"""Run request plans against a target and turn each sent request into one output line:
the plugin's record for it (matched by rid = the response ``id``) plus a ``bench`` key.

A request that failed, or whose record never appeared, still gets a line (``bench.ok``,
``bench.error``, ``bench.record``), so errors are reported apart from latency.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from .client import ChatResult, send, usage_tokens
from .experiments import Options, Planned
from .records import RecordsTail
from .targets import Target

Sent = tuple[Planned, ChatResult]


@contextmanager
def progress_bar(total: int, desc: str) -> Iterator[Callable[[], None]]:
    """A tqdm bar on stderr when it is a terminal; a no-op otherwise (logs stay clean)."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()


def run_sequential(target: Target, plan: list[Planned], opts: Options, desc: str) -> list[Sent]:
    """One request in flight, in plan order (the plans interleave their variants)."""
    out: list[Sent] = []
    with progress_bar(len(plan), desc) as tick:
        for p in plan:
            out.append((p, send(target.base_url, p.messages, opts.max_tokens, opts.timeout)))
            tick()
    return out


def run_concurrent(target: Target, plan: list[Planned], clients: int, opts: Options, desc: str) -> list[Sent]:
    """``clients`` streaming clients at once, each taking the next request when its last one ends."""
    with progress_bar(len(plan), desc) as tick, ThreadPoolExecutor(max_workers=clients) as pool:

        def one(p: Planned) -> Sent:
            res = send(target.base_url, p.messages, opts.max_tokens, opts.timeout)
            tick()
            return p, res

        return list(pool.map(one, plan))


def bench_info(p: Planned, res: ChatResult, target: str, record: bool) -> dict[str, Any]:
    return {
        "experiment": p.experiment,
        "variant": p.variant,
        "variant_index": p.variant_index,
        "group": p.group,
        "round": p.round,
        "target": target,
        "client_ttft_s": res.ttft_s,
        "client_e2e_s": res.e2e_s,
        "ok": res.ok,
        "error": res.error,
        "record": record,
        "sent_unix_s": round(res.sent_unix_s, 6),
        "usage": usage_tokens(res.usage) if res.usage is not None else None,
        **p.extra,
    }


def to_lines(
    sent: Iterable[Sent], tail: RecordsTail, target: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Measured (non-warm-up) requests -> output lines, with their records where they exist."""
    sent = [(p, r) for p, r in sent if not p.warmup]
    found = tail.wait([r.rid for _, r in sent if r.ok and r.rid], timeout=timeout) if tail.path else {}
    lines = []
    for p, res in sent:
        rec = found.get(res.rid) if res.rid else None
        line: dict[str, Any] = dict(rec) if rec is not None else {"rid": res.rid}
        line["bench"] = bench_info(p, res, target, rec is not None)
        lines.append(line)
    return lines


def wait_idle(seconds: float = 0.5) -> None:
    """A short pause between phases so one phase's tail does not queue into the next."""
    time.sleep(seconds)
