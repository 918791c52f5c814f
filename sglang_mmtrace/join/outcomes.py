"""A record's cache outcomes, decided from evidence only: the one place they are written.

A cache outcome is a claim about what SGLang did for the request, so each one is written only where
something SGLang did for this request and this modality proves it; otherwise it is ``None`` and the
record's ``cache.reasons`` says what was missing. The absence of a call is never evidence on its own:
a model whose forward does not go through SGLang's generic embedding routine makes no lookup and
calls no hooked encoder, and that silence says nothing about its cache.

The evidence, per modality, joined over the request's prefill forwards:

- ``Placement`` (the scheduler, at admission): where the request's items lie in its prompt against the
  radix prefix it adopted, from the items' own offsets or, where a model sets none, from the runs of
  their pad values in the prompt's token ids.
- ``Embedding`` (the scheduler, per forward): the items that overlapped the forward's extend, and of
  those the ones proved a hit or a miss: the first lookup of the item's hash in SGLang's embedding
  cache during that forward (SGLang looks each overlapping item up once before it encodes the misses;
  a later lookup of the same hash finds what the forward itself inserted), and the items handed to an
  observed encoder call (a miss, whatever a lookup said: a cached entry of the wrong length is
  discarded and encoded again). A lookup that found an entry proves a hit only where the modality's
  encoder is hooked on the served model, for only then would that re-encoding have been seen.

Truth table of ``cache.embedding`` for one modality (first row that applies):

| evidence                                                           | outcome |
|--------------------------------------------------------------------|---------|
| an item was encoded, or its first lookup found nothing             | miss    |
| every item is placed inside the adopted radix prefix               | off     |
| items overlapped an extend, and each one's first lookup was a hit  | hit     |
| anything else (nothing observed, some items unproved, not placed)  | None    |

The request's ``cache.embedding`` combines its modalities: ``miss`` if any is, ``off`` if all are,
``hit`` if all are ``hit`` or ``off``, else ``None``. A request that carried no media item is ``off``:
its own fields say that no embedding was needed.

``cache.image_prefix_hit`` (every media item inside the adopted prefix): ``True`` when all are placed
inside, ``False`` when one placed item lies outside it (or the request carried none), ``None`` when
some item could not be placed and none is known to lie outside.

``cache.preprocess``: ``hit`` / ``miss`` from the preprocessing cache's lookups seen for the request
(any miss is ``miss``); ``off`` when none was seen, which is evidence here because the lookup hook is
applied to the processor class that serves the request and only Qwen-VL's artifact pipeline has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODALITIES = ("image", "video", "audio")
"""SGLang's media modalities as the record names them (``Modality.<NAME>.lower()``)."""


@dataclass(slots=True)
class Placement:
    """Where one modality's items lie against the adopted radix prefix (``scheduler.prefix_match``)."""

    items: int = 0
    """Items of the modality in the request."""
    in_prefix: int = 0
    """Placed items whose every span ends inside the adopted prefix."""
    unplaced: int = 0
    """Items whose positions in the prompt are unknown (no offsets and no pad-value run)."""


@dataclass(slots=True)
class Embedding:
    """What the request's prefill forwards proved about one modality's embeddings (``model.embed``)."""

    needed: int = 0
    """Item overlaps with an extend (an item spanning two chunks counts in each forward)."""
    hit: int = 0
    """Of those, proved hits: the first lookup found an entry, the encoder is hooked, and it did not run."""
    miss: int = 0
    """Of those, proved misses: handed to an encoder call, or the first lookup found nothing."""
    encoded: bool = False
    """An observed encoder call took one of the request's items of this modality."""


@dataclass(slots=True)
class Evidence:
    """Everything a request's record may claim its cache outcomes from."""

    carried: dict[str, int] = field(default_factory=dict)
    """Items per modality in the request as received (the API process's view)."""
    placement: dict[str, Placement] | None = None
    """Per modality, from the scheduler's admission; None where the scheduler's hooks saw no admission."""
    embedding: dict[str, Embedding] = field(default_factory=dict)
    """Per modality, summed over the request's forwards."""
    preprocess: tuple[str, ...] = ()
    """The preprocessing-cache lookups seen for the request (``hit`` / ``miss``), in order."""


@dataclass(slots=True)
class Outcomes:
    """The record's ``cache`` object (``as_record``)."""

    preprocess: str | None
    embedding: str | None
    image_prefix_hit: bool | None
    modalities: dict[str, dict[str, Any]]
    reasons: dict[str, str]

    def as_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "preprocess": self.preprocess,
            "embedding": self.embedding,
            "image_prefix_hit": self.image_prefix_hit,
        }
        if self.modalities:
            out["modalities"] = self.modalities
        if self.reasons:
            out["reasons"] = self.reasons
        return out


def modality_embedding(p: Placement | None, e: Embedding | None) -> tuple[str | None, str | None]:
    """(outcome, reason when None) for one modality: the truth table's rows, in order."""
    if e is not None and (e.encoded or e.miss > 0):
        return "miss", None
    if p is not None and p.items > 0 and p.unplaced == 0 and p.in_prefix == p.items:
        return "off", None
    if e is not None and e.needed > 0 and e.hit == e.needed:
        return "hit", None
    if e is None or e.needed == 0:
        return None, "no embedding-cache lookup or encoder call was observed for its items"
    return None, f"{e.needed - e.hit} of {e.needed} item embeddings were neither a proved hit nor a miss"


def prefix_hit_of(placement: dict[str, Placement]) -> bool | None:
    """Whether every media item lies inside the adopted prefix: ``False`` when a placed one lies outside
    (or there is none), ``None`` when some item could not be placed and none is known to lie outside."""
    if any(p.items - p.unplaced - p.in_prefix > 0 for p in placement.values()):
        return False
    if not any(p.items for p in placement.values()):
        return False
    if any(p.unplaced for p in placement.values()):
        return None
    return True


def prefix_hit(evidence: Evidence) -> tuple[bool | None, str | None]:
    """``image_prefix_hit`` and, when None, why."""
    if not sum(evidence.carried.values()):
        return False, None
    if evidence.placement is None:
        return None, "the scheduler's admission of the request was not observed"
    if not any(p.items for p in evidence.placement.values()):
        return None, "the scheduler saw no media item of the request"
    hit = prefix_hit_of(evidence.placement)
    return hit, "the positions of some items in the prompt are unknown" if hit is None else None


def decide(evidence: Evidence) -> Outcomes:
    """The record's cache outcomes from ``evidence`` (the module's truth tables)."""
    reasons: dict[str, str] = {}
    modalities: dict[str, dict[str, Any]] = {}
    placement = evidence.placement or {}
    carried = [m for m in MODALITIES if evidence.carried.get(m)]
    for m in carried:
        p = placement.get(m)
        outcome, why = modality_embedding(p, evidence.embedding.get(m))
        modalities[m] = {
            "items": evidence.carried[m],
            "embedding": outcome,
            "in_prefix": None if p is None or p.unplaced or not p.items else p.in_prefix == p.items,
        }
        if why is not None:
            modalities[m]["reason"] = why
    embedding = combine([modalities[m]["embedding"] for m in carried]) if carried else "off"
    if embedding is None:
        reasons["embedding"] = "; ".join(
            f"{m}: {modalities[m]['reason']}" for m in carried if "reason" in modalities[m]
        )
    hit, why = prefix_hit(evidence)
    if why is not None:
        reasons["image_prefix_hit"] = why
    pre = evidence.preprocess
    preprocess = ("miss" if "miss" in pre else "hit") if pre else "off"
    return Outcomes(preprocess, embedding, hit, modalities, reasons)


def combine(outcomes: list[str | None]) -> str | None:
    """The request's embedding outcome from its modalities' (see the module docstring)."""
    if "miss" in outcomes:
        return "miss"
    if None in outcomes:
        return None
    if all(o == "off" for o in outcomes):
        return "off"
    return "hit"
