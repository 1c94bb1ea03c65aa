"""Checks extrap's Llama-style models against Hugging Face transformers, the code the field runs
(tests/export/test_export.cpp runs it on models extrap trained and exported).

usage: check_hf_parts.py FAMILY MODEL.safetensors LOGITS.safetensors [...]

FAMILY is llama (RMSNorm, SwiGLU, no biases, grouped-query attention, rotary with the half
pairing, an untied head) or qwen3 (the same with a norm of each head's q and k). For each model,
its tensors are handed to transformers' own parts, and to the whole model of its family:
  - LlamaRMSNorm with a block's norm weight, against analysis/extrap_model.py's norm;
  - LlamaMLP with the block's gate, up and down projections (ffn_in's halves, ffn_out);
  - repeat_kv on key heads, against the query heads' reading of them (repeat_interleave);
  - apply_rotary_pos_emb (rotate_half) with the model's angles, against its half-pair rotation;
  - LlamaForCausalLM / Qwen3ForCausalLM with every weight mapped (q, k and v split from extrap's
    fused qkv; the input embedding times sqrt(d_model), which extrap applies in forward), whose
    logits for LOGITS' tokens must equal extrap's (float32) within 1e-4 of their largest.
Transformers computes RMSNorm and the rotary tables in float32 whatever the model's dtype, so the
parts are compared to 1e-6. Prints "ok MODEL" per model; exits 1 at the first mismatch.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
import extrap_model  # noqa: E402

from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb, repeat_kv)

PART_TOLERANCE = 1e-6  # transformers' float32 RMSNorm and rotary tables against float64
LOGIT_TOLERANCE = 1e-4  # of the largest logit: extrap's float32 model against transformers' float64


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def close(a, b, tolerance, what):
    error = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
    if not error <= tolerance:
        fail(f"{what}: differs by {error:.2e} of its largest value (allowed {tolerance:.0e})")
    print(f"  {what}: within {error:.1e}")


def hf_model(family, model, tensors):
    """The transformers model of `family` holding extrap's weights, float64, in eval mode."""
    m = model.metadata["model"]
    D, H, Hkv, Dh, F = model.d_model, model.heads, model.kv_heads, model.d_head, int(m["d_ffn"])
    options = model.options
    if model.method != "rotary" or options["pairing"] != "half" or float(options["fraction"]) != 1.0:
        fail(f"{family}: the model's position method must be rotary with the half pairing over whole heads")
    common = dict(vocab_size=model.vocab_size, hidden_size=D, intermediate_size=F, num_hidden_layers=model.layers,
                  num_attention_heads=H, num_key_value_heads=Hkv, head_dim=Dh, hidden_act="silu",
                  rms_norm_eps=float(m["norm_eps"]), tie_word_embeddings=False, attention_bias=False,
                  rope_parameters={"rope_type": "default", "rope_theta": float(options["base"])},
                  max_position_embeddings=4096)
    config = LlamaConfig(**common, mlp_bias=False) if family == "llama" else Qwen3Config(**common)
    config._attn_implementation = "eager"
    hf = (LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM)(config).to(torch.float64)
    state = {"model.embed_tokens.weight": tensors["embedding.weight"] * math.sqrt(D),
             "model.norm.weight": tensors["ln_final.weight"], "lm_head.weight": tensors["head.weight"]}
    for l in range(model.layers):
        b, p = f"blocks.{l}.", f"model.layers.{l}."
        qkv = tensors[b + "attention.qkv.weight"]
        state[p + "self_attn.q_proj.weight"] = qkv[:H * Dh]
        state[p + "self_attn.k_proj.weight"] = qkv[H * Dh:(H + Hkv) * Dh]
        state[p + "self_attn.v_proj.weight"] = qkv[(H + Hkv) * Dh:]
        state[p + "self_attn.o_proj.weight"] = tensors[b + "attention.out.weight"]
        state[p + "input_layernorm.weight"] = tensors[b + "ln_attention.weight"]
        state[p + "post_attention_layernorm.weight"] = tensors[b + "ln_ffn.weight"]
        state[p + "mlp.gate_proj.weight"] = tensors[b + "ffn_in.weight"][:F]
        state[p + "mlp.up_proj.weight"] = tensors[b + "ffn_in.weight"][F:]
        state[p + "mlp.down_proj.weight"] = tensors[b + "ffn_out.weight"]
        if family == "qwen3":
            state[p + "self_attn.q_norm.weight"] = tensors[b + "attention.q_norm.weight"]
            state[p + "self_attn.k_norm.weight"] = tensors[b + "attention.k_norm.weight"]
    missing, unexpected = hf.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        fail(f"{family}: transformers' model lacks {unexpected} or extrap's tensors lack {missing}")
    return hf.eval()


def check(family, model_path, logits_path):
    if family not in ("llama", "qwen3"):
        fail(f"unknown family {family!r} (llama, qwen3)")
    tensors, _ = extrap_model.read_safetensors(model_path)
    model = extrap_model.load(model_path, torch.float64)
    torch.manual_seed(0)
    D, H, Hkv, Dh = model.d_model, model.heads, model.kv_heads, model.d_head
    block = model.blocks[0]
    with torch.no_grad():
        # LlamaRMSNorm against the model's norm, with the block's weight.
        x = torch.randn(2, 7, D, dtype=torch.float64)
        norm = LlamaRMSNorm(D, eps=block.ln_attention.eps).double()
        norm.weight.copy_(block.ln_attention.weight)
        close(norm(x), block.ln_attention(x), PART_TOLERANCE, f"{model_path}: LlamaRMSNorm")
        # LlamaMLP with the gate, up and down projections.
        F = int(model.metadata["model"]["d_ffn"])
        mlp = LlamaMLP(LlamaConfig(hidden_size=D, intermediate_size=F, hidden_act="silu", mlp_bias=False)).double()
        mlp.gate_proj.weight.copy_(block.ffn_in.weight[:F])
        mlp.up_proj.weight.copy_(block.ffn_in.weight[F:])
        mlp.down_proj.weight.copy_(block.ffn_out.weight)
        close(mlp(x), model._ffn(block, x), 1e-12, f"{model_path}: LlamaMLP")
        # repeat_kv: query head h reads key head h // (H / Hkv).
        k = torch.randn(2, Hkv, 7, Dh, dtype=torch.float64)
        if not torch.equal(repeat_kv(k, H // Hkv), k.repeat_interleave(H // Hkv, dim=1)):
            fail(f"{model_path}: repeat_kv differs from the query heads' reading of the key heads")
        print(f"  {model_path}: repeat_kv equal")
        # apply_rotary_pos_emb (rotate_half) with the model's angles, against its half-pair rotation.
        cos, sin = model._rotary(model.kinds[0], 0, 7)  # (T, Dh/2)
        q = torch.randn(2, H, 7, Dh, dtype=torch.float64)
        hq, hk = apply_rotary_pos_emb(q, k, torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None])
        close(hq, model._rotate(q, cos, sin, half=True), 1e-12, f"{model_path}: apply_rotary_pos_emb (queries)")
        close(hk, model._rotate(k, cos, sin, half=True), 1e-12, f"{model_path}: apply_rotary_pos_emb (keys)")
        # The whole model of its family, against extrap's logits.
        reference, _ = extrap_model.read_safetensors(logits_path)
        hf = hf_model(family, model, tensors)
        logits = hf(reference["tokens"]).logits
        close(logits, reference["logits"].double(), LOGIT_TOLERANCE, f"{model_path}: {type(hf).__name__}'s logits")
    print(f"ok {model_path}")


def main(argv):
    if len(argv) % 3 != 0 or not argv:
        fail(__doc__)
    for i in range(0, len(argv), 3):
        check(*argv[i:i + 3])


if __name__ == "__main__":
    main(sys.argv[1:])
