"""The wrappers' floor: the plugin with every gated hook reduced to a bare timed pass-through.

An experiment for issue 11: does the plugin's cost come from the hooked calls themselves (one more
Python frame and two clock reads per call, the floor of any hook-based tracer) or from the work the
hooks do (finding the trace, storing times, CUDA marks, shipping events)? The skeleton's hooks sit on
the same targets, are switched by the same gates and call SGLang's function exactly once, but do
nothing else (no trace, no record, no mark). Set-up hooks (``gated=False``) and the ASGI middleware
(which serves the switch) stay as built.

Not part of the package: ``python benchmarks/skeleton.py DIR`` rewrites the copy of the plugin under
``DIR`` (``DIR/sglang_mmtrace``: a ``git archive`` tree, whose own ``benchmarks.hotpath`` then measures
it, or a ``pip install --target`` directory used by one server launch).
"""

from __future__ import annotations

import sys
from pathlib import Path

PATCH = """

# --- benchmarks/skeleton.py: every gated hook a bare timed pass-through (an experiment) ---
def _skeleton(component: str) -> HookSpec:
    import time

    from ..patch import Direct

    now = time.perf_counter
    times: list[float] = []

    def make(kind: str) -> Direct:
        def build(func, on, bound):
            if kind == "async":

                async def async_hook(*args, **kwargs):
                    if not on:
                        return await func(*args, **kwargs)
                    t0 = now()
                    try:
                        return await func(*args, **kwargs)
                    finally:
                        times.append(now() - t0)
                        if len(times) > 4096:
                            times.clear()

                return async_hook

            def sync_hook(*args, **kwargs):
                if not on:
                    return func(*args, **kwargs)
                t0 = now()
                try:
                    return func(*args, **kwargs)
                finally:
                    times.append(now() - t0)
                    if len(times) > 4096:
                        times.clear()

            return sync_hook

        return Direct(build)

    return HookSpec(component, make=make)


for _id, _spec in list(HOOKS.items()):
    if _spec.gated and _spec.make is not None and not _spec.nvtx_only:
        HOOKS[_id] = _skeleton(_id)
"""


def main(root: str) -> None:
    registry = Path(root) / "sglang_mmtrace" / "hooks" / "registry.py"
    text = registry.read_text()
    if "benchmarks/skeleton.py" not in text:
        registry.write_text(text + PATCH)
    print(f"skeleton hooks patched into {registry}")


if __name__ == "__main__":
    main(sys.argv[1])
