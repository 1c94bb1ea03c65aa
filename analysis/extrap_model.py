#!/usr/bin/env python3
"""Load a model written by `extrap export` (format extrap-safetensors/1 to 9) and evaluate it in plain
PyTorch: an independent reference for extrap's forward pass and perplexities, written from the
format's definitions, never from the C++ code. Evaluated in float32 it reproduces extrap's
perplexities to about 1e-5 relative; in float64 it measures how far float32 rounding moves them.

    import torch, extrap_model as em
    model = em.load("run/model.safetensors", dtype=torch.float64)
    ids = model.encode(open("valid.txt", encoding="utf-8", newline="").read())
    em.evaluate(model, ids, length=512, stride=256)  # {nll_sum, scored_tokens, perplexity, windows}
    logits, probs = model(torch.tensor([ids[:64]]), return_attention=True)  # (1, H, 64, 64) each

API
  load(path, dtype=torch.float32, device="cpu", use_package=None) -> ExtrapModel (an nn.Module,
      in eval mode). ValueError for another format, an unknown position method, a causal-only
      method (xpos, cope, fox) in a bidirectional export, a missing, extra or mis-shaped tensor,
      ALiBi slopes other than the definition's, adaptive bands that do not fit the vocabulary
      or d_model. use_package: None = the safetensors package when importable, else this
      file's reader; False = this file's reader.
  model(tokens (B, T) int64, offset=0, return_attention=False) -> logits (B, T, V)
      [, per layer the attention probabilities (B, H, T, T)]
  model.hidden(tokens, offset=0) -> (B, T, D), the final LayerNorm's output (the last block's
      without one: metadata model final_norm false); model.logits(hidden) -> (..., V), with
      adaptive bands the log-probabilities themselves; model.log_probs(hidden) -> (..., V)
  model.bias(layer, T, h=None, q=None, k=None) -> (H, T, T) additive score bias, -inf where a
      key is masked; fox needs the attention's input h = blocks[layer].ln_attention(x) (B, T, D; x
      itself with sublayer_norms output) and cope needs the
      layer's q and k (B, H, T, Dh): their bias is (B, H, T, T)
  model.kinds: a LayerKind per kind of layer (one without a layer pattern), each with its
      method, options (defaults filled in), attention options and the method's tensors;
      model.kind_of(layer) -> (kind, the layer's number among the kind's layers);
      model.method, model.options, model.attention_options: the one kind's (method "pattern"
      with a layer pattern)
  model.metadata (JSON values decoded), model.vocab_size (V), model.vocabulary (word level: a
      list; else None), model.pieces (sentencepiece: a sentencepiece.SentencePieceProcessor;
      else None),
  model.encode(text) -> ids, model.decode(ids) -> text
  tokens_of_file(model, path) -> ids: a file's tokens as extrap reads it (its text, or for a
      pre-tokenised model its .npy or raw .bin ids)
  evaluate(model, tokens, length, stride=0, batch_windows=64) -> {nll_sum, scored_tokens,
      perplexity, windows}; stride 0 or >= length: non-overlapping windows
  also: read_safetensors, alibi_slopes, t5_bucket, mask_decision, evaluation_windows

Position methods: none, sinusoidal, learned, rotary, p_rope (rotary on the highest-frequency
fraction of the pairs), alibi, alibi_symmetric, alibi_nonsymmetric,
alibi_learned, t5_bias, kerple_log, kerple_power, sandwich, fire (score biases), xpos (a scaled
rotary rotation; causal only), cope (a bias from q and the gated scores; causal only), fox (a
bias from the layer's input through forget gates; causal only), path (PaTH: q_i^T H_i ... H_{j+1}
k_j with Householder reflections H_t = I - beta_t w_t w_t^T from the layer's input; causal only),
stick_breaking (no softmax: A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik)), the remaining
mass to the query's own value; causal only; model(..., return_attention=True) gives A), dape
(logits A + B + f([A; B']) with A the scaled scores, B the bias of its base method (position_options
base and base_options; tensors position.base.NAME), B' = B with its masked entries 0, and f an MLP
2H -> mlp_width -> H over the heads at each (i, j)).

The block (metadata model; a format-1 file is GPT-2's: LayerNorm with biases, GELU mlp, full heads,
sequential): norm layernorm or rmsnorm (x / sqrt(mean(x^2) + eps) w), norm_eps, bias (false: no bias
in any linear layer or norm), norm_bias (the norms' own where they differ; absent: bias), ffn mlp,
swiglu or geglu (W2 (act(g) o u) with [g, u] the rows of ffn_in, gate first), kv_heads
(grouped-query attention: qkv's rows are H query, then kv_heads key, then kv_heads value heads,
and query head h reads key head h // (H / kv_heads)), d_head (each head's width; out maps the H d_head
features back to d_model; absent: d_model / heads), block sequential, parallel (x + attn(n1 x) +
ffn(n2 x)) or parallel_shared (one norm, ln_attention), sublayer_norms (sequential: input, x + f(n x);
output, x + n'(f x) with ln_attention_out and ln_ffn_out, no input norms; both, x + n'(f(n x))), qk_norm
(q_norm and k_norm over each head before the position method; qk_norm_over projection: over all the
query heads' values together, and the key heads'), embedding_norm (a norm after the scaled
embedding), norm_affine (false: every norm without weight or bias, OLMo's LayerNorm), clip_qkv C (q, k
and v, the rows of qkv's output, clamped to [-C, C] before qk_norm and the position method; OLMo's,
MPT's). Rotary methods (rotary, xpos, p_rope) pair dimensions (2i, 2i+1), or with the option
pairing "half" (i, i + d_rot/2), Hugging Face's rotate_half; xpos rotates its fraction of the head.

Attention options (metadata "attention", REFERENCE.md "The 2024-26 wave"), in every layer: a
learned sink logit per head (blocks.L.attention.sink), SSMax's per-head s times ln n_i
(blocks.L.attention.ssmax; n_i the keys row i sees), Llama 4's temperature on q, a head-wise or
element-wise output gate sigmoid(h W_g^T) (blocks.L.attention.gate.weight), sliding-window
and chunk masks by index within the window, softcap C (each q.k / sqrt(d) becomes C tanh(q.k /
(sqrt(d) C)) before the bias and the masks; not with cope, path, dape or stick_breaking, whose
scores this reader forms elsewhere) and scale_dim s (q.k / sqrt(s) instead of / sqrt(d_head): q
times sqrt(d_head / s) after the rotation). Metadata model logit_softcap C: the output logits
become C tanh(l / C).

Adaptive input and softmax (metadata model adaptive_cutoffs [c_0, ..., c_{n-2}] and
adaptive_factor f; [] or no key: the embedding.weight of every other model): band k holds ids
[c_{k-1}, c_k) (c_{-1} = 0, c_{n-1} = V) and has adaptive.embedding_k E_k (size_k, D / f^k) and
adaptive.projection_k P_k (D, D / f^k); adaptive.clusters C is (n - 1, D). Token t of band k
embeds as E_k[t - c_{k-1}] P_k^T (times sqrt(D), as any embedding); the output is log_softmax(h
[E_0; C]^T), whose first c_0 columns are band 0's words and whose column c_0 + k - 1 adds to
log_softmax((h P_k) E_k^T) for band k's.

Layer patterns (metadata position "pattern"): metadata "layers" gives one period of kinds,
repeated over depth, and each kind's method, options and attention options; kind K's tensors
are position_K.NAME, a per-layer table holding a row per layer of the kind in depth order.
Each layer runs its kind's method and attention options.

Command line (errors: one line on stderr, exit status 2):
    python analysis/extrap_model.py MODEL.safetensors --tokens-file FILE --length 16 48
        [--stride 8 ...] [--dtype float64] [--max-tokens N] [--json] [--reader fallback]
evaluates every length non-overlapping and with every stride below it; --json prints one object
per line: {"length", "stride", "nll_sum", "scored_tokens", "perplexity"} (stride = length for
non-overlapping windows).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F
from torch import nn

FORMAT = "extrap-safetensors/9"
# 1: before the architecture keys (GPT-2's block), read as such; 2: without 3's scale_embedding, qkv_bias
# and gelu_tanh (their defaults); 3: without 4's norm_bias (model bias); 4: without 5's d_head (d_model / heads);
# 5: without 6's geglu with gelu_tanh (geglu's gate the erf form); 6: without 7's sublayer_norms and
# qk_norm_over (input, head); 7: without 8's softcap, scale_dim and logit_softcap (off); 8: without 9's
# norm_affine (true) and clip_qkv (off)
FORMATS = ("extrap-safetensors/1", "extrap-safetensors/2", "extrap-safetensors/3", "extrap-safetensors/4",
           "extrap-safetensors/5", "extrap-safetensors/6", "extrap-safetensors/7", "extrap-safetensors/8", FORMAT)
PATTERN = "pattern"  # metadata position of an export with a layer pattern: see metadata "layers"
POSITION_METHODS = ("none", "sinusoidal", "learned", "rotary", "p_rope", "alibi", "alibi_symmetric",
                    "alibi_nonsymmetric", "alibi_learned", "t5_bias", "kerple_log", "kerple_power",
                    "sandwich", "xpos", "fire", "cope", "fox", "path", "stick_breaking", "dape")
# DAPE's base B: a bias of positions alone.
DAPE_BASES = ("alibi", "alibi_symmetric", "alibi_nonsymmetric", "alibi_learned", "t5_bias", "kerple_log",
              "kerple_power", "sandwich", "fire")
CAUSAL_ONLY = ("xpos", "cope", "fox", "path", "stick_breaking")  # refused in a bidirectional (masked-LM) export
POSITION_DEFAULTS = {"rotary": {"base": 10000.0, "fraction": 1.0, "pairing": "interleaved"},
                     "sinusoidal": {"base": 10000.0},
                     "p_rope": {"base": 10000.0, "keep": 0.75, "pairing": "interleaved"},
                     "learned": {"max_length": 1024},
                     "alibi_learned": {"shared_across_layers": True},
                     "t5_bias": {"buckets": 32, "max_distance": 128, "shared_across_layers": True},
                     "kerple_log": {"shared_across_layers": True},
                     "kerple_power": {"shared_across_layers": True},
                     "sandwich": {"base": 10000.0, "scale": 8.0},
                     "xpos": {"base": 10000.0, "scale_base": 512.0, "gamma": 0.4, "fraction": 1.0,
                              "pairing": "interleaved"},
                     "fire": {"mlp_width": 32, "init_L": 512.0, "eps": 1e-6,
                              "shared_across_layers": False},
                     "path": {"rank": 32, "conv_size": 3, "forget_gate": False, "init_std": 0.02},
                     "stick_breaking": {"attend_current": False},
                     "dape": {"base": "", "mlp_width": 32, "base_options": {}}}
JSON_METADATA = ("position_options", "model", "data", "eval", "train", "vocabulary", "checkpoint", "layers",
                 "attention")
# The attention options (metadata "attention"; an export without the key has none of them).
ATTENTION_DEFAULTS = {"sink": False, "ssmax": False, "temperature": 0.0, "temperature_floor": 8192,
                      "gate": "none", "window": 0, "chunk": 0, "softcap": 0.0, "scale_dim": 0.0}
SOFTCAP_ELSEWHERE = ("cope", "path", "dape", "stick_breaking")  # their scores are formed apart from q.k + bias
# The architecture (metadata model; a format-1 file has none of these keys: GPT-2's block). Each
# key's values as extrap writes them; anything else is refused by name.
MODEL_DEFAULTS = {"ffn": "mlp", "norm": "layernorm", "bias": True, "block": "sequential", "qk_norm": False,
                  "embedding_norm": False, "qkv_bias": False, "scale_embedding": True, "sublayer_norms": "input",
                  "qk_norm_over": "head", "norm_affine": True}
MODEL_CHOICES = {"ffn": ("mlp", "swiglu", "geglu"), "norm": ("layernorm", "rmsnorm"), "bias": (True, False),
                 "block": ("sequential", "parallel", "parallel_shared"), "qk_norm": (True, False),
                 "embedding_norm": (True, False), "qkv_bias": (True, False), "scale_embedding": (True, False),
                 "norm_bias": (True, False), "sublayer_norms": ("input", "output", "both"),
                 "qk_norm_over": ("head", "projection"), "norm_affine": (True, False)}  # norm_bias's default is bias's
WORD_SPECIALS = {"<eos>": 0, "<unk>": 1, "<mask>": 2}
MASK64 = 0xFFFF_FFFF_FFFF_FFFF
SLOPE_RTOL = 2.4e-7  # two float32 ulps: the stored slopes are the definition rounded to float32

# ----------------------------------------------------------------------------- safetensors
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
           "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path, use_package=None):
    """(tensors: name -> tensor on the CPU, metadata: str -> str) of a safetensors file."""
    if use_package is not False:
        try:
            from safetensors import safe_open
        except ImportError:
            if use_package:
                raise
        else:
            with safe_open(path, framework="pt") as f:
                return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    return _read_safetensors_plain(path)


def _read_safetensors_plain(path):
    """The format read by hand: u64 little-endian header length N, N bytes of JSON, the data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} does not fit in the file ({len(blob)} bytes)")
    if blob[8:9] != b"{":
        raise ValueError(f"{path}: the safetensors header does not start with '{{'")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings")
    tensors = {}
    for name, entry in header.items():
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name}: bad header entry {entry!r}") from None
        count = math.prod(shape)
        if not 0 <= begin <= end <= len(data) or end - begin != count * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name}: data_offsets [{begin}, {end}] do not hold "
                             f"{count} x {entry['dtype']} inside the {len(data)}-byte data buffer")
        # A copy (bytearray) keeps every tensor aligned and writable.
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if count else \
            torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(shape)
    return tensors, metadata


# ----------------------------------------------------------------------------- definitions
def alibi_slopes(n):
    """ALiBi's n fixed slopes: 2^(-8(h+1)/p) for the largest power of two p <= n, then slopes
    0, 2, 4, ... of the 2p-head sequence until there are n."""
    p = 1 << (n.bit_length() - 1)
    return ([2.0 ** (-8.0 * (h + 1) / p) for h in range(p)] +
            [2.0 ** (-8.0 * (h + 1) / (2 * p)) for h in range(0, 2 * (n - p), 2)])


def t5_bucket(relative, buckets, max_distance, bidirectional):
    """T5's bucket of relative = j - i (key minus query position), computed in float64."""
    if bidirectional:  # the upper half of the buckets is for keys to the right
        nb, bucket, n = buckets // 2, (buckets // 2 if relative > 0 else 0), abs(relative)
    else:
        nb, bucket, n = buckets, 0, max(-relative, 0)
    max_exact = nb // 2
    if n < max_exact:
        return bucket + n
    # log-spaced above max_exact; the 1e-9 puts a distance exactly on a boundary in the next bucket
    scaled = math.log(n / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact) + 1e-9
    return bucket + min(max_exact + math.floor(scaled), nb - 1)


def _mix(x):  # splitmix64's finaliser, uint64 arithmetic (Python ints masked to 64 bits)
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _unit(h):  # the top 53 bits as a double in [0, 1), exactly
    return (h >> 11) * 2.0 ** -53


def mask_decision(pos, token, mask_prob, seed, mask_token, vocab_size):
    """(selected, input id) of the token at absolute stream position pos in masked-LM evaluation."""
    h = _mix(((seed & MASK64) * 0x100000001B3 & MASK64) ^ _mix(pos & MASK64))
    if _unit(h) >= mask_prob:
        return False, token
    h2 = _mix(h)
    u = _unit(h2)
    if u < 0.8:
        return True, mask_token
    if u < 0.9:  # a random token other than the mask token
        real = vocab_size - 1 if 0 <= mask_token < vocab_size else vocab_size
        r = _mix(h2) % real
        return True, r + 1 if mask_token >= 0 and r >= mask_token else r
    return True, token


def evaluation_windows(last, length, stride):
    """[(begin, size, score_from)] covering input positions 0 .. last-1."""
    if stride <= 0 or stride >= length:  # non-overlapping
        return [(b, min(length, last - b), 0) for b in range(0, last, length)]
    end = min(length, last)
    windows = [(0, end, 0)]
    while end < last:  # each window scores the stride tokens after the previous window's end
        nxt = min(end + stride, last)
        begin = max(0, nxt - length)
        windows.append((begin, nxt - begin, end - begin))
        end = nxt
    return windows


# ----------------------------------------------------------------------------- the model
def _finite_at_least_zero(value):
    """Whether a metadata number (a cap, a scale, a clip; 0: off) is a finite number >= 0, not a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)


def _kind_metadata(where, method, options, attention):
    """A kind's method, its options with the defaults filled in, and its attention options."""
    if method not in POSITION_METHODS:
        raise ValueError(f"{where}: unknown position method {method!r}; supported: "
                         + ", ".join(POSITION_METHODS))
    if not isinstance(options, dict) or not isinstance(attention, dict):
        raise ValueError(f"{where}: position_options and attention must be JSON objects")
    unknown = sorted(set(attention) - set(ATTENTION_DEFAULTS))
    if unknown:
        raise ValueError(f"{where}: 'attention' has unknown option(s) {', '.join(unknown)}; supported: "
                         + ", ".join(ATTENTION_DEFAULTS))
    attention = {**ATTENTION_DEFAULTS, **attention}
    if attention["gate"] not in ("none", "headwise", "elementwise"):
        raise ValueError(f"{where}: 'attention': unknown gate {attention['gate']!r}; "
                         "supported: none, headwise, elementwise")
    for key in ("softcap", "scale_dim"):
        value = attention[key]
        if not _finite_at_least_zero(value):
            raise ValueError(f"{where}: 'attention': {key} {value!r} must be a finite number at least 0")
    if attention["softcap"] > 0 and method in SOFTCAP_ELSEWHERE:
        raise ValueError(f"{where}: 'attention': softcap with position method {method!r} is not read here "
                         "(this reader forms its scores apart from q.k + bias)")
    return {"position": method, "position_options": {**POSITION_DEFAULTS.get(method, {}), **options},
            "attention": attention}


def _metadata(raw):
    if raw.get("format") not in FORMATS:
        raise ValueError(f"metadata format is {raw.get('format')!r}, expected one of {', '.join(FORMATS)}")
    for key in ("position", "model", "data"):
        if key not in raw:
            raise ValueError(f"metadata has no {key!r}")
    parsed = dict(raw)
    for key in JSON_METADATA:
        if key in raw:
            try:
                parsed[key] = json.loads(raw[key])
            except json.JSONDecodeError as e:
                raise ValueError(f"metadata {key!r} is not valid JSON: {e}") from None
    if parsed["position"] == PATTERN:  # "layers": {"pattern": [kind, ...], "kinds": {kind: {...}}}
        layers = parsed.get("layers")
        if not isinstance(layers, dict) or not isinstance(layers.get("pattern"), list) \
                or not layers["pattern"] or not isinstance(layers.get("kinds"), dict):
            raise ValueError("metadata position is 'pattern' but 'layers' has no pattern and kinds")
        kinds = {}
        for name in layers["pattern"]:
            if name not in layers["kinds"]:
                raise ValueError(f"metadata 'layers': pattern entry {name!r} is not one of the kinds")
            entry = layers["kinds"][name]
            if not isinstance(entry, dict) or "position" not in entry:
                raise ValueError(f"metadata 'layers': kind {name!r} has no 'position'")
            kinds[name] = _kind_metadata(f"metadata 'layers' kind {name!r}", entry["position"],
                                         entry.get("position_options", {}), entry.get("attention", {}))
        parsed["layers"] = {"pattern": list(layers["pattern"]), "kinds": kinds}
    else:
        kind = _kind_metadata("metadata", parsed["position"], parsed.get("position_options", {}),
                              parsed.get("attention", {}))
        parsed["position_options"], parsed["attention"] = kind["position_options"], kind["attention"]
    return parsed


class Norm(nn.Module):
    """A LayerNorm, (x - mean) / sqrt(var + eps) w + b, or an RMSNorm, x / sqrt(mean(x^2) + eps) w + b,
    over the last dimension (metadata model norm, norm_eps); without a bias (model norm_bias, or bias,
    false) b is absent; without parameters (model norm_affine false) w and b both. Parameters weight
    and bias, as the file's tensors."""

    def __init__(self, width, rms, eps, bias, kw, affine=True):
        super().__init__()
        self.rms, self.eps = rms, eps
        self.weight = nn.Parameter(torch.empty(width, **kw)) if affine else None
        self.bias = nn.Parameter(torch.empty(width, **kw)) if bias and affine else None

    def forward(self, x):
        if self.rms:
            u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        else:
            centred = x - x.mean(-1, keepdim=True)
            u = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            u = u * self.weight
        return u if self.bias is None else u + self.bias


class LayerKind(nn.Module):
    """One kind of layer: its position method (`method`), the method's options (`options`, defaults
    filled in), its attention options (`attention`) and the method's tensors, as parameters of this
    module. An export without a layer pattern has one kind, every layer's, registered as the model's
    `position` (tensors position.NAME); a pattern's kind K is `position_K` (tensors
    position_K.NAME), and its per-layer tables have a row per layer of the kind, in depth order."""

    def __init__(self, name, entry, model, layers, kw):
        super().__init__()
        self.kind_name, self.method = name, entry["position"]
        self.options, self.attention, self.layers = entry["position_options"], entry["attention"], layers
        where = f"kind {name!r}: " if name else ""
        D, H, Dh, a = model.d_model, model.heads, model.d_head, self.attention
        S = 1 if self.options.get("shared_across_layers", True) else layers
        if self.method == "rotary" and self.options.get("scaling", "none") != "none":
            raise ValueError(f"{where}rotary with RoPE scaling {self.options['scaling']!r} built in (an imported "
                             "checkpoint's rope_scaling) is not read here; extrap eval computes it")
        if self.method == "alibi" and (self.options.get("round_to", "none") != "none" or self.options.get("round_slopes")
                                       or float(self.options.get("bias_scale", 1.0)) != 1.0):
            raise ValueError(f"{where}alibi with a released family's rounding or scale (round_to, round_slopes, "
                             "bias_scale) is not read here; extrap eval computes it")
        shapes = {}
        if self.method in ("alibi", "alibi_symmetric", "alibi_nonsymmetric"):
            shapes = {"slopes": (H,)}
        elif self.method == "alibi_learned":
            shapes = {"raw_slopes": (S, H)} if model.causal else \
                {"raw_slopes_left": (S, H), "raw_slopes_right": (S, H)}
        elif self.method == "learned":
            shapes = {"table": (int(self.options["max_length"]), D)}
        elif self.method == "t5_bias":
            shapes = {"table": (S, int(self.options["buckets"]), H)}
        elif self.method in ("kerple_log", "kerple_power"):
            shapes = {"r1": (S, H), "r2": (S, H)}
        elif self.method == "fire":
            W = int(self.options["mlp_width"])
            if W < 1:
                raise ValueError(f"{where}fire: mlp_width must be positive, not {W}")
            shapes = {"w1": (S, W), "b1": (S, W), "w2": (S, H, W), "b2": (S, H), "c": (S,),
                      "L_multiplier": (S,)}
        elif self.method == "cope":
            for key in ("npos", "per_head"):
                if key not in self.options:
                    raise ValueError(f"{where}cope: position_options lacks {key!r}")
            if int(self.options["npos"]) < 1:
                raise ValueError(f"{where}cope: npos must be positive, not {self.options['npos']}")
            E = H if self.options["per_head"] else 1
            shapes = {"embeddings": (layers, E, Dh, int(self.options["npos"]))}
        elif self.method == "fox":
            shapes = {"gate_weight": (layers, H, D), "gate_bias": (layers, H)}
        elif self.method == "path":
            for key in ("rank", "conv_size", "forget_gate"):
                if key not in self.options:
                    raise ValueError(f"{where}path: position_options lacks {key!r}")
            rank, size = int(self.options["rank"]), int(self.options["conv_size"])
            if rank < 0 or size < 0:
                raise ValueError(f"{where}path: rank {rank} and conv_size {size} must not be negative")
            shapes = {"w_down": (layers, rank, D), "w_up": (layers, D, rank)} if rank > 0 else \
                {"w_proj": (layers, D, D)}
            if size > 0:
                shapes["w_conv"] = (layers, D, size)
            shapes.update(beta_weight=(layers, H, D), beta_bias=(layers, H))
            if self.options["forget_gate"]:
                shapes.update(gate_weight=(layers, H, D), gate_bias=(layers, H))
        elif self.method == "dape":
            W = int(self.options["mlp_width"])
            if W < 1:
                raise ValueError(f"{where}dape: mlp_width must be positive, not {W}")
            base = self.options.get("base") or ("alibi" if model.causal else "alibi_symmetric")
            if base not in DAPE_BASES:
                raise ValueError(f"{where}dape: base {base!r} is not a bias of positions alone; supported: "
                                 + ", ".join(DAPE_BASES))
            # The base's tensors are position.base.NAME (position_K.base.NAME), shaped as its own.
            self.base = LayerKind(name, _kind_metadata(f"{where}dape's base", base, self.options.get("base_options") or {}, {}),
                                  model, layers, kw)
            shapes = {"w1": (layers, W, 2 * H), "b1": (layers, W), "w2": (layers, H, W), "b2": (layers, H)}
        elif self.method == "stick_breaking" and a["sink"]:
            raise ValueError(f"{where}stick_breaking has no softmax for a sink column to join; this export has a sink")
        for tensor, shape in shapes.items():
            self.register_parameter(tensor, nn.Parameter(torch.empty(shape, **kw)))
        if self.method in CAUSAL_ONLY and not model.causal:
            raise ValueError(f"{where}position method {self.method!r} is causal only; this export is a "
                             f"bidirectional model (objective {model.metadata['model'].get('objective')!r})")
        if self.method == "alibi_nonsymmetric" and H % 2:
            raise ValueError(f"{where}alibi_nonsymmetric needs an even number of heads, not {H}")
        if self.method == "t5_bias":
            nb = int(self.options["buckets"]) // (2 if not model.causal else 1)
            if nb // 2 < 1 or self.options["max_distance"] <= nb // 2:
                raise ValueError(f"{where}t5_bias: {self.options['buckets']} buckets and max_distance "
                                 f"{self.options['max_distance']} leave no log-spaced buckets")

    def bias_row(self, index):  # which row of a per-layer table the kind's layer `index` uses
        return 0 if self.options.get("shared_across_layers", True) else index


def _adaptive_bands(m, V, D):
    """The band ends [c_0, ..., c_{n-2}, V] and each band's width of metadata model's
    adaptive_cutoffs and adaptive_factor; [] and [] for a plain embedding (no key, or [])."""
    cutoffs = m.get("adaptive_cutoffs", [])
    if not isinstance(cutoffs, list) or any(type(c) is not int for c in cutoffs):
        raise ValueError(f"metadata model: adaptive_cutoffs must be a list of integers, not {cutoffs!r}")
    if not cutoffs:
        return [], []
    factor = m.get("adaptive_factor", 4)
    if type(factor) is not int or factor < 1:
        raise ValueError(f"metadata model: adaptive_factor must be an integer at least 1, not {factor!r}")
    if any(not a < b for a, b in zip([0] + cutoffs, cutoffs + [V])):
        raise ValueError(f"metadata model: adaptive_cutoffs {cutoffs} must increase from above 0 to below "
                         f"the vocabulary's {V} words")
    widths = [D // factor ** k for k in range(len(cutoffs) + 1)]  # d_model / factor^k, rounded down
    if widths[-1] < 1:
        raise ValueError(f"metadata model: adaptive_cutoffs {cutoffs} make {len(widths)} bands of d_model {D} / "
                         f"{factor}^k: the last is 0 wide")
    if not m.get("tie_embeddings", True):
        raise ValueError("metadata model: tie_embeddings is false with adaptive_cutoffs; extrap's adaptive "
                         "softmax always shares the adaptive input's weights")
    return cutoffs + [V], widths


class AdaptiveVocabulary(nn.Module):
    """Adaptive input embeddings and an adaptive softmax sharing their weights (metadata model
    adaptive_cutoffs, adaptive_factor; tensors adaptive.NAME). Band k holds ids [c_{k-1}, c_k)
    (c_{-1} = 0, c_{n-1} = V, n bands) and has embedding_k E_k (size_k, dim_k) and projection_k
    P_k (D, dim_k), dim_k = d_model / factor^k; clusters C (n - 1, D) holds the head's logit of
    each tail band."""

    def __init__(self, ends, widths, D, kw):
        super().__init__()
        self.ends = ends
        for k, width in enumerate(widths):
            self.register_parameter(f"embedding_{k}", nn.Parameter(torch.empty(self.size(k), width, **kw)))
            self.register_parameter(f"projection_{k}", nn.Parameter(torch.empty(D, width, **kw)))
        self.clusters = nn.Parameter(torch.empty(len(ends) - 1, D, **kw))

    def begin(self, k):  # band k's first id
        return 0 if k == 0 else self.ends[k - 1]

    def size(self, k):  # band k's number of ids
        return self.ends[k] - self.begin(k)

    def band(self, k):  # (E_k, P_k)
        return getattr(self, f"embedding_{k}"), getattr(self, f"projection_{k}")

    def embed(self, tokens):  # ids (...) -> (..., D): E_k[t - c_{k-1}] P_k^T for t of band k, unscaled
        C = self.clusters
        out = torch.zeros(*tokens.shape, C.shape[1], dtype=C.dtype, device=C.device)
        for k in range(len(self.ends)):
            E, P = self.band(k)
            inside = (tokens >= self.begin(k)) & (tokens < self.ends[k])
            out[inside] = E[tokens[inside] - self.begin(k)] @ P.T
        return out

    def log_probs(self, hidden):  # (..., D) -> (..., V): log p of every word
        """The head's log_softmax(h [E_0; C]^T) gives band 0's words and each tail band's mass; a
        word of tail band k adds log_softmax((h P_k) E_k^T) over its band."""
        E0, _ = self.band(0)
        head = (hidden @ torch.cat((E0, self.clusters)).T).log_softmax(dim=-1)  # (..., c_0 + n - 1)
        c0 = self.ends[0]
        parts = [head[..., :c0]]
        for k in range(1, len(self.ends)):
            E, P = self.band(k)
            parts.append(head[..., c0 + k - 1:c0 + k] + ((hidden @ P) @ E.T).log_softmax(dim=-1))
        return torch.cat(parts, dim=-1)


class ExtrapModel(nn.Module):
    """extrap's pre-LayerNorm transformer; parameter names are the file's tensor names. Its token
    embedding is `embedding` (tensor embedding.weight), or with adaptive bands `adaptive` (an
    AdaptiveVocabulary, and `embedding` None); `ln_final` is None without the final LayerNorm
    (metadata model final_norm false)."""

    def __init__(self, metadata, vocabulary=None, dtype=torch.float32):
        super().__init__()
        self.metadata, self.vocabulary = metadata, vocabulary
        m = metadata["model"]
        self.layers, self.d_model, self.heads = int(m["layers"]), int(m["d_model"]), int(m["heads"])
        if "d_head" in m:  # each head's width; q, k, v are heads x d_head wide, out maps them back to d_model
            self.d_head = m["d_head"]
            if not isinstance(self.d_head, int) or isinstance(self.d_head, bool) or self.d_head < 1:
                raise ValueError(f"metadata model: d_head {self.d_head!r} is not a positive integer")
        elif self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        else:
            self.d_head = self.d_model // self.heads
        self.causal = bool(m["causal"]) and m.get("objective") != "masked_lm"
        activation = m.get("activation", "gelu")
        if activation not in ("gelu", "relu", "gelu_tanh"):
            raise ValueError(f"unknown activation {activation!r}; supported: gelu, relu, gelu_tanh")
        self.act = {"relu": F.relu, "gelu": F.gelu,  # gelu: exact (erf)
                    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}[activation]
        # The architecture: every key's value checked, so that none is read as something else.
        self.arch = {key: m.get(key, default) for key, default in MODEL_DEFAULTS.items()}
        self.arch["norm_bias"] = m.get("norm_bias", self.arch["bias"])  # absent: bias's
        for key, value in self.arch.items():
            if value not in MODEL_CHOICES[key] or (isinstance(value, bool) != isinstance(MODEL_CHOICES[key][0], bool)):
                raise ValueError(f"metadata model: {key} {value!r} is not one of "
                                 f"{', '.join(map(str, MODEL_CHOICES[key]))}")
        if (self.arch["ffn"], activation) in (("geglu", "relu"), ("swiglu", "relu"), ("swiglu", "gelu_tanh")):
            raise ValueError(f"metadata model: activation {activation!r} with ffn {self.arch['ffn']!r} (swiglu "
                             "gates with SiLU, geglu with gelu or gelu_tanh)")
        if self.arch["sublayer_norms"] != "input" and self.arch["block"] != "sequential":
            raise ValueError(f"metadata model: sublayer_norms {self.arch['sublayer_norms']!r} with block "
                             f"{self.arch['block']!r} (only the sequential block has norms after its sublayers)")
        self.logit_softcap = m.get("logit_softcap", 0.0)
        if not _finite_at_least_zero(self.logit_softcap):
            raise ValueError(f"metadata model: logit_softcap {self.logit_softcap!r} must be a finite number at least 0")
        if self.logit_softcap > 0 and m.get("adaptive_cutoffs"):
            raise ValueError("metadata model: logit_softcap with adaptive_cutoffs (no one row of logits to cap)")
        self.clip_qkv = m.get("clip_qkv", 0.0)  # q, k and v clamped to [-C, C] after the projection (0: off)
        if not _finite_at_least_zero(self.clip_qkv):
            raise ValueError(f"metadata model: clip_qkv {self.clip_qkv!r} must be a finite number at least 0")
        self.kv_heads = int(m.get("kv_heads", self.heads))
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"metadata model: kv_heads {self.kv_heads} does not divide heads {self.heads}")
        D, Fd, V, H = self.d_model, int(m["d_ffn"]), int(metadata["data"]["vocab_size"]), self.heads
        eps, kw = float(m.get("norm_eps", m.get("layer_norm_eps", 1e-5))), dict(device="meta", dtype=dtype)
        rms, bias, gated = self.arch["norm"] == "rmsnorm", self.arch["bias"], self.arch["ffn"] != "mlp"
        norm_bias, affine = self.arch["norm_bias"], self.arch["norm_affine"]
        Hkv, Dh = self.kv_heads, self.d_head
        # The kinds of layer and each layer's kind and its number among its kind's layers.
        if metadata["position"] == PATTERN:
            pattern, entries = metadata["layers"]["pattern"], metadata["layers"]["kinds"]
            if self.layers % len(pattern):
                raise ValueError(f"metadata 'layers': a pattern of {len(pattern)} does not divide "
                                 f"{self.layers} layers")
            names = list(dict.fromkeys(pattern))  # in order of first use
            self.layer_kind = [names.index(pattern[l % len(pattern)]) for l in range(self.layers)]
        else:
            names, entries = [""], {"": {k: metadata[k] for k in ("position", "position_options", "attention")}}
            self.layer_kind = [0] * self.layers
        self.layer_index = [self.layer_kind[:l].count(self.layer_kind[l]) for l in range(self.layers)]
        self.kinds = []
        for k, name in enumerate(names):
            kind = LayerKind(name, entries[name], self, self.layer_kind.count(k), kw)
            self.add_module("position_" + name if name else "position", kind)
            self.kinds.append(kind)
            if kind.method in ("learned", "sinusoidal") and name:
                raise ValueError(f"kind {name!r}: {kind.method} adds to the token embeddings once "
                                 "for the whole model; a layer pattern's methods act in their own layers")
        # An export without a pattern: its one method, options and attention options.
        self.method = self.kinds[0].method if len(names) == 1 and not names[0] else PATTERN
        self.options, self.attention_options = self.kinds[0].options, self.kinds[0].attention
        self.vocab_size = V
        ends, widths = _adaptive_bands(m, V, D)
        self.embedding = None if ends else nn.Embedding(V, D, **kw)
        self.adaptive = AdaptiveVocabulary(ends, widths, D, kw) if ends else None
        self.blocks = nn.ModuleList()
        for layer in range(self.layers):
            a = self.kinds[self.layer_kind[layer]].attention
            block = nn.Module()
            inputs, outputs = self.arch["sublayer_norms"] != "output", self.arch["sublayer_norms"] != "input"
            block.ln_attention = Norm(D, rms, eps, norm_bias, kw, affine) if inputs else None
            block.ln_ffn = Norm(D, rms, eps, norm_bias, kw, affine) if self.arch["block"] != "parallel_shared" and inputs else None
            # norms of the sublayers' outputs, before the residual add (OLMo 2; Gemma 2 and 3 with both)
            block.ln_attention_out = Norm(D, rms, eps, norm_bias, kw, affine) if outputs else None
            block.ln_ffn_out = Norm(D, rms, eps, norm_bias, kw, affine) if outputs else None
            block.attention = nn.Module()
            block.attention.qkv = nn.Linear(D, (H + 2 * Hkv) * Dh, bias=bias or self.arch["qkv_bias"], **kw)  # out features: H q, Hkv k, Hkv v heads
            block.attention.out = nn.Linear(H * Dh, D, bias=bias, **kw)             # in features [H][Dh]
            if self.arch["qk_norm"]:  # a norm of each head's q and k, shared by the heads, or of the projection's
                whole = self.arch["qk_norm_over"] == "projection"
                block.attention.q_norm = Norm(H * Dh if whole else Dh, rms, eps, norm_bias, kw, affine)
                block.attention.k_norm = Norm(Hkv * Dh if whole else Dh, rms, eps, norm_bias, kw, affine)
            if a["sink"]:  # each head's sink logit
                block.attention.register_parameter("sink", nn.Parameter(torch.empty(H, **kw)))
            if a["ssmax"]:  # SSMax's s, per head
                block.attention.register_parameter("ssmax", nn.Parameter(torch.empty(H, **kw)))
            if a["gate"] != "none":  # sigmoid(h W_g^T): one gate per head, or per feature
                block.attention.gate = nn.Linear(D, H if a["gate"] == "headwise" else H * Dh, bias=False, **kw)
            # ffn_in's rows: the hidden units, or for a gated FFN [gate; up], 2 d_ffn
            block.ffn_in = nn.Linear(D, 2 * Fd if gated else Fd, bias=bias, **kw)
            block.ffn_out = nn.Linear(Fd, D, bias=bias, **kw)
            self.blocks.append(block)
        final_norm = m.get("final_norm", True)  # files older than the key: always a final LayerNorm
        if not isinstance(final_norm, bool):
            raise ValueError(f"metadata model: final_norm must be true or false, not {final_norm!r}")
        self.ln_final = Norm(D, rms, eps, norm_bias, kw, affine) if final_norm else None
        self.embedding_norm = Norm(D, rms, eps, norm_bias, kw, affine) if self.arch["embedding_norm"] else None
        self.head = None if m.get("tie_embeddings", True) else nn.Linear(D, V, bias=False, **kw)
        self._word_ids = None
        self.pieces = None  # sentencepiece: set by load() from the export's tokenizer model
        self._piece_ids = None  # its SentencePieceIds, made on the first encode
        self.hf_tokenizer = None  # hf: set by load() from the export's tokenizer.json

    def kind_of(self, layer):  # (the layer's LayerKind, its number among the kind's layers)
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer {layer}: the model's layers are 0 to {self.layers - 1}")
        return self.kinds[self.layer_kind[layer]], self.layer_index[layer]

    def _weight(self):  # a weight of the model, for the dtype and device of what it computes
        return self.embedding.weight if self.adaptive is None else self.adaptive.clusters

    # -- position methods: input embeddings, q/k rotation, score bias
    def _absolute_positions(self, offset, T):  # (T, D) or None; never a pattern's (refused)
        kind = self.kinds[0]
        if kind.method == "learned":
            if offset + T > kind.table.shape[0]:
                raise ValueError(f"learned positions end at {kind.table.shape[0]}; "
                                 f"positions {offset} .. {offset + T - 1} asked for")
            return kind.table[offset:offset + T]
        if kind.method == "sinusoidal":
            D, base = self.d_model, float(kind.options["base"])
            p = torch.arange(offset, offset + T, dtype=torch.float64)[:, None]
            freq = torch.tensor([base ** (-2.0 * i / D) for i in range((D + 1) // 2)],
                                dtype=torch.float64)
            angle = p * freq  # (T, ceil(D/2)); columns 2i = sin, 2i+1 = cos, truncated to D
            pe = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)[:, :D]
            w = self._weight()  # float64 rounded to float32 as in extrap, then to our dtype
            return pe.to(torch.float32).to(device=w.device, dtype=w.dtype)
        return None

    def check_window(self, length):
        """Refuses a window of `length` tokens the model's positions cannot take (learned
        positions past their table), before anything is computed."""
        self._absolute_positions(0, length)

    def _rotary(self, kind, offset, T):  # (cos, sin), each (T, d_rot/2), or None
        if kind.method not in ("rotary", "p_rope"):
            return None
        base = float(kind.options["base"])
        if kind.method == "rotary":  # the first d_rot dimensions, with frequencies over d_rot
            d_rot = 2 * math.floor(float(kind.options["fraction"]) * self.d_head / 2 + 1e-9)
            theta = [base ** (-2.0 * i / d_rot) for i in range(d_rot // 2)]
        elif kind.method == "p_rope":  # rotary's frequencies over the head, the highest m kept
            m = math.floor(float(kind.options["keep"]) * (self.d_head // 2) + 1e-9)
            theta = [base ** (-2.0 * i / self.d_head) for i in range(m)]
            if m and kind.options["pairing"] == "half":  # pairs (i, i + d/2): the others at angle 0
                theta += [0.0] * (self.d_head // 2 - m)
        else:
            return None
        if not theta:
            return None
        theta = torch.tensor(theta, dtype=torch.float64)
        angle = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * theta
        w = self._weight()
        return angle.cos().to(w.device, w.dtype), angle.sin().to(w.device, w.dtype)

    def _xpos(self, kind, offset, T):  # ((cos, sin) of the queries, (cos, sin) of the keys), or None
        """xPos: the rotary rotation of the first d = fraction d_head dimensions with pair m of the
        query at position n scaled by zeta_m^(n / scale_base) and of the key by
        zeta_m^(-n / scale_base), zeta_m = (2m + gamma d) / ((1 + gamma) d), folded into the
        tables. n is centred on the window's middle (scores are unchanged by any shift of n);
        computed in float64, rounded to the model's dtype."""
        if kind.method != "xpos":
            return None
        d_rot = 2 * math.floor(float(kind.options["fraction"]) * self.d_head / 2 + 1e-9)
        if d_rot == 0:
            return None
        base, scale_base = float(kind.options["base"]), float(kind.options["scale_base"])
        gamma = float(kind.options["gamma"])
        theta = torch.tensor([base ** (-2.0 * i / d_rot) for i in range(d_rot // 2)],
                             dtype=torch.float64)
        zeta = torch.tensor([(2.0 * i + gamma * d_rot) / ((1.0 + gamma) * d_rot)
                             for i in range(d_rot // 2)], dtype=torch.float64)
        angle = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * theta
        n = (torch.arange(T, dtype=torch.float64) - T // 2)[:, None] / scale_base
        cos, sin = angle.cos(), angle.sin()
        w = self._weight()
        tables = []
        for scale in (zeta ** n, zeta ** -n):  # queries, keys: (T, d_rot/2)
            tables.append(((cos * scale).to(w.device, w.dtype),
                           (sin * scale).to(w.device, w.dtype)))
        return tuple(tables)

    def _rotations(self, kind, offset, T):  # (queries' (cos, sin), keys' (cos, sin)) or None
        rotary = self._rotary(kind, offset, T)
        return (rotary, rotary) if rotary is not None else self._xpos(kind, offset, T)

    @staticmethod
    def _rotate(x, cos, sin, half=False):
        """x (B, H, T, Dh): the pairs of the first d_rot = 2 cos.shape[-1] dims rotated: (2i, 2i+1),
        or with half (the method's pairing "half", as Hugging Face's rotate_half) (i, i + d_rot/2)."""
        d = 2 * cos.shape[-1]
        if half:
            x0, x1 = x[..., :d // 2], x[..., d // 2:d]
            rotated = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
        else:
            x0, x1 = x[..., 0:d:2], x[..., 1:d:2]
            rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
        return torch.cat((rotated, x[..., d:]), dim=-1)

    def bias(self, layer, T, h=None, q=None, k=None):
        """(H, T, T) additive bias on the scores of `layer` (i = query, j = key), -inf = masked,
        by the layer's position method (the window and chunk masks are not in it).
        fox's bias depends on the layer's input: h = blocks[layer].ln_attention(x) (B, T, D), the
        normalised attention input, is required and the bias is (B, H, T, T). cope's depends on
        the queries and the scores: q and k (B, H, T, Dh), as the layer computes them, are
        required and the bias is (B, H, T, T). Other methods ignore h, q and k."""
        kind, index = self.kind_of(layer)
        if kind.method == "fox":
            if h is None:
                raise ValueError("fox: the bias depends on the layer's input; pass "
                                 "h = blocks[layer].ln_attention(x), shaped (B, T, D)")
            if h.dim() != 3 or h.shape[1] != T or h.shape[2] != self.d_model:
                raise ValueError(f"fox: h must be (B, {T}, {self.d_model}), not {tuple(h.shape)}")
            return self._fox_bias(kind, index, h)
        if kind.method == "cope":
            if q is None or k is None:
                raise ValueError("cope: the bias depends on the queries and the scores; pass q "
                                 "and k, each (B, H, T, Dh), as the layer computes them")
            want = (self.heads, T, self.d_head)
            if q.dim() != 4 or k.shape != q.shape or tuple(q.shape[1:]) != want:
                raise ValueError(f"cope: q and k must be (B, {', '.join(map(str, want))}), not "
                                 f"{tuple(q.shape)} and {tuple(k.shape)}")
            return self._cope_bias(kind, index, q, k)
        if kind.method == "dape":
            raise ValueError("dape: the logits mix every head's scores (A + B + f([A; B])), so they are no bias of "
                             "positions; model(tokens, return_attention=True) gives the attention")
        return self._static_bias(kind, kind.bias_row(index), T)

    def _static_bias(self, kind, s, T):  # (H, T, T): the bias of row s of the kind's tables
        w, H = self._weight(), self.heads
        i = torch.arange(T, device=w.device)[:, None]
        j = torch.arange(T, device=w.device)[None, :]
        left = (i - j).to(w.dtype)  # (T, T): i - j, the distance to a key on the left
        neg_inf = torch.tensor(float("-inf"), dtype=w.dtype, device=w.device)
        if kind.method in ("alibi", "alibi_symmetric", "alibi_nonsymmetric"):
            m = kind.slopes.to(w.dtype)[:, None, None]  # (H, 1, 1)
            bias = -m * left.abs()
            if kind.method == "alibi":
                bias = bias.masked_fill(j > i, neg_inf)
            elif kind.method == "alibi_nonsymmetric":  # first half looks left, second half right
                half = torch.arange(H, device=w.device)[:, None, None] < H // 2
                bias = bias.masked_fill(half & (j > i) | ~half & (j < i), neg_inf)
        elif kind.method == "alibi_learned":
            if self.causal:
                bias = -F.softplus(kind.raw_slopes[s])[:, None, None] * left
            else:
                m_left = F.softplus(kind.raw_slopes_left[s])[:, None, None]
                m_right = F.softplus(kind.raw_slopes_right[s])[:, None, None]
                bias = torch.where(j <= i, -m_left * left, m_right * left)  # right: -m_r (j - i)
        elif kind.method == "t5_bias":
            count, max_distance = int(kind.options["buckets"]), kind.options["max_distance"]
            per_distance = torch.tensor([t5_bucket(r, count, max_distance, not self.causal)
                                         for r in range(-(T - 1), T)], device=w.device)
            buckets = per_distance[j - i + T - 1]  # (T, T): the bucket of j - i
            bias = kind.table[s][buckets].permute(2, 0, 1)
        elif kind.method in ("kerple_log", "kerple_power"):
            distance = left.abs()
            r1 = kind.r1[s].clamp(min=0.01)[:, None, None]  # (H, 1, 1)
            if kind.method == "kerple_log":  # -r1 log(1 + r2 |i - j|)
                r2 = kind.r2[s].clamp(min=0.01)[:, None, None]
                bias = -r1 * torch.log1p(r2 * distance)
            else:  # -r1 |i - j|^r2, exactly 0 on the diagonal
                r2 = kind.r2[s].clamp(0.01, 2.0)[:, None, None]
                bias = (-r1 * distance ** r2).masked_fill(i == j, 0.0)
        elif kind.method == "sandwich":  # a table by distance |i - j|, float64 rounded to dtype
            d, base, scale = self.d_head, float(kind.options["base"]), float(kind.options["scale"])
            freq = torch.tensor([base ** (-2.0 * n / d) for n in range(1, d // 2 + 1)],
                                dtype=torch.float64)
            distance = torch.arange(T, dtype=torch.float64)[:, None]
            by_distance = (distance * freq).cos().sum(-1) - d // 2  # (T,)
            heads = torch.arange(1, H + 1, dtype=torch.float64)[:, None]  # h = 1 .. H
            table = (by_distance / (scale * heads / H)).to(w.device, w.dtype)  # (H, T)
            bias = table[:, (i - j).abs()]
        elif kind.method == "fire":
            bias = self._fire_bias(kind, s, left.abs())
        else:
            bias = torch.zeros(H, T, T, dtype=w.dtype, device=w.device)
        if self.causal:
            bias = bias.masked_fill(j > i, neg_inf)
        return bias.expand(H, T, T)

    def _dape_scores(self, kind, index, q, k):  # -> (B, H, T, T) logits A + B + f([A; B']), masked as B
        """DAPE: A the scaled scores, B the base's bias (its masks -inf), B' = B with those entries 0,
        f = w2 leaky_relu(w1 [A; B'] + b1, 0.01) + b2 over the 2H channels of each (i, j)."""
        A = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        B = self._static_bias(kind.base, kind.base.bias_row(index), q.shape[2]).to(A.dtype)
        x = torch.cat((A, B.masked_fill(B.isinf(), 0.0).expand_as(A)), dim=1).permute(0, 2, 3, 1)  # (B, T, T, 2H)
        hidden = F.leaky_relu(x @ kind.w1[index].T + kind.b1[index], 0.01)
        return A + B + (hidden @ kind.w2[index].T + kind.b2[index]).permute(0, 3, 1, 2)

    def _fire_bias(self, kind, s, distance):  # distance (T, T) = |i - j| -> (H, T, T)
        T, W = distance.shape[0], kind.w1.shape[1]
        c = kind.c[s].abs()
        L = (kind.L_multiplier[s] * float(kind.options["init_L"])).abs()
        query = torch.arange(T, dtype=distance.dtype, device=distance.device)  # i, as a float
        x = torch.log1p(c * distance) / (torch.log1p(c * torch.maximum(query, L)) +
                                         float(kind.options["eps"]))[:, None]  # (T, T)
        bias = torch.empty(self.heads, T, T, dtype=distance.dtype, device=distance.device)
        rows = max(1, (1 << 24) // (T * W))  # query rows per pass: (rows, T, W) bounded
        for r in range(0, T, rows):
            hidden = F.relu(x[r:r + rows, :, None] * kind.w1[s] + kind.b1[s])  # (rows, T, W)
            bias[:, r:r + rows] = (hidden @ kind.w2[s].T + kind.b2[s]).permute(2, 0, 1)
        return bias

    def _cope_bias(self, kind, index, q, k):  # q, k (B, H, T, Dh) -> (B, H, T, T)
        T, npos = q.shape[2], int(kind.options["npos"])
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # j > i
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        gates = scores.sigmoid().masked_fill(future, 0.0)  # g_ij, 0 where masked
        p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)  # sum_{t = j .. i} g_it
        z = q @ kind.embeddings[index]  # (B, H, T, npos); E = 1 broadcasts over heads
        low = p.floor()
        frac = p - low
        bias = (1 - frac) * z.gather(-1, low.long()) + frac * z.gather(-1, p.ceil().long())
        return bias.masked_fill(future, float("-inf"))

    def _fox_bias(self, kind, index, h):  # h (B, T, D) -> (B, H, T, T); at least float32
        dtype = torch.promote_types(h.dtype, torch.float32)
        weight, gate_bias = kind.gate_weight[index], kind.gate_bias[index]
        log_f = F.logsigmoid(h.to(dtype) @ weight.to(dtype).T + gate_bias.to(dtype))  # (B, T, H)
        cumulative = log_f.cumsum(1).transpose(1, 2)  # (B, H, T): F_i = sum_{t <= i} log f_t
        bias = cumulative[..., :, None] - cumulative[..., None, :]  # F_i - F_j
        T = h.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1)
        return bias.masked_fill(future, float("-inf")).to(h.dtype)

    def _path_scores(self, kind, index, h, q, k):  # -> (B, H, T, T) scaled logits, -inf for j > i
        """PaTH: w_t, beta_t from the layer input h (B, T, D); logit(i, j) = q_i^T H_i ... H_{j+1} k_j
        / sqrt(Dh), H_t = I - beta_t w_t w_t^T, computed key by key from the nearest: u_i starts at
        q_i for key i and is reflected by H_j after key j; plus F_i - F_j with forget gates."""
        P, (B, T, _), H, Dh = kind, h.shape, self.heads, self.d_head
        dtype = torch.promote_types(h.dtype, torch.float32)
        x = h.to(dtype)
        if int(kind.options["rank"]) > 0:
            y = (x @ P.w_down[index].to(dtype).T) @ P.w_up[index].to(dtype).T  # (B, T, H Dh)
        else:
            y = x @ P.w_proj[index].to(dtype).T
        size = int(kind.options["conv_size"])
        if size > 0:  # causal depthwise: position t sees t - size + 1 .. t, zeros before the start
            padded = F.pad(y.transpose(1, 2), (size - 1, 0))
            y = F.silu(F.conv1d(padded, P.w_conv[index].to(dtype).unsqueeze(1), groups=H * Dh)).transpose(1, 2)
        w = y.reshape(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
        w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + 1e-6)
        beta = 2 * torch.sigmoid(x @ P.beta_weight[index].to(dtype).T + P.beta_bias[index].to(dtype)).transpose(1, 2)
        q, k = q.to(dtype), k.to(dtype)
        scores = torch.full((B, H, T, T), float("-inf"), dtype=dtype, device=h.device)
        u = q.clone()
        for j in range(T - 1, -1, -1):
            rows = u[:, :, j:]  # queries i >= j, each carried through H_{j+1} .. H_i
            scores[:, :, j:, j] = (rows * k[:, :, j:j + 1]).sum(-1)
            wj = w[:, :, j:j + 1]
            u[:, :, j:] = rows - beta[:, :, j, None, None] * (rows * wj).sum(-1, keepdim=True) * wj
        scores = scores / math.sqrt(Dh)
        if kind.options["forget_gate"]:
            log_f = F.logsigmoid(x @ P.gate_weight[index].to(dtype).T + P.gate_bias[index].to(dtype))  # (B, T, H)
            cumulative = log_f.cumsum(1).transpose(1, 2)
            scores = scores + cumulative[..., :, None] - cumulative[..., None, :]
        return scores.to(q.dtype)

    def _stick_breaking_weights(self, kind, attention, q, k, hidden_keys):  # -> A (B, H, T, T)
        """A_ij = sigmoid(z_ij) prod over the visible k, j < k < i, of (1 - sigmoid(z_ik)); visible:
        j < i (j <= i with attend_current), not hidden by the window or the chunk. SSMax scales z
        by s_h ln n_i, n_i the keys j <= i the masks leave."""
        T = q.shape[2]
        i = torch.arange(T, device=q.device)[:, None]
        j = torch.arange(T, device=q.device)[None, :]
        z = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
        shown = j <= i if hidden_keys is None else (j <= i) & ~hidden_keys
        visible = (j <= i if kind.options.get("attend_current", False) else j < i) & shown
        if kind.attention["ssmax"]:
            n = shown.sum(-1).to(z.dtype)  # (T,)
            z = z * attention.ssmax.view(1, -1, 1, 1) * torch.log(n).view(1, 1, T, 1)
        log_stay = F.logsigmoid(-z).masked_fill(~visible, 0.0)
        after = log_stay.flip(-1).cumsum(-1).flip(-1) - log_stay  # sum over k > j
        return torch.exp(F.logsigmoid(z) + after).masked_fill(~visible, 0.0)

    # -- forward
    def hidden(self, tokens, offset=0, return_attention=False):
        """The final LayerNorm's output (B, T, D), or without one the last block's output [, the
        attention probabilities per layer]."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T), not {tuple(tokens.shape)}")
        B, T = tokens.shape
        H, Dh = self.heads, self.d_head
        x = self.embed(tokens)  # (B, T, D)
        absolute = self._absolute_positions(offset, T)
        if absolute is not None:
            x = x + absolute
        # Per kind: the rotations, the temperature, the window and chunk masks.
        rotations = [self._rotations(kind, offset, T) for kind in self.kinds]
        temperatures = [self._temperature(kind, offset, T) for kind in self.kinds]
        masks = [self._option_mask(kind, T) for kind in self.kinds]
        biases = {}  # layers that share a bias share one tensor
        attention = []
        Hkv = self.kv_heads
        for layer, block in enumerate(self.blocks):
            kind, index = self.kind_of(layer)
            kind_rotations, temperature = rotations[self.layer_kind[layer]], temperatures[self.layer_kind[layer]]
            hidden_keys = masks[self.layer_kind[layer]]
            h = x if block.ln_attention is None else block.ln_attention(x)  # the attention's input
            qkv = block.attention.qkv(h)
            if self.clip_qkv > 0:  # OLMo's and MPT's clip_qkv
                qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
            qkv = qkv.view(B, T, H + 2 * Hkv, Dh).transpose(1, 2)  # (B, H + 2 Hkv, T, Dh)
            q, k, v = qkv[:, :H], qkv[:, H:H + Hkv], qkv[:, H + Hkv:]
            if self.arch["qk_norm"] and self.arch["qk_norm_over"] == "head":  # each head's q and k normed
                q, k = block.attention.q_norm(q), block.attention.k_norm(k)
            elif self.arch["qk_norm"]:  # all heads' values of q together, and of k, as (B, T, heads Dh)
                def whole(norm, t):
                    n = t.shape[1]
                    return norm(t.transpose(1, 2).reshape(B, T, n * Dh)).view(B, T, n, Dh).transpose(1, 2)
                q, k = whole(block.attention.q_norm, q), whole(block.attention.k_norm, k)
            if kind_rotations is not None:  # queries and keys: xPos scales them differently
                half = kind.options.get("pairing", "interleaved") == "half"
                q, k = self._rotate(q, *kind_rotations[0], half), self._rotate(k, *kind_rotations[1], half)
            if Hkv != H:  # grouped-query attention: query head h reads key and value head h // (H / Hkv)
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            if temperature is not None:
                q = q * temperature
            if kind.attention["scale_dim"] > 0:  # q.k / sqrt(s): q times sqrt(d_head / s)
                q = q * math.sqrt(Dh / kind.attention["scale_dim"])
            if kind.method == "stick_breaking":  # no softmax: its own weights, the rest to v_i
                probs = self._stick_breaking_weights(kind, block.attention, q, k, hidden_keys)
                out = probs @ v + (1 - probs.sum(-1, keepdim=True)) * v
            else:
                if kind.method == "path":  # (B, H, T, T): the products replace q.k, F_i - F_j with gates
                    scores = self._path_scores(kind, index, h, q, k)
                elif kind.method == "dape":  # (B, H, T, T): every head's scores mixed with the base bias
                    scores = self._dape_scores(kind, index, q, k)
                else:
                    if kind.method in ("fox", "cope"):  # (B, H, T, T): from this layer's input or q, k
                        bias = self.bias(layer, T, h=h, q=q, k=k)
                    else:
                        row = (self.layer_kind[layer], kind.bias_row(index))
                        if row not in biases:
                            biases[row] = self._static_bias(kind, row[1], T)
                        bias = biases[row]
                    scores = q @ k.transpose(-1, -2) / math.sqrt(Dh)  # (B, H, T, T)
                    if kind.attention["softcap"] > 0:  # capped before the bias and the masks
                        cap = kind.attention["softcap"]
                        scores = torch.tanh(scores / cap) * cap
                    scores = scores + bias
                if hidden_keys is not None:
                    scores = scores.masked_fill(hidden_keys, float("-inf"))
                probs = self._attention_probabilities(kind, block.attention, scores)
                out = probs @ v
            if return_attention:
                attention.append(probs)
            context = out.transpose(1, 2)  # (B, T, H, Dh)
            if kind.attention["gate"] != "none":
                context = context * torch.sigmoid(block.attention.gate(h)).view(B, T, H, -1)
            a = block.attention.out(context.reshape(B, T, H * Dh))  # head-major features
            if self.arch["block"] == "sequential":  # x + n1'(attn(n1 x)), then + n2'(ffn(n2 .)), n' the output norms
                x = x + (a if block.ln_attention_out is None else block.ln_attention_out(a))
                f = self._ffn(block, x if block.ln_ffn is None else block.ln_ffn(x))
                x = x + (f if block.ln_ffn_out is None else block.ln_ffn_out(f))
            else:  # parallel: x + attn(n1 x) + ffn(n2 x); parallel_shared: n2 = n1
                x = x + a + self._ffn(block, h if block.ln_ffn is None else block.ln_ffn(x))
        if self.ln_final is not None:
            x = self.ln_final(x)
        return (x, attention) if return_attention else x

    def _ffn(self, block, x):  # mlp: W2 act(W1 x); swiglu / geglu: W2 (act(g) o u), [g, u] = W1 x
        a = block.ffn_in(x)
        if self.arch["ffn"] == "mlp":
            return block.ffn_out(self.act(a))
        g, u = a.chunk(2, dim=-1)
        gate = F.silu(g) if self.arch["ffn"] == "swiglu" else self.act(g)  # geglu: model activation's GELU
        return block.ffn_out(gate * u)

    def embed(self, tokens):  # (B, T) -> (B, T, D): the token embeddings times sqrt(d_model) (unless
        # scale_embedding is false), normed where asked
        x = self.embedding.weight[tokens] if self.adaptive is None else self.adaptive.embed(tokens)
        if self.arch["scale_embedding"]:
            x = x * math.sqrt(self.d_model)
        return x if self.embedding_norm is None else self.embedding_norm(x)

    # -- the attention options (metadata "attention", or each kind's)
    def _temperature(self, kind, offset, T):  # Llama 4: q at p times 1 + a ln(floor((p + 1) / F) + 1)
        a, F_ = float(kind.attention["temperature"]), int(kind.attention["temperature_floor"])
        if a == 0:
            return None
        w = self._weight()
        p = torch.arange(offset, offset + T, dtype=torch.float64)
        factor = 1 + a * torch.log(torch.floor((p + 1) / F_) + 1)
        return factor.to(w.device, w.dtype).view(1, 1, T, 1)

    def _option_mask(self, kind, T):  # (T, T) True where the window or the chunk hides key j from query i
        W, C = int(kind.attention["window"]), int(kind.attention["chunk"])
        if W <= 0 and C <= 0:
            return None
        device = self._weight().device
        i = torch.arange(T, device=device)[:, None]
        j = torch.arange(T, device=device)[None, :]
        hidden = torch.zeros(T, T, dtype=torch.bool, device=device)
        if W > 0:
            hidden = torch.logical_or(hidden, (i - j).abs() >= W)
        if C > 0:
            hidden = torch.logical_or(hidden, torch.div(i, C, rounding_mode="floor") != torch.div(j, C, rounding_mode="floor"))
        return hidden

    def _attention_probabilities(self, kind, attention, scores):  # (B, H, T, T) masked scores -> probabilities
        """SSMax multiplies each row's logits by s_h ln n_i, n_i the keys the row sees (its finite
        scores); a sink adds one logit per head to each row's normaliser that weights no value."""
        H = self.heads
        if kind.attention["ssmax"]:
            seen = torch.isfinite(scores)
            n = seen.sum(-1, keepdim=True).to(scores.dtype)  # (B, H, T, 1)
            factor = attention.ssmax.view(1, H, 1, 1) * torch.log(n)
            scores = torch.where(seen, scores * factor, torch.full_like(scores, float("-inf")))
        if not kind.attention["sink"]:
            return scores.softmax(dim=-1)
        sink = attention.sink.view(1, H, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]

    def logits(self, hidden):  # (..., D) -> (..., V); with adaptive bands the log-probabilities
        if self.adaptive is not None:
            return self.adaptive.log_probs(hidden)
        logits = hidden @ (self.embedding.weight if self.head is None else self.head.weight).T
        if self.logit_softcap > 0:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def log_probs(self, hidden):  # (..., D) -> (..., V): log_softmax of the logits
        logits = self.logits(hidden)
        return logits if self.adaptive is not None else logits.log_softmax(dim=-1)

    def forward(self, tokens, offset=0, return_attention=False):
        if return_attention:
            h, attention = self.hidden(tokens, offset, True)
            return self.logits(h), attention
        return self.logits(self.hidden(tokens, offset))

    # -- tokenisation
    def pretokenised(self):
        """Whether the model was trained on ids made elsewhere (data.tokenizer: ids)."""
        return self.metadata["data"].get("tokenizer", "byte") == "ids"

    def encode(self, text):
        """Token ids of text (str, or bytes for a byte-level model)."""
        if self.pretokenised():
            raise ValueError("the model was trained on pre-tokenised ids (data.tokenizer: ids): "
                             "tokenise with the tokenizer that made them and pass the ids")
        if self.hf_tokenizer is not None:  # the whole text, as tokenizer(text) gives it
            return self.hf_tokenizer.encode(text).ids
        if self.vocabulary is None and self.pieces is None:  # byte level: id = byte value
            return list(text.encode("utf-8") if isinstance(text, str) else bytes(text))
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # universal newlines
        if lines[-1] == "":  # an empty remainder after the final newline is not a line
            lines.pop()
        if self.pieces is not None:  # each line's pieces, then the model's end-of-sentence piece
            if self._piece_ids is None:
                self._piece_ids = SentencePieceIds(self.pieces)
            eos = self.pieces.eos_id()
            return [i for line in lines for i in self._piece_ids(line) + [eos]]
        if self._word_ids is None:
            self._word_ids = {}
            for index, word in enumerate(self.vocabulary):
                self._word_ids.setdefault(word, index)
            self._word_ids.update(WORD_SPECIALS)
        unk, eos = WORD_SPECIALS["<unk>"], WORD_SPECIALS["<eos>"]
        return [i for line in lines  # str.split(): runs of whitespace, none at the ends
                for i in [self._word_ids.get(w, unk) for w in line.split()] + [eos]]

    def decode(self, ids):
        """Text of ids: bytes decoded as UTF-8, or words joined by spaces with <eos> a newline
        (pre-tokenised models: the ids in decimal, joined by spaces)."""
        if self.pretokenised():
            return " ".join(str(int(i)) for i in ids)
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        if self.pieces is not None:  # lines at the end-of-sentence pieces; <mask> is no piece
            lines, line, eos = [], [], self.pieces.eos_id()
            for i in (int(i) for i in ids):
                if i == eos:
                    lines.append(self.pieces.decode(line) + "\n")
                    line = []
                elif i < self.pieces.get_piece_size():
                    line.append(i)
            return "".join(lines) + self.pieces.decode(line)
        if self.vocabulary is None:
            return b"".join(bytes([i]) if i < 256 else b"<mask>" for i in map(int, ids)).decode(
                "utf-8", errors="replace")
        text, line = [], []
        for word in (self.vocabulary[int(i)] for i in ids):
            if word == "<eos>":
                text.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(word)
        return "".join(text) + " ".join(line)


def _vocabulary(path, metadata):
    if metadata["data"].get("tokenizer", "byte") != "word":
        return None
    if "vocabulary" in metadata:
        vocabulary = metadata["vocabulary"]
    elif "vocabulary_file" in metadata:
        side = os.path.join(os.path.dirname(os.path.abspath(path)), metadata["vocabulary_file"])
        with open(side, encoding="utf-8") as f:
            vocabulary = json.load(f)
    else:
        raise ValueError("a word-level model needs metadata 'vocabulary' or 'vocabulary_file'")
    if not isinstance(vocabulary, list) or len(vocabulary) != int(metadata["data"]["vocab_size"]):
        raise ValueError(f"the vocabulary must be a list of vocab_size = "
                         f"{metadata['data']['vocab_size']} strings")
    return vocabulary


class SentencePieceIds:
    """A line's ids under a SentencePiece model, exactly as extrap's own encoder gives them.

    extrap links Debian's libsentencepiece 0.1.97. For a BPE model its ids are Python's
    sentencepiece's (any version). For a unigram model they can differ from sentencepiece 0.2's:
    both find the best segmentation by the same dynamic programme over the normalised line's
    bytes (EncodeOptimized: for each end, the best path ending there; a later start replaces an
    earlier one only if strictly better), but 0.1.97 adds each piece's score to the path's in
    double precision and compares before rounding to float32 (its user-defined symbols' score
    `length * max_score - 0.1` makes the sum a double), where 0.2 adds in float32. Two
    segmentations whose float32 sums round alike (the same pieces in another order, as in a run
    of "*") are then told apart in 0.1.97 and not in 0.2. This class runs 0.1.97's programme
    for unigram models, and sentencepiece's own encode for every other type.
    """

    def __init__(self, processor):
        self.processor = processor
        pieces, model_type, self.byte_fallback = _sentencepiece_model(processor.serialized_model_proto())
        self.unigram = model_type == 1  # TrainerSpec.UNIGRAM
        if not self.unigram:
            return
        normal = [score for _, score, kind in pieces if kind == 1]  # NORMAL
        min_score = _float32(min(normal)) if normal else _float32(3.4028234663852886e38)
        max_score = _float32(max(normal + [1.1754943508222875e-38]))  # starts at FLT_MIN, as 0.1.97
        self.unk_score = _float32(min_score - 10.0)  # min_score() - kUnkPenalty, in float32
        self.user_defined_unit = max_score
        self.user_defined = set()
        self.pieces = {}  # utf-8 bytes -> (id, score as 0.1.97 adds it, or None: unused)
        for i, (piece, score, kind) in enumerate(pieces):
            if kind in (1, 4, 5):  # NORMAL, USER_DEFINED, UNUSED: the pieces 0.1.97 matches
                self.pieces[piece] = (i, None if kind == 5 else _float32(score))
                if kind == 4:
                    self.user_defined.add(i)
        self.longest = max((len(k) for k in self.pieces), default=1)
        self.unk = processor.unk_id()

    def __call__(self, line):
        if not self.unigram:  # BPE and the other types: the library's own encode
            return self.processor.encode(line)
        text = self.processor.normalize(line).encode("utf-8")
        size = len(text)
        score = [0.0] * (size + 1)  # the best path ending at each byte, as float32 values
        start = [-1] * (size + 1)
        ids = [-1] * (size + 1)
        begin = 0
        while begin < size:
            till = score[begin]
            char = min(_utf8_length(text[begin]), size - begin)
            single = False
            for end in range(begin + 1, min(size, begin + self.longest) + 1):
                entry = self.pieces.get(text[begin:end])
                if entry is None or entry[1] is None:
                    continue
                index, piece_score = entry
                if index in self.user_defined:
                    piece_score = _float32((end - begin) * self.user_defined_unit) - 0.1
                candidate = piece_score + till  # in double, as 0.1.97
                if start[end] == -1 or candidate > score[end]:
                    score[end], start[end], ids[end] = _float32(candidate), begin, index
                single = single or end - begin == char
            if not single:  # the character as <unk>, its sum in float32
                end = begin + char
                candidate = _float32(self.unk_score + till)
                if start[end] == -1 or candidate > score[end]:
                    score[end], start[end], ids[end] = candidate, begin, self.unk
            begin += char
        path, end = [], size
        while end > 0:
            path.append((text[start[end]:end], ids[end]))
            end = start[end]
        out = []
        for surface, index in reversed(path):  # as SentencePieceProcessor's Encode
            if index != self.unk:
                out.append(index)
            elif self.byte_fallback:  # an unknown piece as its UTF-8 bytes
                out.extend(self.processor.piece_to_id(f"<0x{b:02X}>") for b in surface)
            elif not (out and out[-1] == self.unk):  # a run of unknown pieces is one <unk>
                out.append(index)
        return out


def _sentencepiece_model(data):
    """(pieces as (utf-8 bytes, score, type), model type, byte fallback) of a serialised
    sentencepiece ModelProto, read from its wire format (sentencepiece_model.proto: pieces 1 =
    {piece 1, score 2, type 3 (NORMAL 1 by default)}, trainer_spec 2 = {model_type 3 (UNIGRAM 1
    by default), byte_fallback 35}), so that protobuf is not needed."""
    def fields(buf):
        at = 0
        while at < len(buf):
            key, at = _varint(buf, at)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, at = _varint(buf, at)
            elif wire == 1:
                value, at = buf[at:at + 8], at + 8
            elif wire == 2:
                size, at = _varint(buf, at)
                value, at = buf[at:at + size], at + size
            elif wire == 5:
                value, at = buf[at:at + 4], at + 4
            else:
                raise ValueError(f"a sentencepiece model with a field of wire type {wire}: not a ModelProto")
            yield number, wire, value

    pieces, model_type, byte_fallback = [], 1, False
    for number, wire, value in fields(data):
        if number == 1 and wire == 2:
            piece, score, kind = b"", 0.0, 1
            for n, w, v in fields(value):
                if n == 1 and w == 2:
                    piece = bytes(v)
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            pieces.append((piece, score, kind))
        elif number == 2 and wire == 2:
            for n, w, v in fields(value):
                if n == 3 and w == 0:
                    model_type = v
                elif n == 35 and w == 0:
                    byte_fallback = bool(v)
    return pieces, model_type, byte_fallback


def _varint(buf, at):
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _float32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def _utf8_length(first_byte):
    """SentencePiece's OneCharLen: the UTF-8 length a leading byte announces (1 for others)."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[first_byte >> 4]


def _pieces(path, metadata):
    """A sentencepiece model's processor, from the export's side file; None for other models."""
    if metadata["data"].get("tokenizer", "byte") != "sentencepiece":
        return None
    if "tokenizer_model_file" not in metadata:
        raise ValueError("a sentencepiece model needs metadata 'tokenizer_model_file'")
    side = os.path.join(os.path.dirname(os.path.abspath(path)), metadata["tokenizer_model_file"])
    try:
        import sentencepiece  # only here: other models need PyTorch alone
    except ImportError:
        raise ValueError("a sentencepiece model needs the sentencepiece package "
                         "(pip install sentencepiece; the project's .venv has it)") from None
    with open(side, "rb") as f:
        pieces = sentencepiece.SentencePieceProcessor(model_proto=f.read())
    if pieces.get_piece_size() + 1 != int(metadata["data"]["vocab_size"]):
        raise ValueError(f"{side}: {pieces.get_piece_size()} pieces; the model's vocabulary is "
                         f"{metadata['data']['vocab_size']} (the pieces and <mask>)")
    return pieces


def _hf_tokenizer(path, metadata):
    """A data.tokenizer hf model's tokenizer (Hugging Face tokenizers), from the export's side file;
    None for other models."""
    if metadata["data"].get("tokenizer", "byte") != "hf":
        return None
    if "tokenizer_json_file" not in metadata:
        raise ValueError("an hf-tokenizer model needs metadata 'tokenizer_json_file'")
    side = os.path.join(os.path.dirname(os.path.abspath(path)), metadata["tokenizer_json_file"])
    try:
        import tokenizers  # only here: other models need PyTorch alone
    except ImportError:
        raise ValueError("an hf-tokenizer model needs the tokenizers package (the project's .venv has it)") from None
    return tokenizers.Tokenizer.from_file(side)


def _layout(model, names):
    """For a message about tensors `names`: where one is the embedding's, the adaptive bands' or
    the final LayerNorm's, the metadata that decides which of them the file holds and their shapes."""
    if not any(n.split(".")[0] in ("embedding", "adaptive", "ln_final") for n in names):
        return ""
    m = model.metadata["model"]
    bands = (f"adaptive_cutoffs {m['adaptive_cutoffs']}, adaptive_factor {m.get('adaptive_factor', 4)}, "
             if model.adaptive is not None else "no adaptive_cutoffs, ")
    return (f" (metadata: {bands}vocab_size {model.vocab_size}, d_model {model.d_model}, "
            f"final_norm {str(model.ln_final is not None).lower()})")


def load(path, dtype=torch.float32, device="cpu", use_package=None):
    """The ExtrapModel stored in an extrap-safetensors file (format 1 or 2), in eval mode, weights in dtype."""
    tensors, raw = read_safetensors(path, use_package)
    metadata = _metadata(raw)
    try:
        model = ExtrapModel(metadata, _vocabulary(path, metadata), dtype)
        model.pieces = _pieces(path, metadata)
        model.hf_tokenizer = _hf_tokenizer(path, metadata)
    except KeyError as e:
        raise ValueError(f"{path}: metadata lacks {e}") from None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(expected.keys() - tensors.keys())
    extra = sorted(tensors.keys() - expected.keys())
    if missing:
        raise ValueError(f"{path}: missing tensor(s) "
                         + ", ".join(f"{n} {expected[n]}" for n in missing) + _layout(model, missing))
    if extra:
        raise ValueError(f"{path}: unexpected tensor(s) " + ", ".join(extra)
                         + f" (position {model.method!r}, causal {model.causal})" + _layout(model, extra))
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{path}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                             f"expected {shape}" + _layout(model, [name]))
    for name, kind in model.named_modules():
        if isinstance(kind, LayerKind) and kind.method in ("alibi", "alibi_symmetric", "alibi_nonsymmetric"):
            H = model.heads
            want = torch.tensor(alibi_slopes(H) if kind.method != "alibi_nonsymmetric"
                                else alibi_slopes(H // 2) * 2, dtype=torch.float64)
            stored = tensors[name + ".slopes"].to(torch.float64)
            if not torch.allclose(stored, want, rtol=SLOPE_RTOL, atol=0):
                raise ValueError(f"{path}: {name}.slopes {stored.tolist()} differ from the "
                                 f"{kind.method} definition {want.tolist()}")
    model.load_state_dict({n: t.to(device=device, dtype=dtype) for n, t in tensors.items()},
                          strict=True, assign=True)
    return model.eval()


# ----------------------------------------------------------------------------- evaluation
def check_length(model, n, length):
    """Refuses a window length that n tokens cannot fill; True for a masked-LM model."""
    masked = model.metadata["model"].get("objective") == "masked_lm"
    need = length if masked else length + 1  # causal LM: one more token, the last target
    if length < 1 or n < need:
        raise ValueError(f"length {length} needs at least {need} tokens; the stream has {n}")
    return masked


@torch.no_grad()
def evaluate(model, tokens, length, stride=0, batch_windows=64):
    """Perplexity of a token stream with windows of `length`, every `stride` tokens (0 or
    >= length: non-overlapping). Causal LM scores the next token; masked LM the selected ones."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten().cpu()
    n, V = tokens.numel(), model.vocab_size
    masked = check_length(model, n, length)
    last = n if masked else n - 1  # input positions
    if stride < 0:
        raise ValueError(f"stride must be >= 0, not {stride}")
    if n and (tokens.min() < 0 or tokens.max() >= V):
        raise ValueError(f"token ids must lie in 0 .. {V - 1}")
    if masked:  # the decision depends on the absolute position only: make it once per stream
        ev = model.metadata.get("eval", {})
        prob, seed = float(ev.get("mask_prob", 0.15)), int(ev.get("mask_seed", 1234))
        mask_token = int(model.metadata["data"]["mask_token"])
        decisions = [mask_decision(pos, t, prob, seed, mask_token, V)
                     for pos, t in enumerate(tokens.tolist())]
        selected = torch.tensor([d[0] for d in decisions], dtype=torch.bool)
        inputs, targets = torch.tensor([d[1] for d in decisions], dtype=torch.long), tokens
    else:
        selected = torch.ones(n, dtype=torch.bool)
        inputs, targets = tokens[:-1], tokens[1:]  # input position p predicts token p + 1
    windows = evaluation_windows(last, length, stride)
    was_training, device = model.training, model._weight().device
    model.eval()
    nll_sum, count, start = 0.0, 0, 0
    while start < len(windows):  # batches of consecutive windows of one size
        size = windows[start][1]
        stop = start
        while stop < len(windows) and stop - start < batch_windows and windows[stop][1] == size:
            stop += 1
        group = windows[start:stop]
        index = torch.tensor([b for b, _, _ in group])[:, None] + torch.arange(size)  # (W, size)
        scored = (torch.arange(size) >= torch.tensor([s for _, _, s in group])[:, None])
        scored &= selected[index + (0 if masked else 1)]  # (W, size)
        hidden = model.hidden(inputs[index].to(device))  # (W, size, D)
        chunk = max(1, (1 << 25) // (size * V))  # windows per logits pass: (chunk, size, V) bounded
        for c in range(0, len(group), chunk):
            logp = model.log_probs(hidden[c:c + chunk])  # (chunk, size, V)
            picked = logp.gather(-1, targets[index[c:c + chunk]].to(device)[..., None])[..., 0]
            nll_sum -= picked[scored[c:c + chunk].to(device)].double().sum().item()
        count += int(scored.sum())
        start = stop
    model.train(was_training)
    return {"nll_sum": nll_sum, "scored_tokens": count, "windows": len(windows),
            "perplexity": math.exp(nll_sum / count) if count else float("nan")}


def tokens_of_file(model, path):
    """A file's tokens as extrap reads it: text through the model's tokenizer (bytes as they
    are at byte level), or for a pre-tokenised model its ids (.npy, or raw .bin of the config's
    data.ids_dtype)."""
    if model.pretokenised():
        import numpy as np  # only here: the reader itself needs PyTorch alone
        import yaml
        config = yaml.safe_load(model.metadata["config"]) if "config" in model.metadata else {}
        dtype = ((config or {}).get("data") or {}).get("ids_dtype", "uint16")
        if path.endswith(".npy"):
            return [int(i) for i in np.load(path)]
        return [int(i) for i in np.fromfile(path, dtype=dtype)]
    if model.vocabulary is None and model.pieces is None and model.hf_tokenizer is None:
        with open(path, "rb") as f:
            return model.encode(f.read())
    with open(path, encoding="utf-8", newline="") as f:
        return model.encode(f.read())


# ----------------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv=None):
    parser = _Parser(prog="extrap_model.py", description="Perplexity of an exported extrap model.")
    parser.add_argument("model", help="MODEL.safetensors written by `extrap export`")
    parser.add_argument("--tokens-file", required=True, help="text to tokenise and evaluate on")
    parser.add_argument("--length", type=int, nargs="+", required=True, help="window lengths")
    parser.add_argument("--stride", type=int, nargs="*", default=[], help="sliding-window strides")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-tokens", type=int, help="evaluate only the first N tokens")
    parser.add_argument("--batch-windows", type=int, default=64, help="windows per forward pass")
    parser.add_argument("--reader", choices=("auto", "package", "fallback"), default="auto")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    try:
        if min(args.stride + args.length + [args.batch_windows]) < 1:
            raise ValueError("lengths, strides and --batch-windows must be positive")
        use_package = {"auto": None, "package": True, "fallback": False}[args.reader]
        model = load(args.model, getattr(torch, args.dtype), args.device, use_package)
        tokens = tokens_of_file(model, args.tokens_file)
        if args.max_tokens is not None:
            tokens = tokens[:args.max_tokens]
        for length in args.length:  # every refusal before any output
            check_length(model, len(tokens), length)
            model.check_window(length)
        header = not args.json  # printed with the first row: an error before it is the only line
        for length in args.length:
            for stride in [length] + sorted({s for s in args.stride if s < length}):
                r = evaluate(model, tokens, length, stride, args.batch_windows)
                if args.json:
                    print(json.dumps({"length": length, "stride": stride, **{
                        k: r[k] for k in ("nll_sum", "scored_tokens", "perplexity")}}))
                else:
                    if header:
                        print(f"{'length':>7} {'stride':>7} {'windows':>8} {'scored':>9} {'nll_sum':>16} "
                              f"{'perplexity':>12}")
                        header = False
                    label = "non-ov." if stride == length else str(stride)
                    print(f"{length:>7} {label:>7} {r['windows']:>8} {r['scored_tokens']:>9} "
                          f"{r['nll_sum']:>16.6f} {r['perplexity']:>12.6f}")
    except Exception as e:  # noqa: BLE001  (a command line: one line, never a traceback)
        print(f"extrap_model.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
