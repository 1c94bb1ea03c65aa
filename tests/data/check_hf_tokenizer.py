#!/usr/bin/env python3
"""Reference data for extrap's Hugging Face tokenizer.json reader (core/data/hf_tokenizer.h).

    check_hf_tokenizer.py make OUTDIR TEXTFILE...
        Trains one small byte-level BPE tokenizer per family style (gpt2, gpt2-prefix, neox,
        bloom, llama3, qwen2, and mixed: the other stages extrap reads) with the `tokenizers`
        library on the first TEXTFILE, and three of the SentencePiece style: a SentencePiece BPE
        model trained as Llama's (`sentencepiece`) and converted by transformers from its
        tokenizer.model (mistral-spm: Metaspace, prepend_scheme first, no split), the same as
        Llama 2's tokenizer.json has it (llama2-spm: normaliser Prepend + Replace, <unk>), and a
        `tokenizers`-trained one with Metaspace's split, prepend always, a small alphabet and
        fused <unk> (metaspace-split); and writes
            OUTDIR/<style>/tokenizer.json
            OUTDIR/texts/<n>.txt          the n-th text: the TEXTFILEs, then built-in hard cases
            OUTDIR/<style>/<n>.ids        HF's tokenizer.encode(text).ids, little-endian int32
            OUTDIR/manifest.json          styles, texts (path, bytes, valid UTF-8 or not)
        A text that is not valid UTF-8 gets no .ids (Python cannot hold it; extrap refuses it).
    check_hf_tokenizer.py classes OUTDIR
        Writes OUTDIR/classes.json: for each regex fragment extrap translates (\\s, \\p{L}, ...),
        the code points HF's Oniguruma matches, and OUTDIR/nfc.txt / nfc.ref: strings whose NFC
        under HF's normalizer the C++ side compares with ICU's.
    check_hf_tokenizer.py compare OUTDIR STYLE N IDSFILE
        Says where IDSFILE (little-endian int32) first differs from HF's ids for text N.

Runs with the project's venv (tokenizers, no internet). Deterministic: one thread, fixed data.
"""
import json
import os
import struct
import sys

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers as pt, processors, trainers)

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
BLOOM_PATTERN = r" ?[^(\s|[.,!?…。，、।۔،])]+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAIN_BYTES = 2_000_000  # of the first text, enough for a vocabulary of ~2000

# Built-in hard cases, written after the given texts. Bytes, so invalid UTF-8 can be one.
HARD_TEXTS = [
    b"",
    b" ",
    b"   \t  \n  ",
    b"\r\n\r\n\r\n x\r\ny \r\n",
    "emoji 😀👍🏽 and CJK 漢字かなカナ 한국어, Arabic العربية, Devanagari हिन्दी।".encode(),
    "combining: e\u0301 cafe\u0301 A\u030a \u1e9b\u0323 q\u0307\u0323 \u0958 Hangul \u1100\u1161\u11a8".encode(),
    "it's I'M we'LL they'Re x'ſ 'S 'K\u212a don'T".encode(),
    b"literal <|endoftext|> and <|begin_of_text|><|end_of_text|> <|im_start|>user<|im_end|> <s></s>",
    b"digits 1234567 12 3.14159 ++--== 1,000,000 \xd9\xa1\xd9\xa2\xd9\xa3 \xe2\x85\xa0\xe2\x85\xa1",
    b"def f(x):\n    return x  # two  spaces   three    four\n\n\n\tindent\n",
    "nbsp\u00a0x\u2003y\u3000z\u180ew\u2028v\u0085u\u200bt\ufeffs \u00a0\n".encode(),
    b"trailing spaces   \n   \n",
    b"\xff invalid \xc3\x28 utf-8",
    ("a" * 3000 + " " + " " * 5000 + "\n" * 300 + "b").encode(),
    "(paren)[bracket]|pipe,comma.dot!?… 。，、।۔،".encode(),
    " leading space, \u2581metaspace\u2581\u2581 itself,   runs   of  spaces \u2581 ".encode(),
    b"<s>text after a special token<s> <s>  x</s>y</s>",
    "rare: \u0b85\u0b86 \U0001f9ec\U0001f9ec \u2603\u2603\u2603 z".encode(),
]


def byte_level_bpe(unk=None, ignore_merges=False):
    return Tokenizer(models.BPE(unk_token=unk, ignore_merges=ignore_merges))


def build(style):
    """An untrained tokenizer in `style`, its trainer's special tokens, and what to add after."""
    after = []  # (AddedToken, special) added once trained
    if style in ("gpt2", "gpt2-prefix"):
        tok = byte_level_bpe()
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=(style == "gpt2-prefix"))
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<|endoftext|>"]
    elif style == "neox":
        tok = byte_level_bpe()
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        specials = ["<|endoftext|>", "<|padding|>"]
        # GPT-NeoX's runs of spaces: normalized, not special.
        after = [(AddedToken(" " * n, normalized=True, special=False), False) for n in (8, 4, 3, 2)]
    elif style == "bloom":
        tok = byte_level_bpe(unk="<unk>")
        tok.pre_tokenizer = pt.Sequence([pt.Split(Regex(BLOOM_PATTERN), "isolated", invert=False),
                                         pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<unk>", "<s>", "</s>", "<pad>"]
    elif style == "llama3":
        tok = byte_level_bpe(ignore_merges=True)
        tok.pre_tokenizer = pt.Sequence([pt.Split(Regex(LLAMA3_PATTERN), "isolated", invert=False),
                                         pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = []
        after = [(AddedToken(t, special=True, normalized=False), True) for t in
                 ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")]
    elif style == "qwen2":
        tok = byte_level_bpe()
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pt.Sequence([pt.Split(Regex(QWEN2_PATTERN), "isolated", invert=False),
                                         pt.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = []
        after = [(AddedToken(t, special=True, normalized=False), True) for t in
                 ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    elif style == "mixed":
        # Every other stage extrap reads: a String pattern, MergedWithNext, MergedWithPrevious,
        # Contiguous with invert, Digits, ByteLevel with add_prefix_space after them, and a
        # normalised non-special added token.
        tok = byte_level_bpe()
        tok.pre_tokenizer = pt.Sequence([
            pt.Split(" ", "merged_with_next", invert=False),
            pt.Split(Regex(r"[.,;:]"), "merged_with_previous", invert=False),
            pt.Split(Regex(r"[a-z]+"), "contiguous", invert=True),
            pt.Digits(individual_digits=False),
            pt.ByteLevel(add_prefix_space=True, use_regex=True)])
        specials = ["<|endoftext|>"]
        after = [(AddedToken("def ", normalized=True, special=False), False),
                 (AddedToken("<tab>", normalized=False, special=False), False)]
    else:
        raise SystemExit(f"unknown style {style}")
    tok.decoder = decoders.ByteLevel()
    return tok, specials, after


STYLES = ["gpt2", "gpt2-prefix", "neox", "bloom", "llama3", "qwen2", "mixed", "mistral-spm", "llama2-spm",
          "metaspace-split"]
VOCAB = {"gpt2": 1000, "gpt2-prefix": 1000, "neox": 1200, "bloom": 1500, "llama3": 2000, "qwen2": 1800,
         "mixed": 800}


def sentencepiece_style(style, training_text, workdir):
    """A SentencePiece-style tokenizer.json (see the module's doc)."""
    if style == "metaspace-split":
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tok.pre_tokenizer = pt.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False, limit_alphabet=50,
                                      special_tokens=["<unk>", "<s>", "</s>"])
        tok.train_from_iterator(training_text.splitlines(keepends=True), trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
            special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
        return Tokenizer.from_str(tok.to_str())
    import sentencepiece as spm
    from transformers import AutoTokenizer
    folder = os.path.join(workdir, "spm-" + style)
    os.makedirs(folder, exist_ok=True)
    lines = [line for line in training_text.splitlines() if line.strip()]
    # Llama's own settings: identity normalisation, whitespace kept, runs of spaces as pieces,
    # digits split, rare characters as their bytes.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=os.path.join(folder, "tokenizer"), vocab_size=1200,
        model_type="bpe", byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", character_coverage=0.9995,
        num_threads=1, minloglevel=2)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                   "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)
    os.remove(os.path.join(folder, "tokenizer.vocab"))
    AutoTokenizer.from_pretrained(folder).save_pretrained(os.path.join(folder, "converted"))
    with open(os.path.join(folder, "converted", "tokenizer.json")) as f:
        j = json.load(f)
    assert j["pre_tokenizer"]["type"] == "Metaspace" and j["model"]["byte_fallback"], j["pre_tokenizer"]
    if style == "llama2-spm":  # as meta-llama/Llama-2-7b-hf's tokenizer.json has it
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        j["model"]["unk_token"] = "<unk>"
    return Tokenizer.from_str(json.dumps(j))


def train(style, training_text, workdir):
    if style.endswith("-spm") or style == "metaspace-split":
        return sentencepiece_style(style, training_text, workdir)
    tok, specials, after = build(style)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB[style], min_frequency=2, show_progress=False,
                                  initial_alphabet=pt.ByteLevel.alphabet(), special_tokens=specials)
    lines = training_text.splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer)
    for token, special in after:
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                special_tokens=[("<|begin_of_text|>", bos)])])
    # Through JSON and back, as a user's file would be read.
    return Tokenizer.from_str(tok.to_str())


def write_ids(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}i", *ids))


def make(outdir, textfiles):
    texts = []
    for path in textfiles:
        with open(path, "rb") as f:
            texts.append((os.path.abspath(path), f.read()))
    texts += [(f"hard case {i}", t) for i, t in enumerate(HARD_TEXTS)]
    os.makedirs(os.path.join(outdir, "texts"), exist_ok=True)
    entries = []
    decoded = []
    for n, (source, data) in enumerate(texts):
        path = os.path.join(outdir, "texts", f"{n}.txt")
        with open(path, "wb") as f:
            f.write(data)
        try:
            decoded.append(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            decoded.append(None)
            bad = e.start
        entries.append({"n": n, "source": source, "path": path, "bytes": len(data),
                        "utf8": decoded[-1] is not None,
                        **({} if decoded[-1] is not None else {"invalid_at": bad})})
    training_text = decoded[0][:TRAIN_BYTES]
    for style in STYLES:
        tok = train(style, training_text, outdir)
        d = os.path.join(outdir, style)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        for n, text in enumerate(decoded):
            if text is not None:
                write_ids(os.path.join(d, f"{n}.ids"), tok.encode(text).ids)
        print(f"{style}: vocabulary {tok.get_vocab_size()}", flush=True)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"styles": STYLES, "texts": entries}, f, indent=1)


# Regex fragments whose Oniguruma matches over all code points the C++ side compares with its
# PCRE2 translation. Each is matched one character at a time.
CLASS_FRAGMENTS = [r"\s", r"\S", r"\p{L}", r"\p{N}", r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]",
                   r"[^(\s|[.,!?…。，、।۔،])]", r"\d", r"(?i:s)", r"(?i:t)", r"(?i:k)", r"."]


def classes(outdir):
    os.makedirs(outdir, exist_ok=True)
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    result = {}
    for fragment in CLASS_FRAGMENTS:
        split = pt.Split(Regex(fragment), "removed")
        kept = set("".join(p for p, _ in split.pre_tokenize_str(everything)))
        result[fragment] = [ord(c) for c in everything if c not in kept]
    # Digits: every code point between two "x"; a numeric one comes out as a piece of its own.
    digits = pt.Digits(individual_digits=True)
    result["Digits"] = [ord(p) for p, _ in digits.pre_tokenize_str("x".join(everything))
                        if len(p) == 1 and p != "x"]
    with open(os.path.join(outdir, "classes.json"), "w") as f:
        json.dump(result, f)
    # NFC: every code point alone, and after "a" and before U+0301 / U+0323, one per line.
    nfc = normalizers.NFC()
    lines = []
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000 or c in (0x0A, 0x0D):
            continue
        ch = chr(c)
        lines.append("a" + ch + "\u0301" + ch + "\u0323\u0301" + ch)
    src = "\n".join(lines)
    with open(os.path.join(outdir, "nfc.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(src)
    with open(os.path.join(outdir, "nfc.ref"), "w", encoding="utf-8", newline="") as f:
        f.write(nfc.normalize_str(src))


def compare(outdir, style, n, idsfile):
    ref = open(os.path.join(outdir, style, f"{n}.ids"), "rb").read()
    got = open(idsfile, "rb").read()
    a = struct.unpack(f"<{len(ref) // 4}i", ref)
    b = struct.unpack(f"<{len(got) // 4}i", got)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            tok = Tokenizer.from_file(os.path.join(outdir, style, "tokenizer.json"))
            print(f"first difference at token {i}: HF {x} {tok.id_to_token(x)!r}, "
                  f"got {y} {tok.id_to_token(y)!r}; HF context {[tok.id_to_token(t) for t in a[max(0, i - 5):i + 5]]}")
            return 1
    if len(a) != len(b):
        print(f"same prefix, lengths differ: HF {len(a)}, got {len(b)}")
        return 1
    print(f"equal ({len(a)} ids)")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "make":
        make(argv[2], argv[3:])
    elif len(argv) == 3 and argv[1] == "classes":
        classes(argv[2])
    elif len(argv) == 6 and argv[1] == "compare":
        return compare(argv[2], argv[3], int(argv[4]), argv[5])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
