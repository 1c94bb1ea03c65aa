"""The transformers side of benchmarks/compare_hf_eval.sh: a randomly initialised ~100M-parameter
Llama-style or BLOOM-style checkpoint (made once with transformers itself), and the time and
peak memory transformers takes to score one window with it on the CPU in float32.

    hf_eval.py make DIR FAMILY TEXT     llama, bloom or llama1b (TinyLlama's shape, ~1.0B
                                        parameters): config.json, model.safetensors and a
                                        byte-level BPE tokenizer.json (8000 ids) trained on TEXT
    hf_eval.py time DIR TEXT LENGTH     one forward over the first LENGTH tokens of TEXT and the
                                        loss of the next token at each, as `extrap eval --length
                                        LENGTH` scores one window; prints "seconds peak_rss_mib nll_mean"

The forward is timed alone (loading is not); the peak is the process's maximum resident set,
loading included, as /usr/bin/time reports extrap's. Llama runs attn_implementation="sdpa";
BLOOM has no SDPA path in transformers 5.24, so it runs "eager".
"""
import os
import resource
import sys
import time

import torch


def make(out, family, text_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    with open(text_path, encoding="utf-8") as f:
        text = f.read()[:4_000_000]
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         show_progress=False))
    tok.save(os.path.join(out, "tokenizer.json"))
    V = 8000
    torch.manual_seed(0)
    if family == "llama":  # 12 x 768, 12 heads on 4 KV heads (3:1), SwiGLU 2048, untied: ~97M
        config = LlamaConfig(vocab_size=V, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                             rms_norm_eps=1e-5, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    elif family == "llama1b":  # TinyLlama-1.1B's shape (22 x 2048, 32 heads on 4 KV heads, SwiGLU 5632): ~1.0B
        config = LlamaConfig(vocab_size=V, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                             num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                             rms_norm_eps=1e-5, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    else:  # 12 x 768, 12 heads, ALiBi, tied: ~91M
        config = BloomConfig(vocab_size=V, hidden_size=768, n_layer=12, n_head=12)
        model = BloomForCausalLM(config)
    model.save_pretrained(out)
    print(f"{family}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in {out}")


def time_forward(folder, text_path, length):
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count())
    ids = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(open(text_path, encoding="utf-8").read()).ids
    if len(ids) < length + 1:
        raise SystemExit(f"{text_path}: {len(ids)} tokens, fewer than {length + 1}")
    family = AutoConfig.from_pretrained(folder).model_type
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager" if family == "bloom" else "sdpa").eval()
    tokens = torch.tensor([ids[:length + 1]])
    with torch.inference_mode():
        start = time.perf_counter()
        logits = model(tokens[:, :-1]).logits
        nll = torch.nn.functional.cross_entropy(logits[0].float(), tokens[0, 1:])
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{seconds:.3f} {peak:.0f} {nll.item():.6f}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "time":
        time_forward(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(__doc__)
