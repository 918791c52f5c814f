"""``python -m sglang_mmtrace.harness.families OUT_DIR [--family F] [--shape S]`` (``families.main``)."""

from . import main

raise SystemExit(main())
