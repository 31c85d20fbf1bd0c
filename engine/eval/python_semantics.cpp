#include "engine/eval/python_semantics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tandem::eval::py {

namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Length of the UTF-8 sequence that starts with `lead`, 0 if `lead` cannot start one.
size_t sequenceLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::u32string decodeUtf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = sequenceLength(lead);
    if (length == 0) {
      out.push_back(kReplacement);
      ++i;
      continue;
    }
    // The second byte's range excludes overlong forms, surrogates and values above U+10FFFF.
    const unsigned char low = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    size_t k = 1;
    for (; k < length && i + k < text.size(); ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) break;
      c = (c << 6) | (next & 0x3F);
    }
    // A broken sequence: its longest valid start becomes one U+FFFD, as Python's decoder does.
    out.push_back(k == length ? c : kReplacement);
    i += k;
  }
  return out;
}

void appendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encodeUtf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : text) appendUtf8(c, out);
  return out;
}

bool isSpace(char32_t c) {
  // The code points for which CPython 3.12's str.isspace() is true (Unicode 15).
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::u32string> splitWhitespace(std::u32string_view text) {
  std::vector<std::u32string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && isSpace(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !isSpace(text[i])) ++i;
    if (i > start) words.emplace_back(text.substr(start, i - start));
  }
  return words;
}

std::u32string_view rstripWhitespace(std::u32string_view text) {
  size_t end = text.size();
  while (end > 0 && isSpace(text[end - 1])) --end;
  return text.substr(0, end);
}

double fsum(std::span<const double> values) {
  std::vector<double> partials;
  double naive = 0;
  for (double x : values) {
    naive += x;
    size_t kept = 0;
    for (double y : partials) {
      if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
      const double hi = x + y;
      const double lo = y - (hi - x);
      if (lo != 0.0) partials[kept++] = lo;
      x = hi;
    }
    partials.resize(kept);
    if (x != 0.0) partials.push_back(x);
  }
  // Infinities and NaNs have no exact sum; Python raises or returns them, we return the plain sum.
  if (!std::isfinite(naive)) return naive;
  if (partials.empty()) return 0.0;
  size_t n = partials.size();
  double hi = partials[--n];
  double lo = 0;
  while (n > 0) {
    const double x = hi;
    const double y = partials[--n];
    hi = x + y;
    lo = y - (hi - x);
    if (lo != 0.0) break;
  }
  // Half-even rounding across several partials (CPython mathmodule.c, math_fsum).
  if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
    const double y = lo * 2.0;
    const double x = hi + y;
    if (y == x - hi) hi = x;
  }
  return hi;
}

namespace {

// NumPy's DOUBLE_pairwise_sum (numpy/_core/src/umath/loops_utils.h.src), PW_BLOCKSIZE 128.
double pairwiseSum(const double* a, size_t n) {
  if (n < 8) {
    double sum = 0.;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return pairwiseSum(a, half) + pairwiseSum(a + half, n - half);
}

}  // namespace

double numpyMean(std::span<const double> values) {
  if (values.empty()) return std::nan("");
  return pairwiseSum(values.data(), values.size()) / static_cast<double>(values.size());
}

double roundDecimal(double x, int ndigits) {
  if (!std::isfinite(x)) return x;
  // glibc prints the exact binary value rounded half-even, as CPython's _Py_dg_dtoa mode 3.
  char text[512];
  std::snprintf(text, sizeof(text), "%.*f", ndigits, x);
  return std::strtod(text, nullptr);
}

}  // namespace tandem::eval::py
