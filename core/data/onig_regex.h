// Oniguruma patterns as PCRE2 patterns with the same matches, compiled and matched: the regular
// expressions of Hugging Face tokenizer.json files (core/data/hf_tokenizer.cpp), and the UTF-8
// helpers both use.
//
// HF compiles Split and ByteLevel
// patterns with Oniguruma (Ruby syntax, UTF-8, no options); PCRE2 in UTF + UCP mode agrees on
// the constructs below once these differences are written out: \s (Oniguruma: U+0009-000D,
// U+0085 and the Z categories; PCRE2 adds U+180E), "." (any character but "\n"), \v (U+000B
// in Oniguruma, a class in PCRE2), \h (a hex digit in Oniguruma), nested classes (a union in
// Oniguruma, a syntax error in PCRE2), {,n} ({0,n}), {n,m}+ (a repeat of a repeat in
// Oniguruma, possessive in PCRE2) and \xHH above 0x7F (a raw byte in Oniguruma). Under (?i:)
// Oniguruma also folds one character to several ("ß" matches "ss"), which PCRE2 does not, so
// only ASCII literals without such a pair (ss, st, ff, fi, fl) may be caseless. Anything else
// is refused with the reason.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace extrap::hf_detail {

// The code point cp as UTF-8.
std::string utf8(uint32_t cp);

// The code point at s[i] of valid UTF-8; i moves past it.
uint32_t next_code_point(std::string_view s, size_t& i);

// Code points Rust's char::is_numeric (HF's Digits) counts as numeric that PCRE2's \p{N} does
// not know (PCRE2 class items).
extern const char* const kNewerNumeric;

// A compiled pattern. Matching needs a MatchState per thread.
struct Regex {
  pcre2_code* code = nullptr;
  std::string source;  // as tokenizer.json wrote it
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code); }
};

// Compiles a pattern in PCRE2's syntax (`source`: as tokenizer.json wrote it); throws
// std::invalid_argument with the reason.
std::unique_ptr<Regex> compile_pcre2(const std::string& pcre2_pattern, const std::string& source);
// An Oniguruma pattern, translated; throws std::invalid_argument naming what is not translated.
std::unique_ptr<Regex> compile_onig(const std::string& pattern);
// A literal string pattern (Split's {"String": ...}).
std::unique_ptr<Regex> compile_literal(const std::string& literal);

// Per-thread matching state: match data and a JIT stack large enough for long runs.
class MatchState {
 public:
  MatchState() {
    data_ = pcre2_match_data_create(1, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (!data_ || !context_ || !stack_) throw std::bad_alloc();
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
  ~MatchState() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  // The first match in subject[from, size) of `regex` (the subject is the whole split, as HF
  // matches it): true and [*begin, *end), or false.
  bool find(const Regex& regex, std::string_view subject, size_t from, size_t* begin, size_t* end) {
    const int rc = pcre2_match(regex.code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                               from, PCRE2_NO_UTF_CHECK, data_, context_);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw std::runtime_error("PCRE2 failed matching the pattern \"" + regex.source + "\" on " +
                               std::to_string(subject.size()) + " bytes: " +
                               reinterpret_cast<char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_);
    *begin = ovector[0];
    *end = ovector[1];
    return true;
  }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

}  // namespace extrap::hf_detail
