"""transformers' tokenizer for an extrap model trained on a word-level or SentencePiece corpus:
`extrap export --format hf` writes this file beside the model, and

    AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)

loads it. Its ids are extrap's, exactly (extrap_model.py's encode and decode, which the tests
check against extrap's own corpus ids): the text is read line by line (universal newlines; an
empty remainder after the last newline is no line) and every line ends in the end-of-sentence
token, the last one too, which a tokenizer.json cannot do.
  - word level (vocabulary.json: the list id -> word): each line's words split at runs of
    whitespace, a word outside the vocabulary <unk>; the special tokens <eos>, <unk>, <mask> are
    ids 0, 1, 2, also where they occur as words of the text.
  - SentencePiece (tokenizer.model): each line's pieces, then the model's end-of-sentence piece;
    <mask> is the id after the pieces. Needs the sentencepiece package.
Nothing is added around the text (no BOS): what extrap scores is what this gives.

A unigram model's pieces come from extrap_model.py's SentencePieceIds (beside this file in the
folder), which computes them as the sentencepiece library extrap links (0.1.97) does, since
Python's sentencepiece 0.2 rounds its path scores differently and can choose another
segmentation of equal float32 score; a BPE model's from sentencepiece's own encode.
"""
import json
import os

from transformers import PreTrainedTokenizer

from .extrap_model import SentencePieceIds

WORD_SPECIALS = {"<eos>": 0, "<unk>": 1, "<mask>": 2}


def _lines(text):
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


class ExtrapTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocabulary_file": "vocabulary.json", "pieces_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocabulary_file=None, pieces_file=None, **kwargs):
        if (vocabulary_file is None) == (pieces_file is None):
            raise ValueError("an extrap tokenizer needs vocabulary.json (word level) or tokenizer.model (SentencePiece)")
        self.words, self.pieces = None, None
        if vocabulary_file is not None:
            with open(vocabulary_file, encoding="utf-8") as f:
                self.words = json.load(f)
            self._ids = {}
            for index, word in enumerate(self.words):
                self._ids.setdefault(word, index)
            self._ids.update(WORD_SPECIALS)
            specials = {"eos_token": "<eos>", "unk_token": "<unk>", "mask_token": "<mask>"}
        else:
            try:
                import sentencepiece
            except ImportError:
                raise ValueError("this tokenizer is SentencePiece's: pip install sentencepiece") from None
            self.pieces = sentencepiece.SentencePieceProcessor(model_file=pieces_file)
            self._piece_ids = SentencePieceIds(self.pieces)
            self._mask = self.pieces.get_piece_size()
            specials = {"eos_token": self.pieces.id_to_piece(self.pieces.eos_id()), "mask_token": "<mask>"}
            if self.pieces.unk_id() >= 0:
                specials["unk_token"] = self.pieces.id_to_piece(self.pieces.unk_id())
        for key, value in specials.items():
            kwargs.setdefault(key, value)
        self.vocabulary_file, self.pieces_file = vocabulary_file, pieces_file
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.words) if self.words is not None else self._mask + 1

    def get_vocab(self):
        if self.words is not None:
            return dict(self._ids)
        vocab = {self.pieces.id_to_piece(i): i for i in range(self._mask)}
        vocab["<mask>"] = self._mask
        return vocab

    def tokenize(self, text, **kwargs):  # the whole text by extrap's rule, special tokens not split out
        return self._tokenize(text)

    def _tokenize(self, text, **kwargs):
        if self.words is not None:
            return [w for line in _lines(text) for w in line.split() + ["<eos>"]]
        eos = self.pieces.eos_id()
        return [self.pieces.id_to_piece(i) for line in _lines(text) for i in self._piece_ids(line) + [eos]]

    def _convert_token_to_id(self, token):
        if self.words is not None:
            return self._ids.get(token, WORD_SPECIALS["<unk>"])
        return self._mask if token == "<mask>" else self.pieces.piece_to_id(token)

    def _convert_id_to_token(self, index):
        if self.words is not None:
            return self.words[index]
        return "<mask>" if index == self._mask else self.pieces.id_to_piece(index)

    def convert_tokens_to_string(self, tokens):  # lines at the end-of-sentence token
        eos = self.eos_token
        lines, line = [], []
        for token in tokens:
            if token == eos:
                lines.append(line)
                line = []
            elif token != "<mask>" or self.words is not None:
                line.append(token)
        text = [(" ".join(l) if self.words is not None else self.pieces.decode_pieces(l)) for l in lines + [line]]
        return "\n".join(text)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        prefix = filename_prefix + "-" if filename_prefix else ""
        if self.words is not None:
            path = os.path.join(save_directory, prefix + "vocabulary.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(self.words, f, ensure_ascii=False)
        else:
            path = os.path.join(save_directory, prefix + "tokenizer.model")
            with open(path, "wb") as f:
                f.write(self.pieces.serialized_model_proto())
        return (path,)
