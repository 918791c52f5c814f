"""Run request plans against a target and turn each sent request into one output line:
the plugin's record for it (matched by rid = the response ``id``) plus a ``bench`` key.

A request that failed, or whose record never appeared, still gets a line (``bench.ok``,
``bench.error``, ``bench.record``), so errors are reported apart from latency. A plan's request
may say it expects no record (``extra["expect_record"] = False``: sent with the plugin switched
off); its line still says whether one turned up.
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


Route = Callable[[Planned], str]


def run_sequential(
    target: Target | None,
    plan: list[Planned],
    opts: Options,
    desc: str,
    route: Route | None = None,
    max_failures: int | None = None,
) -> list[Sent]:
    """One request in flight, in plan order (the plans interleave their variants).

    ``route(p)``, when given, runs before each request, outside the timed region (it flips the
    plugin's switch or resumes the request's server) and returns the base URL to send to. Sending
    stops early, keeping what was sent, at ``opts.deadline`` or after ``max_failures`` failed
    requests (a dead server); a note on stderr says so.
    """
    out: list[Sent] = []
    failures = 0
    with progress_bar(len(plan), desc) as tick:
        for p in plan:
            if opts.deadline is not None and time.time() > opts.deadline:
                print(f"[bench] {desc}: deadline reached after {len(out)} of {len(plan)} requests", file=sys.stderr)
                break
            messages = p.chat()  # before the route, whose idle gap then covers making them
            if route is not None:
                url = route(p)
            elif target is not None:
                url = target.base_url
            else:
                raise ValueError("run_sequential needs a target or a route")
            res = send(url, messages, opts.max_tokens_for(p.experiment), opts.timeout, warmup=p.warmup)
            out.append((p, res))
            tick()
            if not res.ok:
                failures += 1
                print(f"[bench] {desc}: request failed: {res.error}", file=sys.stderr, flush=True)
                if max_failures is not None and failures >= max_failures:
                    print(f"[bench] {desc}: {failures} failed requests, stopping", file=sys.stderr, flush=True)
                    break
    return out


def run_concurrent(target: Target, plan: list[Planned], clients: int, opts: Options, desc: str) -> list[Sent]:
    """``clients`` streaming clients at once, each taking the next request when its last one ends."""
    with progress_bar(len(plan), desc) as tick, ThreadPoolExecutor(max_workers=clients) as pool:

        def one(p: Planned) -> Sent:
            res = send(target.base_url, p.chat(), opts.max_tokens_for(p.experiment), opts.timeout, warmup=p.warmup)
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
        "expect_record": expects_record(p),
        "sent_unix_s": round(res.sent_unix_s, 6),
        "usage": usage_tokens(res.usage) if res.usage is not None else None,
        **p.extra,
    }


def expects_record(p: Planned) -> bool:
    return bool(p.extra.get("expect_record", True))


def to_lines(sent: Iterable[Sent], tail: RecordsTail, target: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Measured (non-warm-up) requests -> output lines, with their records where they exist.

    Waits (up to ``timeout``) only for the records the requests expect; a record that exists for a
    request that expected none is still attached (and shows as ``record: true``).
    """
    sent = [(p, r) for p, r in sent if not p.warmup]
    if tail.path:
        tail.wait([r.rid for p, r in sent if r.ok and r.rid and expects_record(p)], timeout=timeout)
    lines = []
    for p, res in sent:
        rec = tail.find(res.rid) if res.rid else None
        line: dict[str, Any] = dict(rec) if rec is not None else {"rid": res.rid}
        line["bench"] = bench_info(p, res, target, rec is not None)
        lines.append(line)
    return lines


def wait_idle(seconds: float = 0.5) -> None:
    """A short pause between phases so one phase's tail does not queue into the next."""
    time.sleep(seconds)
