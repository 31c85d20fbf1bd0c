#pragma once
// The few Python and NumPy behaviours that LLaMA-Factory's metrics (jieba, rouge_chinese, nltk,
// np.mean, round) depend on, reproduced bit for bit so Tandem's scores equal the reference's:
// which code points str.split() treats as white space, math.fsum's exactly rounded sum, NumPy's
// pairwise summation in np.mean, and round(x, n).
//
// Text is UTF-8 in std::string and code points in std::u32string (Python's str indexes code
// points, so jieba's DAG and every length in nltk are counts of code points).

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::eval::py {

// UTF-8 -> code points. Malformed input becomes U+FFFD as bytes.decode(errors="replace") makes
// it: one per maximal broken subsequence (text read through nlohmann::json is valid already).
std::u32string decodeUtf8(std::string_view text);
std::string encodeUtf8(std::u32string_view text);
void appendUtf8(char32_t code_point, std::string& out);

// str.isspace() for one code point (Py_UNICODE_ISSPACE: bidi WS/B/S or category Zs).
bool isSpace(char32_t c);
// str.split() with no argument: runs of white space separate, none kept at either end.
std::vector<std::u32string> splitWhitespace(std::u32string_view text);
// str.rstrip() with no argument.
std::u32string_view rstripWhitespace(std::u32string_view text);

// math.fsum: the correctly rounded sum (Shewchuk's partials, CPython's final half-even fix).
double fsum(std::span<const double> values);
// np.mean of a float64 array: NumPy's pairwise sum (blocks of 8 accumulators up to 128
// elements, halving above), divided by the count. 0 values: NaN, as NumPy.
double numpyMean(std::span<const double> values);
// round(x, ndigits) for a float: correctly rounded to ndigits decimals, ties to even.
double roundDecimal(double x, int ndigits);

}  // namespace tandem::eval::py
