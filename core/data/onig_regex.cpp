#include "core/data/onig_regex.h"

#include <cstdio>
#include <string>

namespace extrap::hf_detail {

// ---------------------------------------------------------------------------------------------
// UTF-8

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = uint8_t(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  i += size_t(n);
  return cp;
}

// ---------------------------------------------------------------------------------------------
// The translation (onig_regex.h says which differences it writes out).

const char* const kOnigSpace = "\\t\\n\\x{0B}\\f\\r\\x{85}\\p{Z}";  // class items

// Code points HF tokenizers 0.23's Oniguruma (Unicode 16 and later) puts in \p{L}, \p{N} and
// \p{Nd} that PCRE2 10.42 (Unicode 14) leaves unassigned; added to the translated classes so
// that both match the same characters (check_hf_tokenizer.py classes compares every code
// point). Between the two, no code point is in PCRE2's class and not in Oniguruma's.
const char* const kNewerLetters =
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}\\x{10D4A}-\\x{10D65}"
    "\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}"
    "\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}"
    "\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}"
    "\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
const char* const kNewerDecimals =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}\\x{16130}-\\x{16139}"
    "\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";
const char* const kNewerNumbers =  // the decimals and these
    "\\x{1D2C0}-\\x{1D2D3}";
// Rust's char::is_numeric (HF's Digits) is newer still: \p{N} of PCRE2 and these.
const char* const kNewerNumeric =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11DE0}-\\x{11DE9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{16FF4}-\\x{16FF6}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}";

// The class items of \p{name} as HF's Oniguruma reads it, or "" for a name not checked.
std::string property_items(const std::string& name) {
  if (name == "L") return std::string("\\p{L}") + kNewerLetters;
  if (name == "N") return std::string("\\p{N}") + kNewerDecimals + kNewerNumbers;
  if (name == "Nd") return std::string("\\p{Nd}") + kNewerDecimals;
  return "";
}

class OnigTranslation {
 public:
  explicit OnigTranslation(std::string_view pattern) : p_(pattern) {}

  std::string run() {
    std::string out;
    std::vector<bool> groups;  // each open group: caseless inside
    while (i_ < p_.size()) {
      const char c = p_[i_];
      const bool caseless = !groups.empty() && groups.back();
      if (c == '\\') {
        out += escape(caseless);
        after_atom(false);
      } else if (c == '[') {
        if (caseless) refuse("a character class under (?i:)");
        ++i_;
        out += char_class();
        after_atom(false);
      } else if (c == '(') {
        const std::string_view rest = p_.substr(i_);
        bool inner = caseless;
        if (rest.substr(0, 3) == "(?:" || rest.substr(0, 3) == "(?=" || rest.substr(0, 3) == "(?!") {
          out += rest.substr(0, 3);
          i_ += 3;
        } else if (rest.substr(0, 4) == "(?i:") {
          out += "(?i:";
          i_ += 4;
          inner = true;
        } else if (rest.substr(0, 2) == "(?") {
          refuse("the group \"" + std::string(rest.substr(0, 4)) +
                 "\" (only (?:, (?i:, (?= and (?! are read)");
        } else {
          out += "(?:";  // captures do not change where a pattern matches
          ++i_;
        }
        groups.push_back(inner);
        last_ = Last::None;
      } else if (c == ')') {
        if (groups.empty()) refuse("an unmatched \")\"");
        groups.pop_back();
        out += ')';
        ++i_;
        after_atom(false);
      } else if (c == '|') {
        out += '|';
        ++i_;
        last_ = Last::None;
      } else if (c == '*' || c == '+' || c == '?') {
        if (last_ == Last::Atom) {
          last_ = Last::Quantifier;
        } else if (last_ == Last::Quantifier) {
          if (c == '*') refuse("\"**\"");
          last_ = Last::Done;  // lazy (?) or possessive (+): the same in both
        } else if (last_ == Last::Interval) {
          refuse(std::string("\"") + c +
                 "\" after {n,m} (a repeat in Oniguruma, lazy or possessive in PCRE2)");
        } else {
          refuse(std::string("\"") + c + "\" with nothing to repeat");
        }
        out += c;
        ++i_;
      } else if (c == '{') {
        if (last_ != Last::Atom) refuse("\"{\" with nothing to repeat");
        out += interval();
        last_ = Last::Interval;
      } else if (c == '.') {
        out += "[^\\n]";
        ++i_;
        after_atom(false);
      } else if (c == '^' || c == '$') {
        refuse(std::string("the anchor \"") + c + "\"");
      } else if (c == ']' || c == '}') {
        refuse(std::string("a bare \"") + c + "\"");
      } else {
        const size_t start = i_;
        const uint32_t cp = next_code_point(p_, i_);
        if (caseless) {
          if (cp >= 0x80) refuse("the non-ASCII character \"" + utf8(cp) + "\" under (?i:)");
          const char lower = char(std::tolower(int(cp)));
          static const std::set<std::string> folds = {"ss", "st", "ff", "fi", "fl"};
          if (previous_literal_ && folds.count(std::string{previous_literal_, lower}))
            refuse(std::string("\"") + previous_literal_ + lower +
                   "\" under (?i:) (Oniguruma also matches the one character that folds to it)");
        }
        out.append(p_.substr(start, i_ - start));
        after_atom(caseless && cp < 0x80 ? char(std::tolower(int(cp))) : 0);
        continue;
      }
    }
    if (!groups.empty()) refuse("an unclosed \"(\"");
    return out;
  }

 private:
  enum class Last { None, Atom, Quantifier, Interval, Done };

  [[noreturn]] void refuse(const std::string& what) const {
    throw std::invalid_argument(what + " at offset " + std::to_string(i_));
  }

  void after_atom(char literal) {
    last_ = Last::Atom;
    previous_literal_ = literal;
  }

  uint32_t hex(size_t digits_max, bool braces) {
    size_t k = 0;
    uint32_t cp = 0;
    while (i_ < p_.size() && std::isxdigit(uint8_t(p_[i_])) && k < digits_max) {
      cp = cp * 16 + uint32_t(std::stoi(std::string(1, p_[i_]), nullptr, 16));
      ++i_;
      ++k;
      if (cp > 0x10FFFF) refuse("a code point past U+10FFFF");
    }
    if (k == 0) refuse("a hex escape without digits");
    if (braces) {
      if (i_ >= p_.size() || p_[i_] != '}') refuse("an unterminated \\x{");
      ++i_;
    }
    return cp;
  }

  // The escape at p_[i_] == '\\'. Class items (\s, \p) come back as items when `in_class`;
  // a single character comes back in *single.
  std::string escape_item(bool in_class, bool caseless, std::optional<uint32_t>* single) {
    ++i_;
    if (i_ >= p_.size()) refuse("a trailing backslash");
    const char e = p_[i_++];
    auto one = [&](uint32_t cp) {
      *single = cp;
      return std::string();
    };
    if (caseless && (std::isalnum(uint8_t(e))))
      refuse(std::string("\\") + e + " under (?i:)");
    switch (e) {
      case 's':
        return in_class ? std::string(kOnigSpace) : "[" + std::string(kOnigSpace) + "]";
      case 'S':
        if (in_class) refuse("\\S inside a character class");
        return "[^" + std::string(kOnigSpace) + "]";
      case 'd':
        return in_class ? property_items("Nd") : "[" + property_items("Nd") + "]";
      case 'D':
        if (in_class) refuse("\\D inside a character class");
        return "[^" + property_items("Nd") + "]";
      case 'p':
      case 'P': {
        if (i_ >= p_.size() || p_[i_] != '{') refuse(std::string("\\") + e + " without {");
        const size_t close = p_.find('}', i_);
        if (close == std::string_view::npos) refuse(std::string("an unterminated \\") + e + "{");
        std::string name(p_.substr(i_ + 1, close - i_ - 1));
        i_ = close + 1;
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.erase(0, 1);
        }
        const std::string items = property_items(name);
        if (items.empty())
          refuse("the property \\p{" + name + "} (\\p{L}, \\p{N} and \\p{Nd} are checked against HF's)");
        if (negated && in_class) refuse("a negated property inside a character class");
        if (in_class) return items;
        return std::string(negated ? "[^" : "[") + items + "]";
      }
      case 't': return one(0x09);
      case 'n': return one(0x0A);
      case 'v': return one(0x0B);
      case 'f': return one(0x0C);
      case 'r': return one(0x0D);
      case 'a': return one(0x07);
      case 'e': return one(0x1B);
      case 'x': {
        if (i_ < p_.size() && p_[i_] == '{') {
          ++i_;
          return one(hex(8, true));
        }
        const uint32_t cp = hex(2, false);
        if (cp >= 0x80) refuse("\\x above 7F (a raw byte in Oniguruma; write \\x{...})");
        return one(cp);
      }
      case 'u':
        return one(hex(4, false));
      default:
        if (std::isalnum(uint8_t(e)) || uint8_t(e) >= 0x80)
          refuse(std::string("the escape \\") + e);
        return one(uint32_t(uint8_t(e)));  // an escaped ASCII symbol: itself
    }
  }

  static std::string code_point_item(uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\x{%X}", cp);
    return buf;
  }

  std::string escape(bool caseless) {
    std::optional<uint32_t> single;
    std::string item = escape_item(false, caseless, &single);
    if (single) {
      item = code_point_item(*single);
      previous_literal_ = 0;
    }
    return item;
  }

  // One item of a class: an escape, or a character (then *single). Stops at ']' and '['.
  std::string class_atom(std::optional<uint32_t>* single) {
    if (p_[i_] == '\\') return escape_item(true, false, single);
    *single = next_code_point(p_, i_);
    return {};
  }

  // A class whose '[' is consumed; Oniguruma's nested non-negated classes are flattened.
  std::string char_class() {
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    std::string items = class_items();
    if (items.empty()) refuse("an empty character class");
    return std::string(negated ? "[^" : "[") + items + "]";
  }

  std::string class_items() {
    std::string items;
    if (i_ < p_.size() && p_[i_] == ']') refuse("\"]\" first in a character class");
    while (true) {
      if (i_ >= p_.size()) refuse("an unterminated character class");
      const char c = p_[i_];
      if (c == ']') {
        ++i_;
        return items;
      }
      if (c == '[') {
        if (p_.substr(i_, 2) == "[:") refuse("a POSIX bracket [: :]");
        if (p_.substr(i_, 2) == "[^") refuse("a negated class inside a class");
        ++i_;
        items += class_items();
        continue;
      }
      if (c == '&' && p_.substr(i_, 2) == "&&") refuse("class intersection &&");
      std::optional<uint32_t> first;
      const std::string item = class_atom(&first);
      const bool range = i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']';
      if (!first) {
        if (range) refuse("a range from a class escape");
        items += item;
        continue;
      }
      if (!range) {
        items += code_point_item(*first);
        continue;
      }
      ++i_;  // '-'
      if (p_[i_] == '[') refuse("a range to a class");
      std::optional<uint32_t> last;
      class_atom(&last);
      if (!last) refuse("a range to a class escape");
      if (*last < *first) refuse("a reversed range");
      items += code_point_item(*first) + "-" + code_point_item(*last);
    }
  }

  // {n}, {n,}, {n,m} or {,m} at p_[i_] == '{'.
  std::string interval() {
    const size_t close = p_.find('}', i_);
    if (close == std::string_view::npos) refuse("an unterminated {");
    const std::string body(p_.substr(i_ + 1, close - i_ - 1));
    const size_t comma = body.find(',');
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() < 6 && std::all_of(s.begin(), s.end(), ::isdigit);
    };
    const std::string lo = body.substr(0, comma);
    const std::string hi = comma == std::string::npos ? "" : body.substr(comma + 1);
    const bool ok = comma == std::string::npos ? digits(lo)
                                               : (digits(lo) || lo.empty()) && (digits(hi) || hi.empty()) &&
                                                     !(lo.empty() && hi.empty());
    if (!ok) refuse("the interval {" + body + "}");
    if (!lo.empty() && !hi.empty() && std::stoi(hi) < std::stoi(lo)) refuse("the interval {" + body + "}");
    i_ = close + 1;
    return "{" + (lo.empty() ? std::string("0") : lo) + (comma == std::string::npos ? "" : "," + hi) + "}";
  }

  std::string_view p_;
  size_t i_ = 0;
  Last last_ = Last::None;
  char previous_literal_ = 0;  // the last atom, when an ASCII literal under (?i:)
};

// Compiles a PCRE2 pattern already in PCRE2's syntax; throws std::invalid_argument.
std::unique_ptr<Regex> compile_pcre2(const std::string& pcre2_pattern, const std::string& source) {
  auto regex = std::make_unique<Regex>();
  regex->source = source;
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE offset = 0;
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern.data()), pcre2_pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, context);
  pcre2_compile_context_free(context);
  if (!regex->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw std::invalid_argument("PCRE2 cannot compile its translation \"" + pcre2_pattern +
                                "\": " + reinterpret_cast<char*>(message));
  }
  uint32_t min_length = 0;
  pcre2_pattern_info(regex->code, PCRE2_INFO_MINLENGTH, &min_length);
  if (min_length == 0)
    throw std::invalid_argument("it can match the empty string (HF then yields empty splits)");
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // without JIT, the interpreter: same matches
  return regex;
}

std::unique_ptr<Regex> compile_onig(const std::string& pattern) {
  return compile_pcre2(OnigTranslation(pattern).run(), pattern);
}

// A literal string pattern (Split's {"String": ...}; HF escapes it for Oniguruma).
std::unique_ptr<Regex> compile_literal(const std::string& literal) {
  std::string pcre2_pattern;
  for (size_t i = 0; i < literal.size();) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\x{%X}", next_code_point(literal, i));
    pcre2_pattern += buf;
  }
  return compile_pcre2(pcre2_pattern, literal);
}

}  // namespace extrap::hf_detail
