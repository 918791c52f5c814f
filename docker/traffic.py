"""Steady demo traffic for the CPU profile: the demo's reference requests, new images every round.

Each round sends a new image, the same image again, a different image with the same question and
the same image with the question first (``sglang_mmtrace.cli.demo.reference_requests``), then a
text-only request, so every dashboard panel has data within a minute or two.
"""

from __future__ import annotations

import itertools
import os
import sys
import time

from sglang_mmtrace.cli.demo import reference_requests
from sglang_mmtrace.harness import stream_chat


def main() -> int:
    base_url = os.environ.get("SGLANG_URL", "http://sglang:30000")
    pause = float(os.environ.get("TRAFFIC_PAUSE_S", "2"))
    text = [{"role": "user", "content": "Say something short about the sea."}]
    for round_no in itertools.count():
        for _, messages in [*reference_requests(round_no), ("text", text)]:
            try:
                stream_chat(base_url, messages, max_tokens=4)
            except OSError as exc:  # server restarting: keep going
                print(f"traffic: {exc}", file=sys.stderr, flush=True)
                time.sleep(5)
        time.sleep(pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
