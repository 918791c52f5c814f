"""A SentencePiece-style BPE vocabulary with special tokens on a family's real ids (Gemma, Llama).

Gemma and Llama ship SentencePiece BPE tokenizers ("▁" for spaces, ``<0x00>``..``<0xFF>`` byte
fallback); SGLang and the processors key on their special-token ids, not on the other pieces. No
tokenizer can be downloaded, so a small BPE is trained here on fixed stdlib text and laid out in a
vocabulary of the real size: specials on their real ids, byte tokens, the trained pieces, and
filler tokens (never produced by encoding) on every other id. Deterministic for a library version.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..random_model import corpus

BYTE_TOKENS: tuple[str, ...] = tuple(f"<0x{b:02X}>" for b in range(256))
"""SentencePiece's byte-fallback pieces, in byte order."""


def train_pieces(size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Train a "▁"-style BPE of ``size`` pieces on the stdlib corpus: its pieces (id order) and merges.

    Trained word by word (Metaspace split) so merges never cross a word boundary; the pieces and
    merges then work with Gemma's unsplit and Llama's Metaspace pre-tokenization alike.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=size, min_frequency=2, show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    return pieces, [(a, b) for a, b in merges]


def layout_vocab(size: int, specials: dict[int, str], pieces: list[str], byte_start: int) -> dict[str, int]:
    """A vocabulary of exactly ``size`` ids: ``specials`` on their ids, the 256 byte tokens from
    ``byte_start``, the trained ``pieces`` on the next free ids, filler tokens ``<fN>`` elsewhere.

    Fillers keep every id the published tokenizer has (the model's embedding rows and the special
    ids depend on it); nothing encodes to them, and they decode as their own text if sampled.
    """
    by_id: dict[int, str] = dict(specials)
    for i, tok in enumerate(BYTE_TOKENS):
        if byte_start + i in by_id:
            raise ValueError(f"byte token {tok} would overwrite special id {byte_start + i}")
        by_id[byte_start + i] = tok
    taken = set(by_id.values())
    free = (i for i in range(size) if i not in by_id)
    for piece in pieces:
        if piece not in taken:
            by_id[next(free)] = piece
            taken.add(piece)
    for i in free:
        by_id[i] = f"<f{i}>"
    vocab = {tok: i for i, tok in by_id.items()}
    if len(vocab) != size or sorted(vocab.values()) != list(range(size)):
        raise RuntimeError(f"vocabulary layout has {len(vocab)} distinct tokens, expected {size}")
    return vocab


def assert_ids(tokenizer: object, want: dict[str, int]) -> None:
    """Fail the build unless every token of ``want`` encodes to its real id (as one token)."""
    convert = tokenizer.convert_tokens_to_ids  # type: ignore[attr-defined]
    encode = tokenizer.encode  # type: ignore[attr-defined]
    wrong = {t: (convert(t), i) for t, i in want.items() if convert(t) != i}
    split = {t: encode(t, add_special_tokens=False) for t in want}
    split = {t: ids for t, ids in split.items() if ids != [want[t]]}
    if wrong or split:
        raise AssertionError(f"special tokens off their real ids (got, want): {wrong}; split on encode: {split}")


def write_bos_eos_flags(out_dir: Path) -> None:
    """Put ``add_bos_token: true, add_eos_token: false`` back into tokenizer_config.json.

    The published Gemma and Llama tokenizer configs carry both; transformers 5 leaves them out
    when saving, and SGLang then guesses them (utils/hf_transformers/tokenizer.py,
    ``_fix_v5_add_bos_eos_token``). Written out, nothing is left to a guess.
    """
    path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.update(add_bos_token=True, add_eos_token=False)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
