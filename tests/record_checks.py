"""Checks on one per-request record, derived from the stage catalogue and from the request's input.

Every ``*_problems`` function returns a list of human-readable violations (empty = fine), so a test
can report all of them at once together with the record.

- Nesting comes from the catalogue's ``parent`` field: a stage lies inside its nearest ancestor that
  the record has (the root ``request`` is ``[0, ttft_s]``).
- Causal order: children of one parent are listed in the catalogue in request-path order
  (docs/contract.md's stage table is that order), so their first start times must not decrease.
- Prompt layout (where the image tokens are) is derived independently of the server: the model's
  own chat template and tokenizer render the messages, and each ``<|image_pad|>`` is expanded to
  the image's visual-token count, which follows from its size and the processor's patch geometry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sglang_mmtrace.harness import TOKEN_IDS
from sglang_mmtrace.stages import ROOT, STAGES, TOKENIZE, core_stage_names

TOL = 1e-6  # the record rounds times to 1e-9 s; allow a little more
CORE_STAGES: frozenset[str] = frozenset(core_stage_names())
MM_STAGES: frozenset[str] = frozenset(n for n in STAGES if n.startswith("mm."))
TRANSPORT_STAGES: frozenset[str] = frozenset(n for n in STAGES if n.startswith("transport."))
IMAGE_WORK_STAGES: frozenset[str] = frozenset({"mm.decode", "mm.resize_normalize"})
"""Per-image pixel work that a preprocessing-cache hit skips."""
ENCODER_STAGES: frozenset[str] = frozenset({"model.vision_encoder", "model.embed"})


# -- request input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Img:
    """One image sent in a request: its size, format and the exact encoded bytes."""

    width: int
    height: int
    fmt: str
    data: bytes


@dataclass
class Exchange:
    """One request as sent and answered, and the plugin's record of it."""

    label: str
    messages: list[dict[str, Any]]
    images: list[Img]
    rid: str
    usage: dict[str, Any]
    raw: bytes
    record: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None  # the request itself failed (then no record is looked for)

    def describe(self) -> str:
        return f"{self.label} (rid {self.rid})\nusage: {json.dumps(self.usage)}\nrecord: {pretty(self.record)}"


def pretty(record: dict[str, Any]) -> str:
    """A record with one line per stage, for failure messages."""
    head = {k: v for k, v in record.items() if k != "stages"}
    lines = [json.dumps(head)]
    for s in record.get("stages", ()):
        end = s["start_s"] + s["dur_s"]
        lines.append(
            f"  {s['name']:<24} {s['process']:<11} {s['start_s'] * 1e3:10.3f} -> {end * 1e3:10.3f} ms "
            f"{s['clock']} {json.dumps(s['attrs'])}"
        )
    return "\n".join(lines)


@cache
def processor_geometry(model_path: str) -> dict[str, int]:
    """Patch size, temporal patch size and spatial merge size of the model's image processor."""
    cfg = json.loads((Path(model_path) / "processor_config.json").read_text())["image_processor"]
    return {
        "patch": int(cfg["patch_size"]),
        "temporal": int(cfg["temporal_patch_size"]),
        "merge": int(cfg["merge_size"]),
        "min_pixels": int(cfg["size"]["shortest_edge"]),
    }


def visual_tokens(model_path: str, width: int, height: int) -> int:
    """Visual tokens of an image whose sides are multiples of patch*merge and that needs no resize.

    512x512 -> 256, 256x256 -> 64, 1024x768 -> 768 for patch 16, merge 2.
    """
    g = processor_geometry(model_path)
    unit = g["patch"] * g["merge"]
    if width % unit or height % unit or width * height < g["min_pixels"]:
        raise ValueError(f"{width}x{height} would be resized by the processor; pick sides that are multiples of {unit}")
    return (width // unit) * (height // unit)


def pixel_value_bytes(model_path: str, width: int, height: int) -> int:
    """Bytes of the processor's float32 ``pixel_values`` for one image (what the CPU hand-off carries):
    one row of ``3 * temporal * patch * patch`` values per patch, ``merge**2`` patches per visual token."""
    g = processor_geometry(model_path)
    patches = visual_tokens(model_path, width, height) * g["merge"] ** 2
    return patches * 3 * g["temporal"] * g["patch"] ** 2 * 4


@cache
def _template_and_tokenizer(model_path: str) -> tuple[Any, Any]:
    import jinja2
    import tokenizers

    template = jinja2.Environment().from_string((Path(model_path) / "chat_template.jinja").read_text())
    tokenizer = tokenizers.Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    return template, tokenizer


def prompt_layout(
    model_path: str, messages: Sequence[dict[str, Any]], per_image_tokens: Sequence[int]
) -> tuple[int, list[tuple[int, int]]]:
    """``(prompt_tokens, [(first, last) token index of each image])`` for the rendered prompt."""
    template, tokenizer = _template_and_tokenizer(model_path)
    text = template.render(messages=list(messages), add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pad = TOKEN_IDS["<|image_pad|>"]
    n, spans, k = 0, [], 0
    for tid in ids:
        if tid == pad:
            count = per_image_tokens[k]
            spans.append((n, n + count - 1))
            n += count
            k += 1
        else:
            n += 1
    if k != len(per_image_tokens):
        raise ValueError(f"template rendered {k} image placeholders for {len(per_image_tokens)} images")
    return n, spans


# -- record checks ---------------------------------------------------------------------------


def names(record: dict[str, Any]) -> list[str]:
    return [s["name"] for s in record["stages"]]


def ran(record: dict[str, Any]) -> list[str]:
    """Names of the stages that did work: a ``skipped`` marker (encoder made unnecessary) is not one."""
    return [s["name"] for s in record["stages"] if not s["attrs"].get("skipped")]


def skipped_encoder_problems(record: dict[str, Any], n_images: int) -> list[str]:
    """A request whose images all sit in the radix prefix carries exactly one zero-length
    ``model.vision_encoder`` marker with ``skipped`` true and its image count; any other carries none."""
    markers = [s for s in stages_named(record, "model.vision_encoder") if s["attrs"].get("skipped")]
    if not record["cache"]["image_prefix_hit"]:
        return [f"skipped encoder marker without an image prefix hit: {markers}"] if markers else []
    if len(markers) != 1:
        return [f"image prefix hit needs one skipped model.vision_encoder marker, got {len(markers)}"]
    m, problems = markers[0], []
    if m["dur_s"] != 0 or m["attrs"].get("images") != n_images or m["attrs"].get("embedding_cache") != "off":
        problems.append(f"skipped marker {m} should last 0 s, name {n_images} image(s), embedding_cache off")
    if any(not s["attrs"].get("skipped") for s in stages_named(record, "model.vision_encoder")):
        problems.append("the encoder both ran and was skipped")
    return problems


def stages_named(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in record["stages"] if s["name"] == name]


def one(record: dict[str, Any], name: str) -> dict[str, Any]:
    found = stages_named(record, name)
    assert len(found) == 1, f"expected exactly one {name!r} stage, got {len(found)}\n{pretty(record)}"
    return found[0]


def _end(s: dict[str, Any]) -> float:
    return s["start_s"] + s["dur_s"]


def stage_set_problems(
    record: dict[str, Any], absent: Iterable[str] = (), required: Iterable[str] | None = None
) -> list[str]:
    """Required stages present (default: every core (non-extra) stage not in ``absent``), ``absent`` ones absent,
    and nothing outside the catalogue."""
    absent = set(absent)
    required = set(required) if required is not None else set(CORE_STAGES - absent)
    have = set(ran(record))
    problems = []
    if missing := sorted(required - have):
        problems.append(f"missing stages: {missing}")
    if extra := sorted(absent & have):
        problems.append(f"stages that must be absent: {extra}")
    if unknown := sorted(have - set(STAGES)):
        problems.append(f"stages not in the catalogue: {unknown}")
    return problems


def repeated_stage_problems(record: dict[str, Any]) -> list[str]:
    """A stage appears once per request; only the catalogue's per-image stages may repeat (once per
    image). Two intervals of one stage would make Prometheus count the request twice."""
    seen: dict[str, int] = {}
    for s in record["stages"]:
        seen[s["name"]] = seen.get(s["name"], 0) + 1
    return [
        f"{name} appears {n} times"
        for name, n in seen.items()
        if n > 1 and not (name in STAGES and STAGES[name].per_image)
    ]


def catalogue_problems(record: dict[str, Any], device_clock: str = "host") -> list[str]:
    """Each stage's ``process`` is its catalogue process; clocks are host clocks on this CPU server."""
    problems = []
    for s in record["stages"]:
        st = STAGES.get(s["name"])
        if st is None:
            problems.append(f"{s['name']}: not in the catalogue")
            continue
        if s["process"] != st.process:
            problems.append(f"{s['name']}: process {s['process']!r}, catalogue says {st.process!r}")
        if s["clock"] != device_clock:
            problems.append(f"{s['name']}: clock {s['clock']!r}, expected {device_clock!r} (no GPU here)")
        if s["dur_s"] < 0:
            problems.append(f"{s['name']}: negative duration {s['dur_s']}")
    return problems


def bounds_problems(record: dict[str, Any]) -> list[str]:
    """Every stage interval lies inside ``[0, ttft_s]``; the root is exactly that interval."""
    ttft = record["ttft_s"]
    if ttft is None:
        return ["ttft_s is null"]
    problems = []
    root = stages_named(record, ROOT)
    if len(root) != 1:
        problems.append(f"{len(root)} root stages")
    elif abs(root[0]["start_s"]) > TOL or abs(root[0]["dur_s"] - ttft) > TOL:
        problems.append(f"root stage {root[0]['start_s']}+{root[0]['dur_s']} is not [0, ttft_s={ttft}]")
    for s in record["stages"]:
        if s["start_s"] < -TOL or _end(s) > ttft + TOL:
            problems.append(
                f"{s['name']} [{s['start_s']:.6f}, {_end(s):.6f}] s is outside [0, ttft_s={ttft:.6f}] "
                f"(by {max(-s['start_s'], _end(s) - ttft) * 1e3:.3f} ms)"
            )
    return problems


def _ancestor(name: str, present: set[str]) -> str | None:
    parent = STAGES[name].parent
    while parent is not None and parent not in present:
        parent = STAGES[parent].parent
    return parent


def order_problems(record: dict[str, Any]) -> list[str]:
    """Nesting inside the nearest present catalogue ancestor, and request-path order of siblings."""
    stages = [s for s in record["stages"] if s["name"] in STAGES]
    present = {s["name"] for s in stages}
    ttft = record["ttft_s"]
    hull: dict[str, tuple[float, float]] = {}
    for s in stages:
        lo, hi = hull.get(s["name"], (s["start_s"], _end(s)))
        hull[s["name"]] = (min(lo, s["start_s"]), max(hi, _end(s)))
    if ttft is not None:
        hull[ROOT] = (0.0, ttft)
    problems = []
    for s in stages:
        if s["name"] == ROOT:
            continue
        anc = _ancestor(s["name"], present | {ROOT})
        if anc is None or anc == ROOT or anc not in hull:
            continue  # the root bound is bounds_problems' job
        lo, hi = hull[anc]
        if s["start_s"] < lo - TOL or _end(s) > hi + TOL:
            problems.append(
                f"{s['name']} [{s['start_s']:.6f}, {_end(s):.6f}] not inside its parent {anc} [{lo:.6f}, {hi:.6f}]"
            )
    # siblings, by nearest present ancestor, in catalogue order: first start times never decrease
    first_start: dict[str, float] = {}
    for s in stages:
        first_start[s["name"]] = min(first_start.get(s["name"], s["start_s"]), s["start_s"])
    groups: dict[str | None, list[str]] = {}
    for name in STAGES:  # catalogue order
        if name in present and name != ROOT:
            groups.setdefault(_ancestor(name, present | {ROOT}), []).append(name)
    for parent, kids in groups.items():
        for a, b in zip(kids, kids[1:], strict=False):
            if first_start[b] < first_start[a] - TOL:
                problems.append(
                    f"under {parent}: {b} starts at {first_start[b]:.6f} before {a} at {first_start[a]:.6f} "
                    f"(catalogue/request-path order is {a} then {b})"
                )
    return problems


def usage_problems(record: dict[str, Any], usage: dict[str, Any]) -> list[str]:
    """prompt/cached tokens equal SGLang's own ``usage`` for the same request."""
    problems = []
    details = usage.get("prompt_tokens_details") or {}
    if record["prompt_tokens"] != usage["prompt_tokens"]:
        problems.append(f"prompt_tokens {record['prompt_tokens']} != usage.prompt_tokens {usage['prompt_tokens']}")
    if record["cached_tokens"] != details.get("cached_tokens"):
        problems.append(
            f"cached_tokens {record['cached_tokens']} != usage.prompt_tokens_details.cached_tokens "
            f"{details.get('cached_tokens')}"
        )
    if record["output_tokens"] != usage.get("completion_tokens"):
        problems.append(
            f"output_tokens {record['output_tokens']} != usage.completion_tokens {usage.get('completion_tokens')}"
        )
    return problems


def exchange_problems(ex: Exchange, model_path: str) -> list[str]:
    """Content checks every successful request gets: status, tokens equal to ``usage``, the
    ``image_prefix_hit`` the token layout implies, per-image sizes/visual tokens/bytes, transport."""
    rec = ex.record
    problems: list[str] = []
    if rec["status"] != "ok" or rec["error"] is not None:
        problems.append(f"status {rec['status']!r} error {rec['error']!r}, expected ok/null")
    problems += usage_problems(rec, ex.usage)
    per_image = [visual_tokens(model_path, im.width, im.height) for im in ex.images]
    n_prompt, spans = prompt_layout(model_path, ex.messages, per_image)
    if n_prompt != ex.usage["prompt_tokens"]:
        problems.append(
            f"derived prompt length {n_prompt} != usage.prompt_tokens {ex.usage['prompt_tokens']} (test bug?)"
        )
    expect_hit = bool(spans) and rec["cached_tokens"] > max(last for _, last in spans)
    if rec["cache"]["image_prefix_hit"] is not expect_hit:
        problems.append(
            f"image_prefix_hit {rec['cache']['image_prefix_hit']} but cached_tokens {rec['cached_tokens']} "
            f"vs image token spans {spans} says {expect_hit}"
        )
    problems += skipped_encoder_problems(rec, len(ex.images))
    prefix = stages_named(rec, "scheduler.prefix_match")
    if prefix and prefix[0]["attrs"].get("image_prefix_hit") is not rec["cache"]["image_prefix_hit"]:
        problems.append("scheduler.prefix_match attrs.image_prefix_hit disagrees with cache.image_prefix_hit")
    want_images = [
        {"width": im.width, "height": im.height, "visual_tokens": vt, "bytes": len(im.data)}
        for im, vt in zip(ex.images, per_image, strict=True)
    ]
    got_images = [{k: i.get(k) for k in ("width", "height", "visual_tokens", "bytes")} for i in rec["images"]]
    if got_images != want_images:
        problems.append(f"images {got_images} != expected {want_images}")
    if ex.images:
        image_tokens = (ex.usage.get("prompt_tokens_details") or {}).get("image_tokens")
        if image_tokens is not None and sum(per_image) != image_tokens:
            problems.append(f"usage image_tokens {image_tokens} != derived {sum(per_image)} (test bug?)")
        want_bytes = sum(pixel_value_bytes(model_path, im.width, im.height) for im in ex.images)
        if rec["transport"] != {"mode": "cpu", "bytes": want_bytes}:
            problems.append(
                f"transport {rec['transport']} != {{'mode': 'cpu', 'bytes': {want_bytes}}} (float32 pixel values)"
            )
        prep = stages_named(rec, "transport.prepare")
        if sum(int(s["attrs"].get("bytes", 0)) for s in prep) != rec["transport"]["bytes"] or any(
            s["attrs"].get("mode") != rec["transport"]["mode"] for s in prep
        ):
            problems.append("transport.prepare attrs disagree with the record's transport")
        recv = stages_named(rec, "scheduler.recv")
        if [{k: s["attrs"].get(k) for k in ("mode", "bytes")} for s in recv] != [rec["transport"]]:
            problems.append(
                f"scheduler.recv attrs {[s['attrs'] for s in recv]} should carry the transport {rec['transport']}"
            )
        hashes = [i["content_hash"] for i in rec["images"]]
        if len(set(hashes)) != len({im.data for im in ex.images}) or not all(isinstance(h, str) and h for h in hashes):
            problems.append(f"content hashes {hashes} do not match the distinct images sent")
    elif rec["transport"] != {"mode": "none", "bytes": 0} or rec["images"]:
        problems.append(f"text-only request with transport {rec['transport']} images {rec['images']}")
    return problems


def ok_record(rid: str, ttft_s: float = 0.1, tokenize_s: float | None = None) -> dict[str, Any]:
    """A minimal ok record as the contract writes it: the root and ``tokenize`` (all of TTFT unless
    ``tokenize_s`` says otherwise), for tests of the readers (``report``) that need no server."""
    stage = {"process": "api", "start_s": 0.0, "clock": "host", "attrs": {}}
    return {
        "rid": rid,
        "status": "ok",
        "arrival_unix_s": 1_700_000_000.0,
        "ttft_s": ttft_s,
        "images": [],
        "cache": {"preprocess": "off", "embedding": "off", "image_prefix_hit": False},
        "stages": [
            {"name": ROOT, "dur_s": ttft_s, **stage},
            {"name": TOKENIZE, "dur_s": ttft_s if tokenize_s is None else tokenize_s, **stage},
        ],
        "coverage": 1.0,
    }


def image_cache(preprocess: str, embedding: str, prefix_hit: bool) -> dict[str, Any]:
    """A one-image request's ``cache`` (join.outcomes): the outcomes, and the image's own entry."""
    return {
        "preprocess": preprocess,
        "embedding": embedding,
        "image_prefix_hit": prefix_hit,
        "modalities": {"image": {"items": 1, "embedding": embedding, "in_prefix": prefix_hit}},
    }
