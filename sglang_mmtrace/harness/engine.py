"""Drive the offline ``sglang.Engine`` on the CPU with image prompts (test harness; the plugin never
imports it).

``python -m sglang_mmtrace.harness.engine OUT.json -- <SGLang server flags>`` builds the Engine in this
process from the same flags and environment as ``CpuServer`` (``CpuServer.prepare``/``server_flags``),
makes four calls (a new image, the same image again, ``async_generate`` with another image, a batch of
two prompts in one ``generate``), waits until the plugin's JSONL has a record per request, shuts the
Engine down and writes SGLang's own per-request numbers (``meta_info``) and each call's wall-clock
bounds to ``OUT.json``. The plugin is installed by the Engine itself (its ``load_plugins()``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .images import data_url, make_image

QUESTION = "What is in this image?"
SAMPLING = {"max_new_tokens": 4, "temperature": 0}
RECORD_WAIT_S = 120.0


def image_prompt(model_path: str, question: str = QUESTION) -> str:
    """The model's chat template applied to one image and ``question`` (the Engine takes raw prompts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _calls(kind: str, out: Any, t_before: float, t_after: float) -> list[dict[str, Any]]:
    return [
        {
            "kind": kind,
            "rid": o["meta_info"]["id"],
            "prompt_tokens": o["meta_info"]["prompt_tokens"],
            "cached_tokens": o["meta_info"].get("cached_tokens", 0),
            "completion_tokens": o["meta_info"]["completion_tokens"],
            "t_before": t_before,
            "t_after": t_after,
        }
        for o in (out if isinstance(out, list) else [out])
    ]


def drive(flags: list[str], out_path: Path) -> None:
    import sglang
    from sglang.srt.server_args import prepare_server_args

    from ..bench.records import RecordsTail

    engine = sglang.Engine(server_args=prepare_server_args(flags))
    try:
        prompt = image_prompt(engine.server_args.model_path)
        a, b, c = (data_url(make_image(256, 256, seed=seed)) for seed in (4100, 4101, 4102))
        calls: list[dict[str, Any]] = []

        def timed(kind: str, fn: Any) -> None:
            t0 = time.time()
            result = fn()
            calls.extend(_calls(kind, result, t0, time.time()))

        timed("new image", lambda: engine.generate(prompt, SAMPLING, image_data=a))
        timed("same image again", lambda: engine.generate(prompt, SAMPLING, image_data=a))
        timed(
            "async_generate, new image",
            lambda: engine.loop.run_until_complete(engine.async_generate(prompt, SAMPLING, image_data=b)),
        )
        timed("batch", lambda: engine.generate([prompt, prompt], SAMPLING, image_data=[[b], [c]]))
        tail = RecordsTail(os.environ.get("SGLANG_MMTRACE_JSONL"), from_start=True)
        tail.wait([call["rid"] for call in calls], RECORD_WAIT_S)
        out_path.write_text(json.dumps({"calls": calls}))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    args = sys.argv[1:]
    split = args.index("--")
    drive(args[split + 1 :], Path(args[0]))
