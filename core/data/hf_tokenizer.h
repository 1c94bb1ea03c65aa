// Hugging Face tokenizer.json files of the byte-level BPE kind (GPT-2, GPT-NeoX/Pythia, BLOOM,
// Llama 3, Qwen2, Falcon) and of the SentencePiece BPE kind (Llama 2, Mistral, and whatever
// transformers converts a lone tokenizer.model to), read and applied without Python: encode()
// gives exactly the ids of HF tokenizers' `tokenizer.encode(text).ids` (add_special_tokens=True),
// for tokenizers 0.23.
//
// The pipeline, as HF runs it:
//  1. Added tokens with normalized=false are split out of the text, longest first among those
//     starting leftmost; then each remaining span is normalised (NFC, through ICU) and added
//     tokens with normalized=true are split out of it (their content normalised the same way).
//  2. The pre-tokeniser splits each remaining span: Split (Regex or String pattern; Isolated,
//     MergedWithPrevious, MergedWithNext or Contiguous; invert), Digits, then ByteLevel, which
//     must come last (add_prefix_space puts " " before each span not starting with one;
//     use_regex splits with GPT-2's pattern).
//  3. BPE turns each pre-token's bytes into tokens: with ignore_merges a pre-token that is one
//     vocabulary entry is that token; otherwise the lowest-ranked merge applies first, the
//     leftmost among equals. A word cache keeps repeated pre-tokens cheap.
//  2'. SentencePiece style instead of 2 and 3: each " " becomes "▁" (the Metaspace pre-tokeniser,
//     or with no pre-tokeniser the normaliser's Replace), a "▁" goes before a span (Metaspace's
//     prepend_scheme first: the span at the text's start, always: every span, each unless it
//     starts with "▁"; the normaliser's Prepend: every span between added tokens), Metaspace's
//     split makes every "▁" start a pre-token; then BPE over characters: a character that is
//     no entry becomes its bytes' <0xXX> tokens (byte_fallback) or <unk> (fused with fuse_unk).
//     Without split the span is one word to HF; extrap runs BPE word by word between places no
//     merge crosses (before a "▁" that follows an ASCII character, when no entry holds another
//     character right before a "▁"), which gives the same tokens.
//  4. The post-processor adds its tokens (TemplateProcessing's single template, SpecialToken
//     entries around $A); ByteLevel post-processing changes only offsets, so no ids.
// HF's Oniguruma patterns run as PCRE2 (UTF + UCP, JIT) after a translation that keeps
// Oniguruma's meaning: \s is [\t\n\v\f\r\x85\p{Z}] (PCRE2's own \s also takes U+180E), "." is
// [^\n], \v is U+000B, a nested class [a[bc]] is the union, {,n} is {0,n}, and \p{L}, \p{N},
// \p{Nd} (\d) and Digits' numbers get the code points HF's newer Unicode data adds to them
// (every code point is checked against HF by tests/data/check_hf_tokenizer.py classes). What
// it cannot carry over exactly is refused: other properties, \w, \b, \h, anchors, lookbehind,
// POSIX brackets, && and negated nested classes, {n,m}+ (a repeat in Oniguruma, possessive in
// PCRE2), non-ASCII or class atoms under (?i:), a pattern that can match the empty string.
// HF's NFC has Unicode 9.0 data and ICU's is newer: a text holding a character that Unicode
// 10.0 or later assigned and that NFC does not leave alone is refused (the message names it).
//
// Bytes: bytes[i] is how many bytes of the original text token i is credited with; they sum to
// the text's size exactly (when the text has any byte; an empty text gives only the post-
// processor's tokens, each credited 0). A token covers the original text from the previous
// token's end to its own end, and the last token also covers anything after it; so a
// byte-level token covers the bytes it decodes to, an added token its match, a prefix space
// the tokenizer added covers nothing. Where NFC changed a run of characters (one normalisation
// boundary to the next), the run's original bytes all go to the token that covers the run's
// last normalised byte. Tokens the post-processor adds (BOS) are credited 0.
//
// Refused when loaded (ConfigError naming the file and the key): a model other than BPE (a
// SentencePiece Unigram model too), dropout (other than null or 0), byte_fallback with
// ByteLevel or without all 256 <0xXX> entries, a SentencePiece-style file with neither
// byte_fallback nor unk_token (HF would drop unknown characters), a continuing_subword_prefix or
// end_of_word_suffix (other than null or ""), a vocabulary without all 256 byte-level symbols
// unless unk_token names an entry (HF would drop those bytes silently; with <unk> they become
// <unk>, fused with fuse_unk, as in HF), duplicate ids, a merge of tokens not in the
// vocabulary; normalizers other than NFC, Prepend "▁", Replace " " by "▁" and Sequence of
// them; pre-tokenisers other than Split, Digits, ByteLevel, Metaspace ("▁") and Sequence,
// Split's Removed behaviour, ByteLevel not last, Metaspace in a Sequence, neither ByteLevel nor
// the SentencePiece style; normalised added tokens with Prepend/Replace; post-processors other
// than ByteLevel, TemplateProcessing and Sequence; decoders of the other kind; truncation or
// padding; added tokens with single_word, lstrip or rstrip, or
// whose id differs from the one HF assigns on loading; any key this reader does not know.
// Refused when encoding (ConfigError): text that is not valid UTF-8, or, with NFC, a character
// the two NFC versions may treat differently (the message gives the byte offset).
//
// Threads: encode() is const and safe from several threads at once. encode(text, threads)
// cuts the text where the result cannot change (cut_points) and encodes the pieces on
// std::threads; the result is the same for any count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace extrap {

struct HfTokenizerState;  // the loaded file, in hf_tokenizer.cpp

class HfTokenizer {
 public:
  // The tokenizer in file `path` (a tokenizer.json); a missing or unreadable file, or one this
  // reader refuses, is a ConfigError naming `path`.
  static HfTokenizer load(const std::string& path);
  // The tokenizer in `json` (a tokenizer.json file's text); `where` names it in errors.
  static HfTokenizer from_json(const std::string& json, const std::string& where);

  // Max id + 1 over the vocabulary and the added tokens.
  int32_t size() const;
  // The id HF's token_to_id gives `token` (an added token's content first, then a vocabulary
  // entry as stored, e.g. "Ġthe"), or none.
  std::optional<int32_t> id(std::string_view token) const;
  // The raw bytes `id` stands for: a vocabulary entry's bytes through the byte-level alphabet
  // (SentencePiece style: "▁" as " ", <0xXX> as its byte), an added token's content. An id that is no token is an std::out_of_range.
  std::string token_bytes(int32_t id) const;
  // The tokens' bytes one after the other, added tokens included (HF's decode with
  // skip_special_tokens=False gives the same text, but replaces bytes that are not UTF-8).
  std::string decode(const std::vector<int32_t>& ids) const;
  // Beginning of text: the last special token the post-processor puts before the text, if any.
  std::optional<int32_t> bos() const;
  // End of text: the first special token the post-processor puts after the text; without one,
  // the special added token "<|endoftext|>", "<|end_of_text|>", "</s>" or "<eos>" (the first
  // of these present).
  std::optional<int32_t> eos() const;
  // The model's unk_token, if it has one.
  std::optional<int32_t> unk() const;

  struct Encoded {
    std::vector<int32_t> ids;
    std::vector<int32_t> bytes;  // bytes[i]: the bytes of the original text credited to ids[i]
  };
  // HF's tokenizer.encode(text).ids and each token's bytes, on `threads` threads.
  Encoded encode(std::string_view text, int threads = 1) const;

  // Parallel encoding from the caller's own threads: the text cut at cut_points(), each piece
  // through encode_piece(), the results appended in order and given to add_special_tokens(),
  // equals encode(text). Cuts fall about `piece_bytes` apart, each right after a "\n" that
  // follows an ASCII character other than whitespace and precedes an ASCII letter, or that
  // precedes " " and an ASCII letter: for GPT-2's, Llama 3's, Qwen2's and BLOOM's patterns no
  // pre-token spans such a place and none changes when the text ends there (the proof is at
  // cut_points in the .cpp). There are no cuts (one piece) for other patterns, for a first
  // ByteLevel stage with add_prefix_space, or when an added token contains "\n". SentencePiece
  // style: cuts before a " " that follows an ASCII letter or digit, where no merge crosses.
  std::vector<size_t> cut_points(std::string_view text, size_t piece_bytes) const;
  // The tokens of `piece` without the post-processor's (a whole text is one piece);
  // `starts_text` false for every piece after the first: its first span continues the text
  // before it, so no Metaspace or Prepend "▁" goes before it (ByteLevel's add_prefix_space,
  // which HF applies to every split, still does).
  Encoded encode_piece(std::string_view piece, bool starts_text = true) const;
  // encode_piece(piece, starts_text) of each piece, through one word cache: many short texts
  // that share their words (a retrieval task's sentences for every key) at a fraction of the cost.
  std::vector<Encoded> encode_pieces(const std::vector<std::string>& pieces, bool starts_text) const;
  // Puts the post-processor's tokens around a whole text's tokens.
  Encoded add_special_tokens(Encoded body) const;

 private:
  explicit HfTokenizer(std::shared_ptr<const HfTokenizerState> state);
  std::shared_ptr<const HfTokenizerState> state_;
};

}  // namespace extrap
