"""LLaVA-1.5 in the original checkpoint layout (liuhaotian/llava-v1.5-7b): ``LlavaLlamaForCausalLM``.

The published checkpoint is a Vicuna (Llama) model with an ``mlp2x_gelu`` projector
(``model.mm_projector.0`` / ``.2``), its config flat (Llama keys at the top level, ``model_type``
``llava``, ``mm_*`` keys) and *no* vision tower: ``mm_vision_tower`` names the CLIP ViT-L/14-336 repo
and the loader fetches it. SGLang serves it with ``models/llava.py`` (``LlavaLlamaForCausalLM``),
whose ``load_weights`` calls ``CLIPVisionModel.from_pretrained(config.mm_vision_tower)`` (any path
containing ``clip``), and preprocesses with ``multimodal/processors/llava.py`` (``LlavaImageProcessor``:
pad to a square in the image mean, then the tower's ``CLIPImageProcessor``, 336 px).

Offline, the tower lives in the checkpoint's own ``clip-vit-large-patch14-336/`` folder (a tiny
CLIP, random weights, with the published preprocessor settings) and ``mm_vision_tower`` is that
folder's absolute path: the loader resolves a relative path against the server's working directory,
not the model's. A build into a ``cached_build`` temporary folder (``NAME.tmp-XXXX``, renamed to
``NAME`` when done) writes the path the folder will have after the rename.

SGLang keys the image on ``<image>`` = ``image_token_index`` 32000 (the ``LlavaConfig`` default) in
the prompt; the published tokenizer is Llama's 32000 entries without it, so the SGLang recipe
served this checkpoint with ``--tokenizer-path llava-hf/llava-1.5-7b-hf``. The build ships that
tokenizer (Llama's 32000 ids + ``<image>`` 32000, ``<pad>`` 32001) and its ``LlavaProcessor`` in the
checkpoint folder itself, so no second path is needed; the prompt comes from SGLang's built-in
``vicuna_v1.1`` conversation (``--chat-template vicuna_v1.1``: the model path's name does not match
SGLang's ``llava-v1.5`` pattern). Each image becomes 576 ``<image>`` positions (24 x 24 patches of 14 px).

The shared pieces (tokenizer, CLIP tower and image processor, chat template) are the llava-hf
layout's too (``llava_hf``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...stages import MM_DECODE, MM_EXPAND, MM_LOAD, MM_RESIZE_NORMALIZE
from ..random_model import clean_tokenizer_config, random_weights
from . import TINY_TEXT, Family
from ._checkpoint import nest_vision_model
from ._sentencepiece import assert_ids, layout_vocab, train_pieces, write_bos_eos_flags

if TYPE_CHECKING:
    from transformers import CLIPVisionConfig, LlamaTokenizer, LlavaProcessor

BUILDER_VERSION = "llava15/1"

VOCAB_SIZE = 32000
"""The original checkpoint's embedding rows: Llama 2's vocabulary (llava-hf pads its copy to 32064)."""
BPE_PIECES = 4000
SPECIALS: dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
"""Llama 2's SentencePiece specials on their published ids; the 256 byte pieces follow from id 3."""
BYTE_START = 3
ADDED: dict[str, int] = {"<image>": 32000, "<pad>": 32001}
"""llava-hf's added tokens, after the Llama vocabulary (``image_token_index`` 32000, ``pad_token_id`` 32001)."""
IMAGE_TOKEN_ID = ADDED["<image>"]
IMAGE_SIZE, PATCH_SIZE = 336, 14
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 576: the CLS token is dropped ("patch" / "default")
CLIP_MEAN: list[float] = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD: list[float] = [0.26862954, 0.26130258, 0.27577711]
TOWER_DIR = "clip-vit-large-patch14-336"
"""The tower's folder in the checkpoint, named after the published repo (the loader needs ``clip`` in it)."""
CHAT_TEMPLATE_NAME = "vicuna_v1.1"
"""SGLang's conversation for LLaVA-1.5 (``parser/conversation.py``), as its recipe passes it."""

TEXT: dict[str, Any] = {**TINY_TEXT, "num_key_value_heads": TINY_TEXT["num_attention_heads"]}
"""Tiny Vicuna sizes; multi-head attention (KV heads = heads) as Llama-2-7B / Vicuna-7B."""
VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
"""Tiny CLIP ViT sizes (published ViT-L/14-336: 1024 wide, 24 layers, 16 heads, MLP 4096); image and patch stay real."""
SELECT_LAYER = -2
"""``mm_vision_select_layer`` / ``vision_feature_layer``: the penultimate layer's output, as published."""

# llava-hf/llava-1.5-7b-hf's chat template: "USER: " then every image as "<image>\n", then the texts
# each followed by a space, "ASSISTANT:" to prompt a reply.
CHAT_TEMPLATE: str = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def build_tokenizer() -> LlamaTokenizer:
    """llava-hf's tokenizer: Llama 2's layout (specials, byte pieces, a trained BPE, fillers to 32000),
    ``<image>`` 32000 and ``<pad>`` 32001 added; bos added, eos not."""
    from tokenizers import AddedToken
    from transformers import LlamaTokenizer

    pieces, merges = train_pieces(BPE_PIECES)
    vocab = layout_vocab(VOCAB_SIZE, {i: t for t, i in SPECIALS.items()}, pieces, BYTE_START)
    tok = LlamaTokenizer(
        vocab=vocab,
        merges=merges,
        legacy=False,
        add_prefix_space=None,
        add_bos_token=True,
        add_eos_token=False,
        pad_token=None,
    )
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED], special_tokens=True)
    tok.pad_token = "<pad>"
    tok.model_max_length = 4096
    tok.chat_template = CHAT_TEMPLATE
    assert_tokenizer(tok)
    return tok


def assert_tokenizer(tok: Any) -> None:
    """Fail the build unless bos/eos/pad/unk and ``<image>`` sit on their published ids."""
    assert_ids(tok, ADDED)
    got = (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    if got != (0, 1, 2, ADDED["<pad>"]):
        raise AssertionError(f"unk/bos/eos/pad ids are {got}")
    if len(tok) != VOCAB_SIZE + len(ADDED):
        raise AssertionError(f"tokenizer has {len(tok)} entries, want {VOCAB_SIZE + len(ADDED)}")


def vision_config() -> CLIPVisionConfig:
    """openai/clip-vit-large-patch14-336's tower config at tiny widths."""
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        **VISION,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        num_channels=3,
        projection_dim=768,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
        attention_dropout=0.0,
        initializer_factor=1.0,
        initializer_range=0.02,
        dtype="float16",
    )


def image_processor() -> Any:
    """The CLIP ViT-L/14-336 preprocessor: shortest edge to 336 (bicubic), centre crop 336, CLIP mean/std."""
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": IMAGE_SIZE},
        resample=3,  # bicubic
        do_center_crop=True,
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        do_convert_rgb=True,
    )


def build_processor(tokenizer: LlamaTokenizer) -> LlavaProcessor:
    """llava-hf's ``LlavaProcessor``: one ``<image>`` becomes 576 (24 x 24 patches; CLS dropped)."""
    from transformers import LlavaProcessor

    return LlavaProcessor(
        image_processor=image_processor(),
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        image_token="<image>",
        num_additional_image_tokens=1,
    )


def verify_processor(out_dir: Path, want_prompt: str) -> None:
    """Reload the saved processor as SGLang will; check ids, the rendered prompt and the 576 image tokens."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(out_dir, local_files_only=True)
    assert_tokenizer(processor.tokenizer)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if text != want_prompt:
        raise AssertionError(f"chat template rendered {text!r}, want {want_prompt!r}")
    out = processor(text=text, images=[Image.new("RGB", (256, 256))], return_tensors="pt")
    ids = list(out["input_ids"][0])
    if ids[0] != SPECIALS["<s>"] or ids.count(IMAGE_TOKEN_ID) != IMAGE_TOKENS:
        raise AssertionError(f"prompt starts {ids[:3]}, has {ids.count(IMAGE_TOKEN_ID)} image tokens")
    if tuple(out["pixel_values"].shape[-2:]) != (IMAGE_SIZE, IMAGE_SIZE):
        raise AssertionError(f"pixel_values {tuple(out['pixel_values'].shape)}")


def final_dir(out_dir: Path) -> Path:
    """Where ``out_dir`` will be served from: the rename target of a ``cached_build`` temporary
    folder (``NAME.tmp-XXXX`` -> ``NAME``), else ``out_dir`` itself; absolute."""
    out_dir = Path(out_dir).resolve()
    match = re.fullmatch(r"(?P<name>.+)\.tmp-[^/]+", out_dir.name)
    return out_dir.with_name(match["name"]) if match else out_dir


def _config(tower_path: str) -> dict[str, Any]:
    """liuhaotian/llava-v1.5-7b's config.json at tiny sizes, ``mm_vision_tower`` pointing at ``tower_path``."""
    return {
        "_name_or_path": "llava-v1.5-7b",
        "architectures": ["LlavaLlamaForCausalLM"],
        "bos_token_id": SPECIALS["<s>"],
        "eos_token_id": SPECIALS["</s>"],
        "freeze_mm_mlp_adapter": False,
        "hidden_act": "silu",
        **TEXT,
        "image_aspect_ratio": "pad",
        "initializer_range": 0.02,
        "max_length": 4096,
        "max_position_embeddings": 4096,
        "mm_hidden_size": VISION["hidden_size"],
        "mm_projector_type": "mlp2x_gelu",
        "mm_use_im_patch_token": False,
        "mm_use_im_start_end": False,
        "mm_vision_select_feature": "patch",
        "mm_vision_select_layer": SELECT_LAYER,
        "mm_vision_tower": tower_path,
        "model_type": "llava",
        "pad_token_id": SPECIALS["<unk>"],
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "tune_mm_mlp_adapter": False,
        "tune_mm_vision_resampler": False,
        "unfreeze_mm_vision_tower": False,
        "use_cache": True,
        "use_mm_proj": True,
        "vocab_size": VOCAB_SIZE,
    }


def _llm_weights(seed: int) -> dict[str, Any]:
    """The Vicuna weights (HF Llama names: ``model.*``, ``lm_head``) and the projector's
    (``model.mm_projector.0`` / ``.2``: Linear, GELU, Linear), fp16, seed-fixed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(
        **TEXT,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    tensors = {
        k: v.to(torch.float16).contiguous()
        for k, v in random_weights(LlamaForCausalLM, llama, seed).state_dict().items()
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        projector = torch.nn.Sequential(
            torch.nn.Linear(VISION["hidden_size"], TEXT["hidden_size"]),
            torch.nn.GELU(),
            torch.nn.Linear(TEXT["hidden_size"], TEXT["hidden_size"]),
        )
    for key, value in projector.state_dict().items():
        tensors[f"model.mm_projector.{key}"] = value.to(torch.float16).contiguous()
    return tensors


def _write_tower(tower_dir: Path, seed: int) -> None:
    """The tiny CLIP tower, its weights under openai/clip-vit-large-patch14-336's ``vision_model.*`` names
    (the published repo is a whole ``CLIPModel``; the text tower, unused by LLaVA, is left out), and the
    preprocessor config."""
    import torch
    from transformers import CLIPVisionModel

    tower = random_weights(CLIPVisionModel, vision_config(), seed + 2).to(torch.float16)
    tower.save_pretrained(tower_dir)
    nest_vision_model(tower_dir, tower="")  # the published vision_model.* names
    image_processor().save_pretrained(tower_dir)


def build(out_dir: Path, seed: int) -> None:
    """Write the tiny original-layout LLaVA-1.5 (fp16, seed-fixed) and its CLIP tower into ``out_dir``."""
    from safetensors.torch import save_file
    from transformers import CLIPVisionModel, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = _llm_weights(seed)
    save_file(tensors, str(out_dir / "model.safetensors"), {"format": "pt"})
    tower_path = final_dir(out_dir) / TOWER_DIR
    (out_dir / "config.json").write_text(json.dumps(_config(str(tower_path)), indent=2) + "\n", encoding="utf-8")
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, max_length=4096).save_pretrained(out_dir)
    _write_tower(out_dir / TOWER_DIR, seed)
    processor = build_processor(build_tokenizer())
    processor.save_pretrained(out_dir)
    clean_tokenizer_config(out_dir)
    write_bos_eos_flags(out_dir)
    verify_processor(out_dir, "USER: <image>\nHi ASSISTANT:")
    # The tower loads as SGLang loads it (from the folder the config will name once in place).
    tower = CLIPVisionModel.from_pretrained(out_dir / TOWER_DIR, local_files_only=True)
    if tower.config.image_size != IMAGE_SIZE or tower.config.hidden_size != VISION["hidden_size"]:
        raise AssertionError(f"tower config {tower.config}")


FAMILY = Family(
    name="llava-1.5",
    architecture="LlavaLlamaForCausalLM",
    builder_version=BUILDER_VERSION,
    build=build,
    modalities=("image",),
    # The model's 4096 positions: the harness asks for 32768, which SGLang refuses above the
    # model's own length; SGLang's vicuna_v1.1 conversation is the published prompt format.
    server_args=("--context-length", "4096", "--chat-template", CHAT_TEMPLATE_NAME),
    notes=(
        "Original (liuhaotian) layout: Llama weights + model.mm_projector.{0,2} (mlp2x_gelu), flat config; "
        f"the CLIP tower is the checkpoint's own {TOWER_DIR}/ folder, named by absolute path in "
        "mm_vision_tower (the published one names the openai repo), so the folder must not be moved. "
        "Ships llava-hf's tokenizer (<image> 32000, <pad> 32001) and LlavaProcessor, which SGLang's recipe "
        "took from --tokenizer-path llava-hf/llava-1.5-7b-hf (the published tokenizer has no <image>). "
        "Tokenizer: a 4000-piece BPE on stdlib text with fillers; only unk/bos/eos and the added tokens sit "
        "on their published ids. Text: multi-head (KV heads = heads) as Vicuna-7B. SGLang's LLaVA processor "
        "decodes, pads and normalizes each image in a forked process pool and expands in the model's "
        "pad_input_ids: its mm.load, mm.decode, mm.resize_normalize and mm.expand are inside mm.process, "
        "unobserved; the encoder is seen at encode_images (no embedding cache on that path)."
    ),
    image_tokens={256: IMAGE_TOKENS, 512: IMAGE_TOKENS},
    expected_lost=(MM_LOAD, MM_DECODE, MM_RESIZE_NORMALIZE, MM_EXPAND),
)
