#!/usr/bin/env python3
"""Write tiny Hugging Face checkpoint folders plus reference log-probabilities.

Usage:
    make_checkpoints.py OUT [--only NAME,NAME] [--text FILE]      # write OUT/NAME/...
    make_checkpoints.py OUT --check [--only NAME,NAME] [--text FILE]  # re-verify folders
    make_checkpoints.py --list

For every case NAME this writes OUT/NAME/ exactly as `save_pretrained` lays out a
checkpoint (config.json, generation_config.json, model.safetensors or shards plus
model.safetensors.index.json, tokenizer.json, tokenizer_config.json) and one extra
file, OUT/NAME/reference.safetensors, that Hugging Face never reads:

    tokens    int64   (T,)    tokenizer encoding of the first `text_chars` characters
                              of the text file (BOS first for llama*/mistral), cut to T
    logprobs  float32 (T-1,)  log p(tokens[i+1] | tokens[:i+1]) from the HF model
                              (from_pretrained(dtype=float32), eval, one forward pass
                              over the whole sequence, float32 logits -> float64
                              log_softmax over the full padded vocabulary)
    metadata  str -> str      case, family, T, max_position_embeddings,
                              transformers_version, ... (see `reference_metadata`)

All weights are random (no downloads): every parameter is re-drawn from a per-case
seeded generator, matrices ~ N(0, s), biases ~ N(0, s), norm scales ~ 1 + N(0, s), s = 0.15,
so that biases and norm weights are not trivial. The vocabulary is the tokenizer size
rounded up past the next multiple of 8, so some embedding rows never occur.

Cases whose config.json is rewritten in the Hub (transformers 4.x) style after
`save_pretrained` are marked `legacy_config`; loading them back through transformers
is verified (the parsed rope parameters must be the expected ones).

The reference is the `eager` attention implementation; `sdpa` must agree within
--sdpa-atol (default 1e-5) where the family supports it (BLOOM and MPT have no sdpa
path). Exception: falcon_rw, where transformers 5.24's eager path adds the ALiBi bias
twice (models/falcon/modeling_falcon.py: once at line 394, again through the mask built
at lines 762-777), so its reference is `sdpa` (bias added once, as in the original
Falcon-RW code) and the eager difference is only recorded in the metadata.

Deterministic: single-threaded torch, fixed seeds, sorted JSON; rerunning with the same
software writes the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import tokenizers  # noqa: E402
import safetensors  # noqa: E402
from safetensors import safe_open  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    BloomConfig,
    FalconConfig,
    GemmaConfig,
    Gemma2Config,
    Gemma3Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    MptConfig,
    OlmoConfig,
    Olmo2Config,
    Olmo3Config,
    Phi3Config,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    SiglipVisionConfig,
)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TEXT = REPO / "data" / "pydoc" / "valid.txt"

TOKENIZER_TRAIN_CHARS = 20000  # characters of the text the BPE is trained on
TOKENIZER_VOCAB = 397  # BPE target size (bytes + specials + merges); model vocab -> 400
INIT_STD = 0.15

# ---------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------

# style -> (bos token or None, eos token, extra special tokens)
TOKENIZER_STYLES = {
    # GPT-2 style: one special token, nothing added around the text
    "gpt2": (None, "<|endoftext|>"),
    # Llama-3 style: BOS added in front by a TemplateProcessing post-processor
    "llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
    # Mistral: same mechanism with <s>, </s>
    "mistral": ("<s>", "</s>"),
    # Mistral's and Llama 2's own: a SentencePiece BPE model (tokenizer.model, byte fallback)
    # as transformers converts it to tokenizer.json (Metaspace, BOS <s>)
    "spm": ("<s>", "</s>"),
    # Qwen2: no BOS; NFC normalizer + Qwen2 split regex before a regex-free ByteLevel, as in the
    # real Qwen2 tokenizer.json (transformers 5.24's AutoTokenizer rebuilds exactly this pipeline
    # for model_type qwen2 whatever tokenizer.json says, so a GPT-2 style tokenizer.json would
    # not round-trip through AutoTokenizer)
    "qwen2": (None, "<|endoftext|>"),
}

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TOKENIZER_CACHE: dict = {}


def make_tokenizer(text: str, style: str) -> tokenizers.Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on `text`; BOS post-processor for llama3/mistral styles."""
    key = (hashlib.sha256(text.encode("utf-8")).hexdigest(), style)
    if key in _TOKENIZER_CACHE:
        return _TOKENIZER_CACHE[key]
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if style == "spm":
        _TOKENIZER_CACHE[key] = sentencepiece_tokenizer(text)
        return _TOKENIZER_CACHE[key]
    bos, eos = TOKENIZER_STYLES[style]
    specials = [t for t in (bos, eos) if t is not None]
    tok = tokenizers.Tokenizer(models.BPE())
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos is not None:
        bos_id = tok.token_to_id(bos)
        template = processors.TemplateProcessing(
            single=f"{bos} $A:0",
            pair=f"{bos} $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
        tok.post_processor = processors.Sequence([byte_level, template])
    else:
        tok.post_processor = byte_level
    _TOKENIZER_CACHE[key] = tok
    return tok


def sentencepiece_tokenizer(text: str) -> tokenizers.Tokenizer:
    """A SentencePiece BPE model trained on `text` with Llama's settings, as transformers reads a
    folder holding only its tokenizer.model (LlamaTokenizer, converted)."""
    import tempfile

    import sentencepiece as spm
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        lines = [line for line in text.splitlines() if line.strip()]
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=os.path.join(folder, "tokenizer"),
            vocab_size=TOKENIZER_VOCAB, model_type="bpe", byte_fallback=True, split_digits=True,
            allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
            normalization_rule_name="identity", num_threads=1, minloglevel=2)
        os.remove(os.path.join(folder, "tokenizer.vocab"))
        write_json(Path(folder) / "tokenizer_config.json",
                   {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                    "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False})
        return AutoTokenizer.from_pretrained(folder).backend_tokenizer


def token_ids(tok: tokenizers.Tokenizer, style: str) -> dict:
    bos, eos = TOKENIZER_STYLES[style]
    return {
        "bos_token_id": tok.token_to_id(bos) if bos else None,
        "eos_token_id": tok.token_to_id(eos),
    }


def padded_vocab(n: int) -> int:
    """Smallest multiple of 8 strictly above n: at least one row the tokenizer never produces."""
    return (n // 8 + 1) * 8


def save_tokenizer(tok: tokenizers.Tokenizer, style: str, folder: Path) -> None:
    bos, eos = TOKENIZER_STYLES[style]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        model_max_length=1_000_000,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(folder))


# ---------------------------------------------------------------------------
# text and tokens
# ---------------------------------------------------------------------------


def read_text(path: Path, n_chars: int) -> str:
    with open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read(n_chars)
    if not text:
        raise SystemExit(f"text file {path} is empty")
    return text


def candidate_texts(path: Path, T: int):
    """The first 4*T characters of the file, then that text doubled, quadrupled, ... (short files)."""
    text = read_text(path, 4 * T)
    while True:
        yield text
        text = text + text


def reference_tokens(tok: tokenizers.Tokenizer, path: Path, T: int) -> tuple[torch.Tensor, str]:
    """Encode the first characters of the file, repeating the text until it gives T tokens. Returns (tokens, text)."""
    for text in candidate_texts(path, T):
        ids = tok.encode(text).ids
        if len(ids) >= T:
            return torch.tensor(ids[:T], dtype=torch.int64), text
    raise AssertionError("unreachable")


def recorded_text(path: Path, T: int, n_chars: int) -> str | None:
    for text in candidate_texts(path, T):
        if len(text) >= n_chars:
            return text if len(text) == n_chars else None
    return None


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------

LLAMA_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def llama_config(V, ids, **over):
    kw = dict(
        vocab_size=V,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters=dict(LLAMA_ROPE),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
        **ids,
    )
    kw.update(over)
    return LlamaConfig(**kw)


def falcon_config(V, ids, **over):
    """Falcon-7B's block by default (rotary, multi-query, parallel, no linear biases), tiny."""
    kw = dict(
        vocab_size=V, hidden_size=128, num_attention_heads=8, num_hidden_layers=2, alibi=False,
        new_decoder_architecture=False, parallel_attn=True, bias=False, multi_query=True,
        max_position_embeddings=64, layer_norm_epsilon=1e-5, initializer_range=INIT_STD, **ids)
    kw.update(over)
    return FalconConfig(**kw)


def mistral_config(V, ids, **over):
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_parameters=dict(LLAMA_ROPE), sliding_window=16,
        tie_word_embeddings=False, initializer_range=INIT_STD, **ids)
    kw.update(over)
    return MistralConfig(**kw)


def legacy_rope(rope_scaling, rope_theta=10000.0):
    """config.json edit: Hub (transformers 4.x) layout, top-level rope_theta + rope_scaling."""

    def edit(cfg: dict) -> dict:
        cfg.pop("rope_parameters", None)
        cfg["rope_theta"] = rope_theta
        cfg["rope_scaling"] = rope_scaling
        return cfg

    return edit


def qwen2_hub_style(cfg: dict) -> dict:
    """Qwen2/2.5 Hub configs: use_sliding_window false but sliding_window/max_window_layers set, no layer_types."""
    cfg.pop("rope_parameters", None)
    cfg.pop("layer_types", None)
    cfg["rope_theta"] = 1000000.0
    cfg["rope_scaling"] = None
    cfg["use_sliding_window"] = False
    cfg["sliding_window"] = 16  # must be ignored: use_sliding_window is false
    cfg["max_window_layers"] = 1  # would window layer 1 if sliding were on
    return cfg


def qwen2_windows_config(V, i):
    """Qwen2 with sliding windows of 16 on layers 1 and 2 of 3 (max_window_layers 1)."""
    return Qwen2Config(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=True, sliding_window=16, max_window_layers=1,
        tie_word_embeddings=False, initializer_range=INIT_STD, **i)


def qwen3_config(V, i, **over):
    """Qwen3: an RMSNorm of each head's q and k, head_dim given (its default is 128)."""
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        use_sliding_window=False, tie_word_embeddings=False, initializer_range=INIT_STD, **i)
    kw.update(over)
    return Qwen3Config(**kw)


def without_head_dim(cfg: dict) -> dict:
    """config.json without head_dim: Qwen3Config's default, 128, applies."""
    del cfg["head_dim"]
    return cfg


def expect_head_dim(width):
    def check(model) -> None:
        attention = model.model.layers[0].self_attn
        assert attention.head_dim == width, attention.head_dim
        assert attention.q_proj.out_features == width * model.config.num_attention_heads

    return check


# LongRoPE's factors for the 6 rotated pairs of a 16-wide head with partial_rotary_factor 0.75:
# the short ones near 1, the long ones growing towards the low frequencies, as Phi-3's.
LONGROPE_SHORT = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25]
LONGROPE_LONG = [1.0, 2.4, 3.8, 5.2, 6.6, 8.0]


def phi3_config(V, ids, **over):
    """Phi-3: Llama's block with q, k, v in one projection and gate and up in one; GQA, a window."""
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
        original_max_position_embeddings=64, rms_norm_eps=1e-5, rope_parameters=dict(LLAMA_ROPE),
        sliding_window=None, tie_word_embeddings=False, initializer_range=INIT_STD, pad_token_id=None)
    kw.update(ids)
    kw.update(over)
    return Phi3Config(**kw)


def phi3_longrope_config(V, ids):
    """Phi-3-mini-128k's and Phi-4-mini's scaling, tiny: LongRoPE from 64 to 256 positions on 0.75 of each head."""
    return phi3_config(V, ids, max_position_embeddings=256, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 64, "short_factor": LONGROPE_SHORT, "long_factor": LONGROPE_LONG})


def phi3_hub_style(cfg: dict) -> dict:
    """Phi-3's config.json on the Hub: rope_theta, partial_rotary_factor and rope_scaling (type longrope,
    its two factor lists, no factor and no original length: the top-level original_max_position_embeddings)."""
    rope = cfg.pop("rope_parameters")
    cfg["auto_map"] = {"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"}
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["partial_rotary_factor"] = rope.get("partial_rotary_factor", 1.0)
    cfg["rope_scaling"] = None
    if rope["rope_type"] == "longrope":
        cfg["rope_scaling"] = {"type": "longrope", "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]}
    return cfg


def gemma_config(V, ids, **over):
    """Gemma: GeGLU with GELU's tanh form, norms of 1 + w, the tied embedding times sqrt(hidden_size),
    heads of their own width (here 4 of 32 over 64, as Gemma-7B's 16 of 256 over 3072), one key head."""
    kw = dict(
        vocab_size=V, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_parameters=dict(LLAMA_ROPE), tie_word_embeddings=True, initializer_range=INIT_STD, pad_token_id=None)
    kw.update(ids)
    kw.update(over)
    return GemmaConfig(**kw)


def gemma_hub_style(cfg: dict) -> dict:
    """Gemma 1.1's config.json: hidden_act "gelu" (which GemmaConfig reads as the tanh form), hidden_activation
    beside it, rope_theta and rope_scaling null at the top level."""
    rope = cfg.pop("rope_parameters")
    cfg["hidden_act"] = "gelu"
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    return cfg


def expect_gemma(model) -> None:
    assert model.config.hidden_act == "gelu_pytorch_tanh", model.config.hidden_act
    assert model.model.layers[0].self_attn.head_dim == 32


def gemma2_config(V, ids, **over):
    """Gemma 2: Gemma's block with norms before and after each sublayer, the scores q.k / sqrt(24)
    (query_pre_attn_scalar, not the heads' 32) capped at 0.5 tanh(s / 0.5) and the logits at 2 tanh(l / 2)
    (caps small enough to bend these weights' scores and logits; Gemma 2's are 50 and 30), and
    windows of 16 on the even layers of four."""
    kw = dict(
        vocab_size=V, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_parameters=dict(LLAMA_ROPE), tie_word_embeddings=True, initializer_range=INIT_STD, pad_token_id=None,
        query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=0.5, final_logit_softcapping=2.0)
    kw.update(ids)
    kw.update(over)
    return Gemma2Config(**kw)


def gemma2_hub_style(cfg: dict) -> dict:
    """Gemma 2's config.json on the Hub: hidden_act beside hidden_activation, cache_implementation
    hybrid, no layer_types (Gemma2Config's default: the even layers slide), rope_theta at the top level."""
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    cfg["cache_implementation"] = "hybrid"
    cfg["rope_theta"] = rope["rope_theta"]
    return cfg


def expect_gemma2(model) -> None:
    assert model.config.layer_types == ["sliding_attention", "full_attention"] * 2, model.config.layer_types
    attention = model.model.layers[0].self_attn
    assert attention.scaling == 24 ** -0.5 and attention.attn_logit_softcapping == 0.5


def gemma3_config(V, ids, **over):
    """Gemma 3: Gemma 2's block without the caps, q and k each normed per head (1 + w), six layers of
    which every third is global (layers 2 and 5: Gemma 3's 5-to-1 at a smaller period), windows of 16
    on the others; the global layers rotate with base 1e6 scaled linearly by 4, the local ones with
    base 1e4 unscaled, as Gemma 3 4B and up."""
    kw = dict(
        vocab_size=V, hidden_size=64, intermediate_size=192, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        tie_word_embeddings=True, initializer_range=INIT_STD, pad_token_id=None, query_pre_attn_scalar=24,
        sliding_window=16, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)
    kw.update(ids)
    kw.update(over)
    return Gemma3TextConfig(**kw)


def gemma3_hub_style(cfg: dict) -> dict:
    """Gemma 3's config.json on the Hub (gemma-3-1b; 4B's text part): rope_theta, rope_local_base_freq
    and rope_scaling (the global layers') at the top level, sliding_window_pattern instead of
    layer_types, caps null, hidden_act beside hidden_activation."""
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    full = dict(rope["full_attention"])
    cfg["rope_theta"] = full.pop("rope_theta")
    cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = full
    cfg["sliding_window_pattern"] = 3
    cfg["attn_logit_softcapping"] = None
    cfg["final_logit_softcapping"] = None
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    cfg["cache_implementation"] = "hybrid"
    return cfg


def expect_gemma3(model) -> None:
    assert model.config.layer_types == ["sliding_attention", "sliding_attention", "full_attention"] * 2, \
        model.config.layer_types
    assert model.config.rope_parameters["full_attention"]["rope_type"] == "linear", model.config.rope_parameters
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4, model.config.rope_parameters
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (32,)


def gemma3_multimodal_config(V, ids, **over):
    """Gemma 3 4B and up (Gemma3ForConditionalGeneration): a SigLIP vision tower (one tiny layer) and its
    projector beside the text model, here with Gemma3TextConfig's heads (8 of 256, 4 key-value heads, the
    score scale 256) and its default layer pattern (all but every sixth layer local), windows of 16, the
    global layers' RoPE scaled linearly by 8, as 4B's."""
    text = gemma3_config(V, ids, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                         query_pre_attn_scalar=256, layer_types=None,
                         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    kw = dict(text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=V - 3,
              eoi_token_index=V - 2, image_token_index=V - 1, initializer_range=INIT_STD)
    kw.update(over)
    return Gemma3Config(**kw)


def gemma3_multimodal_hub_style(cfg: dict) -> dict:
    """Gemma 3 4B's config.json on the Hub: a text_config of the few keys that differ from
    Gemma3TextConfig's defaults (the heads, score scale, base frequencies, layer pattern and training
    length left out), rope_scaling for its global layers."""
    text = cfg["text_config"]
    full = dict(text["rope_parameters"]["full_attention"])
    full.pop("rope_theta")
    keep = ("hidden_size", "intermediate_size", "model_type", "num_hidden_layers", "sliding_window", "vocab_size")
    cfg["text_config"] = dict({k: text[k] for k in keep}, rope_scaling=full)
    cfg["eos_token_id"] = [1, 106]
    return cfg


def expect_gemma3_multimodal(model) -> None:
    text = model.config.text_config
    assert text.layer_types == ["sliding_attention"] * 5 + ["full_attention"], text.layer_types
    assert text.num_attention_heads == 8 and text.head_dim == 256 and text.query_pre_attn_scalar == 256
    assert text.rope_parameters["full_attention"]["factor"] == 8.0, text.rope_parameters
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"


def olmo_config(V, ids, **over):
    """OLMo (1): Llama's block with LayerNorms without parameters, q, k and v clipped at 1.5 (the
    projections here reach about 3 standard deviations of 1.7: the clip bites)."""
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, clip_qkv=1.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, initializer_range=INIT_STD, pad_token_id=None)
    kw.update(ids)
    kw.update(over)
    return OlmoConfig(**kw)


def expect_olmo(clip):
    def check(model) -> None:
        assert type(model).__name__ == "OlmoForCausalLM" and model.config.clip_qkv == clip
        assert not any("layernorm" in name or "norm." in name for name, _ in model.named_parameters())
    return check


def olmo2_config(V, ids, **over):
    """OLMo 2: norms after the attention and the MLP (none before), q and k normed over the whole projection."""
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
        initializer_range=INIT_STD, pad_token_id=None)
    kw.update(ids)
    kw.update(over)
    return Olmo2Config(**kw)


def olmo2_hub_style(cfg: dict) -> dict:
    """OLMo-2's config.json on the Hub: rope_theta and rope_scaling null at the top level."""
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    return cfg


def expect_olmo2(model) -> None:
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (128,) and attention.k_norm.weight.shape == (32,)


def olmo3_config(V, ids, **over):
    """OLMo 3: OLMo 2's block with windows of 16 on three of every four layers (Olmo3Config's default;
    layer 3 full) and a RoPE for each kind, the global layers' scaled by YaRN from 64 to 256 positions
    with its attention factor written out (YaRN's 0.1 ln(factor) + 1), as OLMo 3 7B's (8192 to 65536)."""
    kw = dict(
        vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=16,
        rope_parameters={"full_attention": dict(YARN, rope_theta=500000.0, attention_factor=0.1 * math.log(4.0) + 1, beta_fast=32.0,
                                                beta_slow=1.0),
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}},
        tie_word_embeddings=False, initializer_range=INIT_STD, pad_token_id=None)
    kw.update(ids)
    kw.update(over)
    return Olmo3Config(**kw)


def olmo3_hub_style(cfg: dict) -> dict:
    """OLMo 3's config.json on the Hub (Olmo-3-7B): rope_theta and rope_scaling (the global layers')
    at the top level; here without layer_types (Olmo3Config's default)."""
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    full = dict(rope["full_attention"])
    cfg["rope_theta"] = full.pop("rope_theta")
    cfg["rope_scaling"] = full
    return cfg


def expect_olmo3(model) -> None:
    assert model.config.layer_types == ["sliding_attention"] * 3 + ["full_attention"], model.config.layer_types
    rope = model.config.rope_parameters
    assert rope["full_attention"]["rope_type"] == "yarn" and rope["sliding_attention"]["rope_type"] == "default", rope
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [16, 16, 16, None]


def expect_olmo3_v5(model) -> None:
    assert model.config.layer_types == ["full_attention", "sliding_attention"] * 2, model.config.layer_types
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4, model.config.rope_parameters


def qwen2_windows_hub_style(cfg: dict) -> dict:
    """A Hub config with sliding windows on: no layer_types, the windowed layers from max_window_layers on."""
    cfg = qwen2_hub_style(cfg)
    cfg["use_sliding_window"] = True
    cfg["sliding_window"] = 16
    cfg["max_window_layers"] = 1
    return cfg


def expect_qwen2_windows(model) -> None:
    cfg = model.config
    assert cfg.sliding_window == 16, cfg.sliding_window
    assert cfg.layer_types == ["full_attention", "sliding_attention", "sliding_attention"], cfg.layer_types
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [None, 16, 16]


def mistral_hub_style(cfg: dict) -> dict:
    cfg.pop("rope_parameters", None)
    cfg["rope_theta"] = 10000.0
    return cfg


def neox_hub_style(cfg: dict) -> dict:
    """Pythia layout: rotary_pct / rotary_emb_base at top level."""
    rp = cfg.pop("rope_parameters")
    cfg["rotary_pct"] = rp["partial_rotary_factor"]
    cfg["rotary_emb_base"] = rp["rope_theta"]
    return cfg


def falcon_rw_hub_style(cfg: dict) -> dict:
    """falcon-rw-1b's config.json has no rope fields (alibi model), and a key transformers 5.24's
    Falcon ignores (apply_residual_connection_post_layernorm, false)."""
    cfg.pop("rope_parameters", None)
    cfg["apply_residual_connection_post_layernorm"] = False
    return cfg


def falcon_7b_hub_style(cfg: dict) -> dict:
    """tiiuae/falcon-7b's config.json: no rope fields (theta 10000), num_kv_heads or
    num_ln_in_parallel_attn, apply_residual_connection_post_layernorm false. The Hub's file
    writes multi_query and parallel_attn true; they are left out here, so that their defaults
    (true) are read as transformers reads them."""
    for key in ("rope_parameters", "num_ln_in_parallel_attn", "num_kv_heads", "multi_query", "parallel_attn"):
        cfg.pop(key, None)
    cfg["apply_residual_connection_post_layernorm"] = False
    return cfg


def falcon_40b_hub_style(cfg: dict) -> dict:
    """tiiuae/falcon-40b's config.json: as falcon-7b's, without multi_query (its default, true,
    which the new decoder architecture does not read) and with num_kv_heads."""
    kv_heads, parallel = cfg["num_kv_heads"], cfg["parallel_attn"]
    cfg = falcon_7b_hub_style(cfg)
    cfg.update(num_kv_heads=kv_heads, parallel_attn=parallel)
    return cfg


def expect_rope(expected: dict):
    def check(model) -> None:
        got = dict(model.config.rope_parameters)
        got.pop("type", None)
        if got != expected:
            raise AssertionError(f"rope_parameters parsed as {got}, expected {expected}")

    return check


def expect_qwen2_no_window(model) -> None:
    cfg = model.config
    assert cfg.sliding_window is None, cfg.sliding_window
    assert all(t == "full_attention" for t in cfg.layer_types), cfg.layer_types
    assert model.config.rope_parameters["rope_theta"] == 1000000.0, cfg.rope_parameters
    for layer in model.model.layers:
        assert layer.self_attn.sliding_window is None


def expect_mistral_window(model) -> None:
    assert model.config.sliding_window == 16


def expect_neox(rotary_pct):
    def check(model) -> None:
        rp = model.config.rope_parameters
        assert rp["partial_rotary_factor"] == rotary_pct and rp["rope_theta"] == 10000.0, rp
        assert model.gpt_neox.layers[0].attention.rotary_ndims == 4

    return check


def case(family, style, seed, T, build, **extra):
    d = dict(family=family, style=style, seed=seed, T=T, build=build)
    d.update(extra)
    return d


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

CASES = {
    # ---- Llama family (RoPE), all share seed 1000 -> identical weights where shapes agree
    "llama": case("llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
                  expect=expect_rope({"rope_type": "default", "rope_theta": 10000.0})),
    "llama_linear": case(
        "llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
        config_edit=legacy_rope({"type": "linear", "factor": 4.0}),
        expect=expect_rope({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})),
    "llama_dynamic": case(
        "llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
        config_edit=legacy_rope({"type": "dynamic", "factor": 4.0}),
        expect=expect_rope({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})),
    "llama_yarn": case(
        "llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i, max_position_embeddings=256),
        config_edit=legacy_rope(dict(YARN)),
        expect=expect_rope(dict(YARN, rope_theta=10000.0))),
    "llama_yarn_v5": case(  # same model as llama_yarn, config.json as transformers 5.24 writes it
        "llama", "llama3", 1000, 160,
        lambda V, i: llama_config(V, i, max_position_embeddings=256,
                                  rope_parameters=dict(YARN, rope_theta=10000.0)),
        expect=expect_rope(dict(YARN, rope_theta=10000.0))),
    "llama_llama3": case(
        "llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i, max_position_embeddings=256),
        config_edit=legacy_rope(dict(LLAMA3)),
        expect=expect_rope(dict(LLAMA3, rope_theta=10000.0))),
    "llama_tied": case("llama", "llama3", 1000, 160,
                       lambda V, i: llama_config(V, i, tie_word_embeddings=True)),
    "llama_bf16": case("llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
                       save_dtype=torch.bfloat16),
    "llama_fp16": case("llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
                       save_dtype=torch.float16),
    "llama_sharded": case("llama", "llama3", 1000, 160, lambda V, i: llama_config(V, i),
                          max_shard_size="400KB"),
    # ---- Mistral: sliding window 16 on every layer; also with its SentencePiece tokenizer
    "mistral": case("mistral", "mistral", 1100, 160, lambda V, i: mistral_config(V, i),
                    config_edit=mistral_hub_style, expect=expect_mistral_window),
    "mistral_spm": case("mistral", "spm", 1100, 160, lambda V, i: mistral_config(V, i),
                        config_edit=mistral_hub_style, expect=expect_mistral_window),
    # ---- Qwen2: q/k/v biases, rope_theta 1e6, sliding window configured but disabled
    "qwen2": case(
        "qwen2", "qwen2", 1200, 160,
        lambda V, i: Qwen2Config(
            vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, tie_word_embeddings=False, initializer_range=INIT_STD, **i),
        config_edit=qwen2_hub_style, expect=expect_qwen2_no_window),
    # ---- Qwen2 with sliding windows on layers 1 and 2 (not 0): layer_types as transformers 5.24
    # writes it, and a Hub config without it (max_window_layers 1); T 160 is 10 windows of 16
    "qwen2_windows": case("qwen2", "qwen2", 1250, 160, lambda V, i: qwen2_windows_config(V, i),
                          expect=expect_qwen2_windows),
    "qwen2_windows_hub": case("qwen2", "qwen2", 1250, 160, lambda V, i: qwen2_windows_config(V, i),
                              config_edit=qwen2_windows_hub_style, expect=expect_qwen2_windows),
    # ---- Qwen3: qk_norm; and with sliding windows on layers 1 and 2 of 3
    "qwen3": case("qwen3", "qwen2", 1260, 160, lambda V, i: qwen3_config(V, i)),
    "qwen3_windows": case(
        "qwen3", "qwen2", 1270, 160,
        lambda V, i: qwen3_config(V, i, num_hidden_layers=3, use_sliding_window=True, sliding_window=16,
                                  max_window_layers=1)),
    # ---- Heads not hidden_size / num_attention_heads wide: Qwen3-0.6B's (128 of 16 over 1024; here
    # Qwen3Config's default 128, config.json without head_dim, of 2 heads over 64) and Mistral-Nemo's
    # (128 of 32 over 5120; here 16 of 4 over 128)
    "qwen3_wide_heads": case(
        "qwen3", "qwen2", 1280, 160,
        lambda V, i: qwen3_config(V, i, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=128),
        config_edit=without_head_dim, expect=expect_head_dim(128)),
    "mistral_narrow_heads": case(
        "mistral", "mistral", 1110, 160,
        lambda V, i: mistral_config(V, i, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        config_edit=mistral_hub_style, expect=expect_head_dim(16)),
    # ---- Phi-3: fused qkv_proj and gate_up_proj, a window of 16 on every layer; and LongRoPE, whose
    # long factors apply to a window past the original 64 positions (T 160) and its short ones to
    # a window inside it (T 48): the same weights
    "phi3": case("phi3", "mistral", 1290, 160, lambda V, i: phi3_config(V, i, sliding_window=16),
                 config_edit=phi3_hub_style),
    "phi3_longrope": case("phi3", "mistral", 1291, 160, phi3_longrope_config, config_edit=phi3_hub_style),
    "phi3_longrope_short": case("phi3", "mistral", 1291, 48, phi3_longrope_config, config_edit=phi3_hub_style),
    # ---- Gemma: GeGLU (tanh), norms of 1 + w, a tied embedding scaled by sqrt(hidden_size) on input
    "gemma": case("gemma", "llama3", 1800, 160, lambda V, i: gemma_config(V, i), config_edit=gemma_hub_style,
                  expect=expect_gemma),
    # ---- Gemma 2: norms around the sublayers, soft-capped scores and logits, a score scale of its own,
    # windows on every other layer; and without the caps (null)
    "gemma2": case("gemma2", "llama3", 1850, 160, lambda V, i: gemma2_config(V, i), config_edit=gemma2_hub_style,
                   expect=expect_gemma2),
    "gemma2_uncapped": case("gemma2", "llama3", 1850, 160,
                            lambda V, i: gemma2_config(V, i, attn_logit_softcapping=None, final_logit_softcapping=None,
                                                       query_pre_attn_scalar=32)),
    # ---- Gemma 3: local and global layers, each kind with its own RoPE (the global one scaled), q and k
    # normed; as the Hub writes it and as transformers 5 saves it
    "gemma3": case("gemma3_text", "llama3", 1870, 160, lambda V, i: gemma3_config(V, i),
                   config_edit=gemma3_hub_style, expect=expect_gemma3),
    "gemma3_v5": case("gemma3_text", "llama3", 1870, 160, lambda V, i: gemma3_config(V, i), expect=expect_gemma3),
    # ---- Gemma 3 4B and up: the text model beside a vision tower, text in; as the Hub writes its config
    # (Gemma3TextConfig's defaults for what it leaves out) and as transformers 5 saves it
    "gemma3_multimodal": case("gemma3", "llama3", 1880, 160, lambda V, i: gemma3_multimodal_config(V, i),
                              config_edit=gemma3_multimodal_hub_style, expect=expect_gemma3_multimodal),
    "gemma3_multimodal_v5": case("gemma3", "llama3", 1880, 160, lambda V, i: gemma3_multimodal_config(V, i),
                                 expect=expect_gemma3_multimodal),
    # ---- OLMo (1): LayerNorms without parameters, q, k and v clipped; as the Hub writes it; and tied,
    # unclipped, with a linear RoPE scaling by 4 (from 64 positions) as transformers 5 saves it
    # (OLMo-1B-hf's and OLMo-7B-0424-hf's config.json: rope_theta and rope_scaling at the top level)
    "olmo": case("olmo", "gpt2", 1910, 160, lambda V, i: olmo_config(V, i), config_edit=legacy_rope(None),
                 expect=expect_olmo(1.5)),
    "olmo_linear": case("olmo", "gpt2", 1910, 160,
                        lambda V, i: olmo_config(V, i, clip_qkv=None, tie_word_embeddings=True,
                                                 rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                  "rope_theta": 10000.0}),
                        expect=expect_olmo(None)),
    # ---- OLMo 2: norms after the sublayers, q and k normed over the projection (8 query heads of 16,
    # 2 key heads); and with a YaRN scaling from 64 to 256 positions
    "olmo2": case("olmo2", "gpt2", 1900, 160, lambda V, i: olmo2_config(V, i), config_edit=olmo2_hub_style,
                  expect=expect_olmo2),
    "olmo2_yarn": case("olmo2", "gpt2", 1900, 160,
                       lambda V, i: olmo2_config(V, i, max_position_embeddings=256,
                                                 rope_parameters=dict(YARN, rope_theta=500000.0))),
    # ---- OLMo 3: OLMo 2's block, windows on three layers of four, a RoPE for each kind (the global
    # one YaRN-scaled); as the Hub writes it, and as transformers 5 saves it with layers of its own
    # and the local layers' base 1e4
    "olmo3": case("olmo3", "gpt2", 1950, 160, lambda V, i: olmo3_config(V, i), config_edit=olmo3_hub_style,
                  expect=expect_olmo3),
    "olmo3_v5": case("olmo3", "gpt2", 1950, 160,
                     lambda V, i: olmo3_config(
                         V, i, layer_types=["full_attention", "sliding_attention"] * 2,
                         rope_parameters={"full_attention": dict(YARN, rope_theta=500000.0),
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
                     expect=expect_olmo3_v5),
    # ---- GPT-2: learned absolute positions, T stays inside n_positions
    "gpt2": case(
        "gpt2", "gpt2", 1300, 200,
        lambda V, i: GPT2Config(
            vocab_size=V, n_embd=64, n_head=4, n_layer=2, n_positions=256, n_inner=None,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=INIT_STD, **i)),
    # ---- BLOOM: ALiBi, 6 heads (not a power of two) and 8 heads
    "bloom": case(
        "bloom", "gpt2", 1400, 160,
        lambda V, i: BloomConfig(vocab_size=V, hidden_size=96, n_head=6, n_layer=2,
                                 layer_norm_epsilon=1e-5, initializer_range=INIT_STD, **i)),
    "bloom_h8": case(
        "bloom", "gpt2", 1401, 160,
        lambda V, i: BloomConfig(vocab_size=V, hidden_size=128, n_head=8, n_layer=2,
                                 layer_norm_epsilon=1e-5, initializer_range=INIT_STD, **i)),
    # ---- GPT-NeoX: partial rotary 0.25, parallel and sequential residual
    "gpt_neox": case(
        "gpt_neox", "gpt2", 1500, 160,
        lambda V, i: GPTNeoXConfig(
            vocab_size=V, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
            intermediate_size=256, hidden_act="gelu", max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            use_parallel_residual=True, layer_norm_eps=1e-5, tie_word_embeddings=False,
            initializer_range=INIT_STD, **i),
        config_edit=neox_hub_style, expect=expect_neox(0.25)),
    "gpt_neox_seq": case(
        "gpt_neox", "gpt2", 1501, 160,
        lambda V, i: GPTNeoXConfig(
            vocab_size=V, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
            intermediate_size=256, hidden_act="gelu", max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            use_parallel_residual=False, layer_norm_eps=1e-5, tie_word_embeddings=False,
            initializer_range=INIT_STD, **i),
        expect=expect_neox(0.25)),
    # ---- MPT: ALiBi, 6 heads. HF MPT cannot run past max_seq_len (alibi tensor is sliced
    #      to max_seq_len keys), so here max_seq_len 256 > T.
    "mpt": case(
        "mpt", "gpt2", 1600, 200,
        lambda V, i: MptConfig(
            vocab_size=V, d_model=96, n_heads=6, n_layers=2, expansion_ratio=4, max_seq_len=256,
            learned_pos_emb=False, no_bias=True, layer_norm_epsilon=1e-5,
            attn_config={"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch"},
            initializer_range=INIT_STD, **i)),
    # ---- MPT with q, k and v clipped at 1.0 (MPT-7B's configs carry clip_qkv; the projections here
    #      reach about 3 standard deviations of 1.5: the clip bites)
    "mpt_clip": case(
        "mpt", "gpt2", 1600, 200,
        lambda V, i: MptConfig(
            vocab_size=V, d_model=96, n_heads=6, n_layers=2, expansion_ratio=4, max_seq_len=256,
            learned_pos_emb=False, no_bias=True, layer_norm_epsilon=1e-5,
            attn_config={"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "clip_qkv": 1.0},
            initializer_range=INIT_STD, **i)),
    # ---- Falcon RW-1B shape: ALiBi, biases, sequential attn/MLP, MHA. 16 heads so the
    #      slopes are not exact in bfloat16 (Falcon rounds slopes and slope*pos to bf16).
    "falcon_rw": case(
        "falcon", "gpt2", 1700, 160,
        lambda V, i: FalconConfig(
            vocab_size=V, hidden_size=128, num_attention_heads=16, num_hidden_layers=2,
            alibi=True, new_decoder_architecture=False, parallel_attn=False, bias=True,
            multi_query=False, max_position_embeddings=64, layer_norm_epsilon=1e-5,
            initializer_range=INIT_STD, **i),
        config_edit=falcon_rw_hub_style,
        ref_impl="sdpa", eager_known_bad=True),
    # ---- Falcon-7B shape: rotary, multi-query, one norm shared by the parallel attention and
    #      MLP, no biases in the linear layers (LayerNorms with them); config.json as the Hub's
    #      (no rope fields, no num_ln_in_parallel_attn)
    "falcon_7b": case("falcon", "gpt2", 1710, 160, lambda V, i: falcon_config(V, i),
                      config_edit=falcon_7b_hub_style),
    # ---- Falcon-40B shape: the new decoder architecture, 2 key-value groups of 4 heads,
    #      ln_attn and ln_mlp
    "falcon_40b": case("falcon", "gpt2", 1720, 160,
                       lambda V, i: falcon_config(V, i, new_decoder_architecture=True, num_kv_heads=2),
                       config_edit=falcon_40b_hub_style),
    # ---- ALiBi with Falcon-7B's block (multi-query, one shared norm, no linear biases)
    "falcon_alibi_mq": case("falcon", "gpt2", 1740, 160, lambda V, i: falcon_config(V, i, alibi=True),
                            ref_impl="sdpa", eager_known_bad=True),
    # ---- rotary Falcon, sequential, multi-head, with biases and a linear RoPE scaling
    "falcon_seq": case(
        "falcon", "gpt2", 1730, 160,
        lambda V, i: falcon_config(
            V, i, parallel_attn=False, bias=True, multi_query=False,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
        expect=expect_rope({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
}


# ---------------------------------------------------------------------------
# model building
# ---------------------------------------------------------------------------


def reinit_(model: torch.nn.Module, seed: int) -> None:
    """Redraw every parameter: matrices/embeddings N(0, s), biases N(0, s), norm scales 1 + N(0, s)
    (Gemma's N(0, s): its norms multiply by 1 + w)."""
    centre = 0.0 if model.config.model_type in ("gemma", "gemma2", "gemma3_text", "gemma3") else 1.0
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * INIT_STD
            if p.ndim >= 2:
                p.copy_(noise)
            elif name.endswith("bias"):
                p.copy_(noise)
            else:  # 1-D weight: a norm scale
                p.copy_(centre + noise)


def positions_limit(cfg) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            return v
    return None


def compute_logprobs(model, tokens: torch.Tensor) -> torch.Tensor:
    """float64 (T-1,) log p(tokens[i+1] | tokens[:i+1])."""
    with torch.no_grad():
        logits = model(input_ids=tokens[None], use_cache=False).logits[0]
    assert logits.dtype == torch.float32, logits.dtype
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return lp[:-1].gather(1, tokens[1:, None]).squeeze(1)


def load(folder: Path, impl: str):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation=impl).eval()


def run_references(folder: Path, spec: dict, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
    ref_impl = spec.get("ref_impl", "eager")
    other = "sdpa" if ref_impl == "eager" else "eager"
    model = load(folder, ref_impl)
    if "expect" in spec:
        spec["expect"](model)
    lp = compute_logprobs(model, tokens)
    info = {"reference_attn_implementation": ref_impl}
    try:
        model2 = load(folder, other)
    except (ValueError, ImportError) as e:  # BLOOM / MPT: no sdpa path
        info[f"{other}_max_abs_diff"] = "unsupported"
        info[f"{other}_note"] = str(e).split(".")[0]
        return lp, info
    lp2 = compute_logprobs(model2, tokens)
    diff = (lp - lp2).abs().max().item()
    info[f"{other}_max_abs_diff"] = f"{diff:.3e}"
    return lp, info


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def save_reference(path: Path, tensors: dict, metadata: dict) -> None:
    """safetensors file with a sorted header (safetensors' own writer orders metadata by hash)."""
    dtypes = {torch.int64: ("I64", "<i8"), torch.float32: ("F32", "<f4")}
    header: dict = {"__metadata__": {k: metadata[k] for k in sorted(metadata)}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        tag, np_dtype = dtypes[t.dtype]
        blob = t.numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_case(name: str, spec: dict, out: Path, text_path: Path, sdpa_atol: float) -> dict:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():  # stale shards from an earlier run
        if f.is_file():
            f.unlink()

    train_text = read_text(text_path, TOKENIZER_TRAIN_CHARS)
    tok = make_tokenizer(train_text, spec["style"])
    ids = token_ids(tok, spec["style"])
    V = padded_vocab(tok.get_vocab_size(with_added_tokens=True))

    torch.manual_seed(spec["seed"])
    cfg = spec["build"](V, ids)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    reinit_(model, spec["seed"])
    model.eval()
    if "save_dtype" in spec:
        model = model.to(spec["save_dtype"])
    save_kwargs = {}
    if "max_shard_size" in spec:
        save_kwargs["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(str(folder), **save_kwargs)
    if "config_edit" in spec:
        cfg_path = folder / "config.json"
        write_json(cfg_path, spec["config_edit"](json.loads(cfg_path.read_text(encoding="utf-8"))))
    save_tokenizer(tok, spec["style"], folder)

    T = spec["T"]
    tokens, used_text = reference_tokens(tok, text_path, T)
    lp, info = run_references(folder, spec, tokens)

    other = "sdpa" if info["reference_attn_implementation"] == "eager" else "eager"
    d = info[f"{other}_max_abs_diff"]
    if d != "unsupported" and not spec.get("eager_known_bad") and float(d) > sdpa_atol:
        raise AssertionError(f"{name}: {other} differs from reference by {d} > {sdpa_atol}")
    if spec.get("eager_known_bad") and d != "unsupported" and float(d) <= sdpa_atol:
        print(f"  note: {name}: eager now agrees with sdpa ({d}); transformers fixed the double ALiBi?")

    loaded_cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    meta = reference_metadata(name, spec, folder, tok, T, V, used_text, text_path, info, loaded_cfg)
    save_reference(folder / "reference.safetensors",
                   {"tokens": tokens, "logprobs": lp.to(torch.float32)}, meta)
    return meta


def reference_metadata(name, spec, folder, tok, T, V, used_text, text_path, info, cfg_json) -> dict:
    model_cfg = transformers.AutoConfig.from_pretrained(str(folder))
    limit = positions_limit(model_cfg)
    rope = dict(getattr(model_cfg, "rope_parameters", None) or {})
    rope.pop("type", None)  # legacy alias of rope_type kept by transformers
    if spec["family"] in ("bloom", "mpt") or getattr(model_cfg, "alibi", False):
        rope = {}
    weight_files = sorted(p.name for p in folder.iterdir() if p.name.startswith("model") and p.suffix == ".safetensors")
    meta = {
        "case": name,
        "family": spec["family"],
        "model_type": model_cfg.model_type,
        "architecture": (cfg_json.get("architectures") or [""])[0],
        "T": str(T),
        "max_position_embeddings": str(limit) if limit is not None else "none",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "tokenizers_version": tokenizers.__version__,
        "safetensors_version": safetensors.__version__,
        "seed": str(spec["seed"]),
        "vocab_size": str(V),
        "tokenizer_size": str(tok.get_vocab_size(with_added_tokens=True)),
        "bos_token_id": str(token_ids(tok, spec["style"])["bos_token_id"]),
        "saved_dtype": str(spec.get("save_dtype", torch.float32)).replace("torch.", ""),
        "weight_files": ",".join(weight_files),
        "legacy_config": str("config_edit" in spec).lower(),
        "rope_parameters": json.dumps(dict(rope), sort_keys=True) if rope else "none",
        "text_file": text_path.name,
        "text_chars": str(len(used_text)),
        "text_sha256": hashlib.sha256(used_text.encode("utf-8")).hexdigest(),
        "logprob_definition": "logprobs[i] = log_softmax(float64(logits[i]))[tokens[i+1]], one forward, no cache",
    }
    meta.update(info)
    return meta


# ---------------------------------------------------------------------------
# checking
# ---------------------------------------------------------------------------


def check_case(name: str, spec: dict, out: Path, text_path: Path, atol: float) -> str:
    folder = out / name
    ref_path = folder / "reference.safetensors"
    if not ref_path.is_file():
        raise AssertionError(f"{name}: {ref_path} missing (write the folders first)")
    with safe_open(str(ref_path), "pt") as f:
        meta = f.metadata()
        tokens = f.get_tensor("tokens")
        ref = f.get_tensor("logprobs")
    T = int(meta["T"])
    assert tokens.shape == (T,) and tokens.dtype == torch.int64, (tokens.shape, tokens.dtype)
    assert ref.shape == (T - 1,) and ref.dtype == torch.float32, (ref.shape, ref.dtype)
    if meta["transformers_version"] != transformers.__version__:
        print(f"  warning: {name} written with transformers {meta['transformers_version']}, "
              f"checking with {transformers.__version__}")

    impl = meta["reference_attn_implementation"]
    model = load(folder, impl)
    if "expect" in spec:
        spec["expect"](model)
    assert model.config.vocab_size > int(tokens.max()), "token id outside the vocabulary"
    lp = compute_logprobs(model, tokens).to(torch.float32)
    exact = torch.equal(lp, ref)
    diff = (lp - ref).abs().max().item()
    if not exact and diff > atol:
        raise AssertionError(f"{name}: logprobs differ from reference by {diff:.3e} > {atol}")

    # tokens: the saved tokenizer (through AutoTokenizer) must reproduce them from the text
    text_note = f"tokens not re-derived: {text_path} is not the text they were made from"
    text = recorded_text(text_path, T, int(meta["text_chars"]))
    if text is not None and hashlib.sha256(text.encode("utf-8")).hexdigest() == meta["text_sha256"]:
        raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids[:T]
        if raw != tokens.tolist():
            raise AssertionError(f"{name}: tokenizer.json encoding differs from the stored tokens")
        hf_tok = AutoTokenizer.from_pretrained(str(folder))
        if hf_tok(text)["input_ids"][:T] != tokens.tolist():
            raise AssertionError(f"{name}: AutoTokenizer ({type(hf_tok).__name__}) encoding differs from the stored tokens")
        text_note = f"tokens reproduced by tokenizer.json and AutoTokenizer ({type(hf_tok).__name__})"
    return f"{'bit-exact' if exact else f'max |diff| {diff:.1e}'}, {text_note}"


# ---------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", type=Path, help="output folder (one subfolder per case)")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help=f"text file (default {DEFAULT_TEXT})")
    ap.add_argument("--check", action="store_true",
                    help="do not write: reload every OUT/NAME with AutoModelForCausalLM and compare with reference.safetensors")
    ap.add_argument("--atol", type=float, default=1e-6, help="--check tolerance when not bit-exact (default 1e-6)")
    ap.add_argument("--sdpa-atol", type=float, default=1e-5, help="eager vs sdpa tolerance when writing (default 1e-5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, for reproducible bytes)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    args = ap.parse_args(argv)

    if args.list:
        print("\n".join(CASES))
        return 0
    if args.out is None:
        ap.error("OUT is required")
    names = [n for n in args.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if not args.text.is_file():
        ap.error(f"text file {args.text} not found")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    failures = 0
    for name in names:
        spec = CASES[name]
        try:
            if args.check:
                print(f"{name}: ok ({check_case(name, spec, args.out, args.text, args.atol)})")
            else:
                meta = write_case(name, spec, args.out, args.text, args.sdpa_atol)
                other = [k for k in meta if k.endswith("_max_abs_diff")][0]
                print(f"{name}: wrote {args.out / name} (T={meta['T']}, V={meta['vocab_size']}, "
                      f"ref={meta['reference_attn_implementation']}, {other}={meta[other]})")
        except Exception as e:  # report every case, fail at the end
            failures += 1
            print(f"{name}: FAILED: {type(e).__name__}: {e}")
    if failures:
        print(f"{failures} case(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
