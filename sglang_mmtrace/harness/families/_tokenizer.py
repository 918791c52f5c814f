"""Tokenizers for the family builders: a small locally trained BPE laid out on a family's real ids.

SGLang's multimodal processors look special tokens up by id (image pads, image start/end, breaks), so
each family's tokenizer must put them exactly where the published one does; nothing can be
downloaded, so the ordinary text tokens come from the byte-level BPE ``random_model`` trains on
stdlib files (4000 entries), and every other id of the real vocabulary is a filler token. Two
layouts occur: specials *after* the text vocabulary (Qwen2, GLM-4: added tokens appended at
151643 / 151329) and specials *first* (Mistral's Tekken: control tokens 0..999, text from 1000).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..random_model import BPE_VOCAB_SIZE, clean_tokenizer_config, train_bpe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2Tokenizer, TokenizersBackend

Vocab = dict[str, int]
Merges = list[tuple[str, str]]


def filler(i: int) -> str:
    """The filler token on id ``i``: printable ASCII that the byte-level decoder can render, and
    that encoding never produces (the pre-tokenizers split digits off), as in ``random_model``."""
    return f"<f{i}>"


def padded_vocab(size: int, bpe_offset: int = 0, reserved: Mapping[int, str] | None = None) -> tuple[Vocab, Merges]:
    """Ids ``0..size-1``: the trained BPE from ``bpe_offset``, ``reserved`` tokens on their ids,
    fillers everywhere else. Returns the vocabulary and the BPE merges."""
    reserved = dict(reserved or {})
    bpe, merges = train_bpe()
    if bpe_offset + BPE_VOCAB_SIZE > size or any(bpe_offset <= i < bpe_offset + BPE_VOCAB_SIZE for i in reserved):
        raise ValueError("reserved ids overlap the trained BPE, or it does not fit")
    vocab: Vocab = {tok: i + bpe_offset for tok, i in bpe.items()}
    vocab.update({content: i for i, content in reserved.items()})
    taken = set(vocab.values())
    vocab.update({filler(i): i for i in range(size) if i not in taken})
    if len(vocab) != size or sorted(vocab.values()) != list(range(size)):
        raise RuntimeError("filler or reserved tokens collided with trained BPE entries")
    return vocab, merges


def qwen2_tokenizer(
    added: Sequence[tuple[str, bool]], first_added_id: int, eos: str, pad: str, chat_template: str
) -> Qwen2Tokenizer:
    """A ``Qwen2Tokenizer``: BPE + fillers up to ``first_added_id``, then ``added`` (content, special)
    appended in order, so each lands on its real id.

    Pitfall (as in ``random_model``): ``Qwen2Tokenizer.__init__`` adds eos/pad as added tokens first,
    so it is created with the first added token (``<|endoftext|>``) as both, and the real eos/pad are
    set after all tokens are in place.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = padded_vocab(first_added_id)
    first = added[0][0]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=first, pad_token=first)
    for content, special in added[1:]:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)], special_tokens=special)
    tok.eos_token = eos
    tok.pad_token = pad
    tok.chat_template = chat_template
    return tok


def bytelevel_tokenizer(
    vocab: Vocab,
    merges: Merges,
    split_regex: str,
    specials: Sequence[str],
    chat_template: str,
    **special_tokens: Any,
) -> TokenizersBackend:
    """A fast tokenizer (``tokenizer.json`` as is) for families whose published tokenizer is one:
    byte-level BPE behind the family's split regex; ``specials`` are vocabulary entries registered
    as special added tokens (they keep their ids); ``special_tokens`` sets bos/eos/pad/unk."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)
    tok.chat_template = chat_template
    return tok


def assert_token_ids(tok: PreTrainedTokenizerBase, want: Mapping[str, int], markers: str = "") -> None:
    """Fail the build unless every token in ``want`` sits on its real id and ``markers`` (a run of
    special tokens) encodes as exactly those tokens, one id each."""
    got = {t: tok.convert_tokens_to_ids(t) for t in want}
    wrong = {t: (got[t], i) for t, i in want.items() if got[t] != i}
    if wrong:
        raise AssertionError(f"special token ids shifted (got, want): {wrong}")
    if markers:
        ids = tok.encode(markers, add_special_tokens=False)
        names = tok.convert_ids_to_tokens(ids)
        if "".join(names) != markers or any(n not in want for n in names):
            raise AssertionError(f"{markers!r} does not encode as single special tokens: {ids}")


def save_tokenizer(tok: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """Save ``tok`` without the run-time keys transformers 5 writes into tokenizer_config.json."""
    tok.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
