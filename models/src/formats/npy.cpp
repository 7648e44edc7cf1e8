#include "numesh/models/formats/npy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "os_error.hpp"

// Format reference: numpy/lib/format.py (NumPy 1.24). The header is the repr of a Python dict
// with the keys 'descr', 'fortran_order' and 'shape'; readers must not assume NumPy's exact
// spelling (other writers, e.g. cnpy or hand-written tools, vary the order, quotes and
// spacing), so it is parsed as a small subset of Python literals rather than matched as text.

namespace numesh::models {
namespace {

using detail::os_error;

namespace fs = std::filesystem;

static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "the .npy '<f4' payload is copied bit for bit into float");

constexpr std::string_view kMagic = "\x93NUMPY";
// Magic (6) + version (2); the header length field (2 or 4 bytes) follows.
constexpr std::size_t kMagicAndVersion = 8;
constexpr std::size_t kAlign = 64;  // NumPy's ARRAY_ALIGN: the data starts 64-byte aligned.
// NumPy's GROWTH_AXIS_MAX_DIGITS: recent NumPy (1.24 made the fixtures) reserves this many
// characters for the first extent (minus those it uses) so the header can be rewritten in place
// when the array grows. Written here too because it decides, for some ranks, whether the header is
// 128 or 192 bytes, and the byte-for-byte match with np.save is the interop test.
constexpr std::size_t kGrowthAxisMaxDigits = 21;
// An fp32 header is about 60 + 21 * rank bytes; anything near this is corrupt or hostile, and
// the cap keeps a bogus 4-byte length (v2/v3) from making us allocate gigabytes.
constexpr std::uint64_t kMaxNpyHeaderBytes = std::uint64_t{1} << 20;
// Structured descrs nest; fp32 headers never do. Bounds recursion on hostile input.
constexpr int kMaxNesting = 32;

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

/// "()", "(3,)", "(2, 3)": Python's repr of a tuple of ints, which is what np.save writes.
std::string shape_repr(std::span<const std::int64_t> shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("{}", shape[i]);
  }
  if (shape.size() == 1) out += ',';
  out += ')';
  return out;
}

/// Header text made safe to quote in a message: non-printable bytes escaped, trailing padding
/// dropped, long headers cut.
std::string printable(std::string_view text) {
  constexpr std::size_t kMaxShown = 200;
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.remove_suffix(1);
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

/// Number of elements of `shape`, or nullopt when its size in fp32 bytes does not fit in an
/// int64 (NumPy refuses those too, even when another extent is 0, so zero extents are left out
/// of the product and the answer does not depend on their position).
/// REQUIRES: no negative extent.
std::optional<std::uint64_t> element_count(std::span<const std::int64_t> shape) {
  constexpr auto kMaxElements =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / 4;
  std::uint64_t nonzero = 1;
  bool has_zero = false;
  for (const std::int64_t e : shape) {
    if (e == 0) {
      has_zero = true;
      continue;
    }
    const auto u = static_cast<std::uint64_t>(e);
    if (nonzero > kMaxElements / u) return std::nullopt;
    nonzero *= u;
  }
  return has_zero ? 0 : nonzero;
}

/// A value of the Python-literal subset an .npy header uses.
struct PyValue {
  enum class Kind { kString, kInt, kBool, kNone, kTuple, kList };
  Kind kind = Kind::kNone;
  std::string_view text;  // the source span, quoted in messages
  std::string_view str;   // kString: the contents between the quotes
  std::int64_t integer = 0;
  bool boolean = false;
  std::vector<PyValue> items;  // kTuple, kList
};

/// Recursive-descent parser for the header dict. Accepts what ast.literal_eval accepts for
/// such a dict, less what no .npy writer produces (escapes, floats, nested dicts, implicit
/// string concatenation); each refusal is a ValueError naming the column.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  std::vector<std::pair<std::string_view, PyValue>> parse_dict() {
    std::vector<std::pair<std::string_view, PyValue>> entries;
    skip_space();
    expect('{', "the header must be a dict");
    skip_space();
    while (peek() != '}') {
      const std::size_t key_pos = pos_;
      PyValue key = parse_value(1);
      if (key.kind != PyValue::Kind::kString) {
        fail(key_pos, fmt::format("dict key {} is not a string", printable(key.text)));
      }
      skip_space();
      expect(':', "':' after a dict key");
      skip_space();
      entries.emplace_back(key.str, parse_value(1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail(pos_, "expected ',' or '}' after a dict value");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail(pos_, "unexpected text after the dict");
    return entries;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= text_.size(); }

  void skip_space() {
    while (!at_end() && std::string_view(" \t\n\r\f\v").find(text_[pos_]) != std::string_view::npos)
      ++pos_;
  }

  void expect(char c, std::string_view what) {
    if (at_end() || text_[pos_] != c) fail(pos_, fmt::format("expected {}", what));
    ++pos_;
  }

  [[noreturn]] void fail(std::size_t pos, std::string_view what) const {
    throw ValueError(fmt::format("{}: cannot parse header at column {}: {} (header: {})", where_,
                                 pos + 1, what, printable(text_)));
  }

  PyValue parse_value(int depth) {
    if (depth > kMaxNesting)
      fail(pos_, fmt::format("values nested more than {} deep", kMaxNesting));
    if (at_end()) fail(pos_, "expected a value, found the end of the header");
    const std::size_t start = pos_;
    const char c = text_[pos_];
    PyValue v;
    if (c == '\'' || c == '"') {
      ++pos_;
      const std::size_t end = text_.find(c, pos_);
      if (end == std::string_view::npos) fail(start, "unterminated string");
      v.kind = PyValue::Kind::kString;
      v.str = text_.substr(pos_, end - pos_);
      if (v.str.find_first_of("\\\n") != std::string_view::npos) {
        fail(start, "escapes and line breaks in strings are not supported");
      }
      pos_ = end + 1;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::Kind::kInt;
      v.integer = parse_int();
    } else if (c == '(' || c == '[') {
      v = parse_sequence(depth);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (!at_end() &&
             (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
        ++pos_;
      const std::string_view name = text_.substr(start, pos_ - start);
      if (name == "True" || name == "False") {
        v.kind = PyValue::Kind::kBool;
        v.boolean = name == "True";
      } else if (name == "None") {
        v.kind = PyValue::Kind::kNone;
      } else {
        fail(start, fmt::format("unknown name '{}'", name));
      }
    } else {
      fail(start, fmt::format("unexpected character '{}'", printable(text_.substr(start, 1))));
    }
    v.text = text_.substr(start, pos_ - start);
    return v;
  }

  std::int64_t parse_int() {
    const std::size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    const std::size_t digits = pos_;
    std::uint64_t magnitude = 0;
    bool overflow = false;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto d = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (magnitude > (std::numeric_limits<std::uint64_t>::max() - d) / 10) overflow = true;
      magnitude = magnitude * 10 + d;
      ++pos_;
    }
    if (pos_ == digits) fail(start, "expected digits after '-'");
    // 2.0, 3L (Python 2), 1e3, 1_000: none of them is an extent NumPy writes.
    if (!at_end() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.' ||
                      text_[pos_] == '_')) {
      fail(start, "expected an integer");
    }
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (overflow || magnitude > kMax + (negative ? 1 : 0)) {
      fail(start, fmt::format("integer {} is out of range", text_.substr(start, pos_ - start)));
    }
    if (!negative) return static_cast<std::int64_t>(magnitude);
    return magnitude == kMax + 1 ? std::numeric_limits<std::int64_t>::min()
                                 : -static_cast<std::int64_t>(magnitude);
  }

  // "(a, b)", "(a,)", "()", "[a, b]"; "(a)" is just a in parentheses, as in Python.
  PyValue parse_sequence(int depth) {
    const char open = text_[pos_];
    const char close = open == '(' ? ')' : ']';
    ++pos_;
    PyValue v;
    v.kind = open == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
    bool saw_comma = false;
    skip_space();
    while (peek() != close) {
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        saw_comma = true;
        ++pos_;
        skip_space();
      } else if (peek() != close) {
        fail(pos_, fmt::format("expected ',' or '{}'", close));
      }
    }
    ++pos_;
    if (open == '(' && v.items.size() == 1 && !saw_comma) return std::move(v.items.front());
    return v;
  }

  std::string_view text_;
  const std::string& where_;
  std::size_t pos_ = 0;
};

/// A descr in words ("float64", "big-endian float32"), or nullopt for one numesh does not
/// know. `numeric` is set for dtypes where astype('<f4') is a sensible fix.
std::optional<std::string> describe_descr(std::string_view descr, bool& numeric) {
  numeric = false;
  if (descr.size() < 2 || std::string_view("<>|=").find(descr[0]) == std::string_view::npos) {
    return std::nullopt;
  }
  const std::string order = descr[0] == '>'   ? "big-endian "
                            : descr[0] == '=' ? "native-endian "
                                              : "";
  const char kind = descr[1];
  const std::string_view rest = descr.substr(2);
  if (kind == 'M' || kind == 'm') {
    // datetime64 and timedelta64 carry a unit: '<M8[ns]'.
    if (rest.empty() || rest[0] != '8') return std::nullopt;
    return order + (kind == 'M' ? "datetime64" : "timedelta64") + std::string(rest.substr(1));
  }
  if (kind == 'O' && rest.empty()) return "Python objects (pickled)";
  if (rest.empty() || rest.size() > 6 ||
      !std::all_of(rest.begin(), rest.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::nullopt;
  }
  const int size = std::stoi(std::string(rest));
  switch (kind) {
    case 'O':  // '|O', or '|O8' from old NumPy
      return "Python objects (pickled)";
    case 'f':
      numeric = true;
      return fmt::format("{}float{}", order, 8 * size);
    case 'i':
      numeric = true;
      return fmt::format("{}int{}", order, 8 * size);
    case 'u':
      numeric = true;
      return fmt::format("{}uint{}", order, 8 * size);
    case 'c':
      numeric = true;
      return fmt::format("{}complex{}", order, 8 * size);
    case 'b':
      numeric = true;
      return size == 1 ? std::optional<std::string>("bool") : std::nullopt;
    case 'U':
      return fmt::format("{}str (unicode, up to {} characters)", order, size);
    case 'S':
      return fmt::format("bytes (up to {} bytes)", size);
    case 'V':
      return fmt::format("void (raw {}-byte records)", size);
    default:
      return std::nullopt;
  }
}

struct Header {
  std::vector<std::int64_t> shape;
  std::string descr;  // one of the accepted dtypes
};

// The dtypes a reader accepts, and how its errors name them.
struct Accepted {
  std::vector<std::string_view> descrs;  // e.g. {"<f4"}
  std::string_view only;                 // "'<f4' (fp32)"
  std::string_view fix;                  // the np.save call that makes such a file
};

const Accepted kFp32{{"<f4"}, "'<f4' (fp32)", "np.save(f, a.astype('<f4'))"};
const Accepted kTokenIds{
    {"<i4", "<i8"}, "'<i4' or '<i8' (integer token ids)", "np.save(f, a.astype('<i4'))"};

/// Checks the parsed dict against what numesh reads: exactly the three keys, descr '<f4',
/// fortran_order False, shape a tuple of non-negative ints.
Header interpret_header(std::string_view text, const std::string& where, const Accepted& accepted) {
  const auto entries = HeaderParser(text, where).parse_dict();
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : entries) {
    const PyValue** slot = key == "descr"           ? &descr
                           : key == "fortran_order" ? &fortran
                           : key == "shape"         ? &shape
                                                    : nullptr;
    NUMESH_CHECK(
        slot != nullptr, ValueError,
        "{}: header has unknown key '{}' (an .npy header has exactly 'descr', 'fortran_order' and "
        "'shape'; header: {})",
        where, printable(key), printable(text));
    NUMESH_CHECK(*slot == nullptr, ValueError, "{}: header key '{}' appears twice (header: {})",
                 where, key, printable(text));
    *slot = &value;
  }
  const std::array<std::pair<std::string_view, const PyValue*>, 3> required{
      {{"descr", descr}, {"fortran_order", fortran}, {"shape", shape}}};
  for (const auto& [name, value] : required) {
    NUMESH_CHECK(value != nullptr, ValueError, "{}: header has no '{}' key (header: {})", where,
                 name, printable(text));
  }

  NUMESH_CHECK(descr->kind != PyValue::Kind::kList, ValueError,
               "{}: descr {} is a structured dtype; numesh reads only {}", where,
               printable(descr->text), accepted.only);
  NUMESH_CHECK(descr->kind == PyValue::Kind::kString, ValueError,
               "{}: descr {} is not a dtype string; numesh reads only {}", where,
               printable(descr->text), accepted.only);
  if (std::find(accepted.descrs.begin(), accepted.descrs.end(), descr->str) ==
      accepted.descrs.end()) {
    bool numeric = false;
    const auto words = describe_descr(descr->str, numeric);
    NUMESH_CHECK(words.has_value(), ValueError,
                 "{}: descr '{}' is not a dtype numesh knows; numesh reads only {}", where,
                 printable(descr->str), accepted.only);
    throw ValueError(fmt::format(
        "{}: descr '{}' is {}; numesh reads only {}{}", where, printable(descr->str), *words,
        accepted.only, numeric ? fmt::format("; save it with {}", accepted.fix) : std::string()));
  }

  NUMESH_CHECK(fortran->kind == PyValue::Kind::kBool, ValueError,
               "{}: fortran_order {} is not True or False", where, printable(fortran->text));
  NUMESH_CHECK(
      !fortran->boolean, ValueError,
      "{}: fortran_order is True (column-major data); numesh reads only C order; save it with "
      "np.save(f, np.ascontiguousarray(a))",
      where);

  const bool is_int_tuple =
      shape->kind == PyValue::Kind::kTuple &&
      std::all_of(shape->items.begin(), shape->items.end(),
                  [](const PyValue& e) { return e.kind == PyValue::Kind::kInt; });
  NUMESH_CHECK(is_int_tuple, ValueError, "{}: shape {} is not a tuple of ints", where,
               printable(shape->text));
  Header h;
  h.descr = descr->str;
  for (const PyValue& e : shape->items) h.shape.push_back(e.integer);
  NUMESH_CHECK(std::all_of(h.shape.begin(), h.shape.end(), [](std::int64_t e) { return e >= 0; }),
               ValueError, "{}: shape {} has a negative extent", where, shape_repr(h.shape));
  NUMESH_CHECK(element_count(h.shape).has_value(), ValueError,
               "{}: shape {} is too large (its fp32 size overflows int64)", where,
               shape_repr(h.shape));
  return h;
}

/// Reads exactly `n` bytes at the current position (`offset`, for the message).
void read_exact(std::FILE* f, void* dst, std::size_t n, std::uint64_t offset,
                const std::string& where) {
  if (n == 0) return;
  errno = 0;
  const std::size_t got = std::fread(dst, 1, n, f);
  if (got == n) return;
  if (std::ferror(f) != 0) {
    throw IoError(
        fmt::format("{}: read failed at byte {} ({})", where, offset + got, os_error(errno)));
  }
  throw IoError(
      fmt::format("{}: file ends early: expected {} bytes at offset {}, read {} (did it change "
                  "while being read?)",
                  where, n, offset, got));
}

std::uint64_t read_le(std::span<const unsigned char> bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) v = (v << 8) | bytes[i];
  return v;
}

// Used only where the host is big-endian (if constexpr), hence maybe_unused.
[[maybe_unused]] void byteswap_in_place(std::span<float> values) {
  for (float& x : values) {
    auto u = std::bit_cast<std::uint32_t>(x);
    u = (u >> 24) | ((u >> 8) & 0xff00U) | ((u << 8) & 0xff0000U) | (u << 24);
    x = std::bit_cast<float>(u);
  }
}

/// The complete version-1.0 preamble (magic, version, length, dict, padding, '\n') np.save
/// writes for an fp32 C-order array of `shape`.
std::string make_preamble(std::span<const std::int64_t> shape, const std::string& where) {
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", shape_repr(shape));
  if (!shape.empty()) dict.append(kGrowthAxisMaxDigits - fmt::format("{}", shape[0]).size(), ' ');
  // NumPy pads to the next multiple of kAlign and, when already aligned, by a whole kAlign
  // more (its padlen is kAlign - (len % kAlign), never 0); done the same to match its bytes.
  const std::size_t unpadded = kMagicAndVersion + 2 + dict.size() + 1;
  const std::size_t header_len = dict.size() + 1 + (kAlign - unpadded % kAlign);
  NUMESH_CHECK(
      header_len <= std::numeric_limits<std::uint16_t>::max(), ShapeError,
      "{}: shape of rank {} needs a {}-byte header, more than format version 1.0 holds (65535)",
      where, shape.size(), header_len);
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header_len & 0xffU);
  out += static_cast<char>(header_len >> 8);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  NUMESH_DCHECK(out.size() % kAlign == 0);
  return out;
}

// An array's shape, dtype and little-endian bytes, read from `file` after checking its header
// against `accepted`.
struct RawArray {
  Header header;
  std::vector<unsigned char> bytes;
};

RawArray load_array(const std::filesystem::path& file, const Accepted& accepted) {
  const std::string where = fmt::format("npy: cannot load '{}'", file.string());
  std::error_code ec;
  const std::uint64_t file_size = fs::file_size(file, ec);
  NUMESH_CHECK(!ec, IoError, "{}: {}", where, ec.message());
  errno = 0;
  const FilePtr f(std::fopen(file.c_str(), "rb"));
  NUMESH_CHECK(f != nullptr, IoError, "{}: cannot open it for reading ({})", where,
               os_error(errno));

  std::array<unsigned char, kMagicAndVersion + 4> prefix{};
  const auto head = static_cast<std::size_t>(std::min<std::uint64_t>(file_size, kMagicAndVersion));
  read_exact(f.get(), prefix.data(), head, 0, where);
  // A short file that so far matches the magic was cut off; one that does not match is
  // something else.
  const std::size_t compared = std::min(head, kMagic.size());
  if (std::memcmp(prefix.data(), kMagic.data(), compared) != 0) {
    const bool zip = head >= 2 && prefix[0] == 'P' && prefix[1] == 'K';
    throw ValueError(fmt::format(
        "{}: not an .npy file (it does not start with \\x93NUMPY){}", where,
        zip ? "; it is a zip archive, perhaps an .npz, which load_npy does not read" : ""));
  }
  NUMESH_CHECK(
      head == kMagicAndVersion, IoError,
      "{}: file ends early: it has {} bytes, fewer than the {} of the magic string and version",
      where, file_size, kMagicAndVersion);

  const unsigned major = prefix[6];
  const unsigned minor = prefix[7];
  NUMESH_CHECK(minor == 0 && major >= 1 && major <= 3, ValueError,
               "{}: unsupported .npy format version {}.{} (numesh reads 1.0, 2.0 and 3.0)", where,
               major, minor);
  // 1.0 has a 2-byte header length; 2.0 widened it to 4 bytes; 3.0 only changed the header's
  // encoding (latin-1 to UTF-8), which is irrelevant to the ASCII an fp32 header holds.
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble = kMagicAndVersion + length_bytes;
  NUMESH_CHECK(file_size >= preamble, IoError,
               "{}: file ends early: it has {} bytes, fewer than the {} of the magic string, "
               "version and header "
               "length",
               where, file_size, preamble);
  read_exact(f.get(), prefix.data() + kMagicAndVersion, length_bytes, kMagicAndVersion, where);
  const std::uint64_t header_len =
      read_le(std::span(prefix).subspan(kMagicAndVersion, length_bytes));
  NUMESH_CHECK(header_len <= kMaxNpyHeaderBytes, ValueError,
               "{}: header of {} bytes is larger than numesh reads ({} bytes); the file is corrupt",
               where, header_len, kMaxNpyHeaderBytes);
  NUMESH_CHECK(
      file_size - preamble >= header_len, IoError,
      "{}: file ends early: the header needs {} bytes after the first {}, the file has {} in all",
      where, header_len, preamble, file_size);
  std::string text(static_cast<std::size_t>(header_len), '\0');
  read_exact(f.get(), text.data(), text.size(), preamble, where);
  Header header = interpret_header(text, where, accepted);

  const std::uint64_t count = *element_count(header.shape);
  const std::uint64_t item = header.descr == "<i8" ? 8 : 4;
  NUMESH_CHECK(count <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / item,
               ValueError, "{}: shape {} is too large (its size in bytes overflows int64)", where,
               shape_repr(header.shape));
  const std::uint64_t data_bytes = count * item;
  const std::uint64_t data_offset = preamble + header_len;
  const std::uint64_t available = file_size - data_offset;
  NUMESH_CHECK(available >= data_bytes, IoError,
               "{}: file ends early: shape {} of '{}' needs {} data bytes after the {}-byte "
               "header, the file has "
               "{} ({} bytes in all)",
               where, shape_repr(header.shape), header.descr, data_bytes, data_offset, available,
               file_size);
  // Extra bytes mean the header does not describe the file (a wrong shape, or two arrays
  // concatenated): refusing is safer than silently reading a prefix.
  NUMESH_CHECK(available == data_bytes, ValueError,
               "{}: {} unexpected bytes after the data: shape {} of '{}' needs {} data bytes "
               "after the {}-byte "
               "header, the file has {}",
               where, available - data_bytes, shape_repr(header.shape), header.descr, data_bytes,
               data_offset, available);

  RawArray raw{std::move(header), std::vector<unsigned char>(static_cast<std::size_t>(data_bytes))};
  read_exact(f.get(), raw.bytes.data(), raw.bytes.size(), data_offset, where);
  return raw;
}

}  // namespace

runtime::HostTensor load_npy(const std::filesystem::path& file) {
  RawArray raw = load_array(file, kFp32);
  runtime::HostTensor tensor{std::move(raw.header.shape),
                             std::vector<float>(raw.bytes.size() / sizeof(float))};
  // An empty array's vectors may hold null pointers, which memcpy must not be given even for
  // zero bytes (found by npy_fuzz under UBSan).
  if (!raw.bytes.empty()) std::memcpy(tensor.data.data(), raw.bytes.data(), raw.bytes.size());
  if constexpr (std::endian::native == std::endian::big) byteswap_in_place(tensor.data);
  return tensor;
}

NpyIds load_npy_ids(const std::filesystem::path& file) {
  const RawArray raw = load_array(file, kTokenIds);
  const bool wide = raw.header.descr == "<i8";
  const std::size_t item = wide ? 8 : 4, count = raw.bytes.size() / item;
  NpyIds ids{raw.header.shape, std::vector<std::int32_t>(count)};
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = static_cast<std::int64_t>(
        wide ? read_le(std::span(raw.bytes).subspan(i * 8, 8))
             : static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int32_t>(
                   static_cast<std::uint32_t>(read_le(std::span(raw.bytes).subspan(i * 4, 4)))))));
    NUMESH_CHECK(value >= std::numeric_limits<std::int32_t>::min() &&
                     value <= std::numeric_limits<std::int32_t>::max(),
                 ValueError, "npy: cannot load '{}': id {} at index {} does not fit int32",
                 file.string(), value, i);
    ids.values[i] = static_cast<std::int32_t>(value);
  }
  return ids;
}

void save_npy(const std::filesystem::path& file, const runtime::HostTensor& tensor) {
  const std::string where = fmt::format("npy: cannot save '{}'", file.string());
  NUMESH_CHECK(
      std::all_of(tensor.shape.begin(), tensor.shape.end(), [](std::int64_t e) { return e >= 0; }),
      ShapeError, "{}: shape {} has a negative extent", where, shape_repr(tensor.shape));
  const auto count = element_count(tensor.shape);
  NUMESH_CHECK(count.has_value(), ShapeError,
               "{}: shape {} is too large (its fp32 size overflows int64)", where,
               shape_repr(tensor.shape));
  NUMESH_CHECK(*count == tensor.data.size(), ShapeError,
               "{}: shape {} has {} elements but the data has {} values", where,
               shape_repr(tensor.shape), *count, tensor.data.size());
  const std::string preamble = make_preamble(tensor.shape, where);

  errno = 0;
  FilePtr f(std::fopen(file.c_str(), "wb"));
  NUMESH_CHECK(f != nullptr, IoError, "{}: cannot open it for writing ({})", where,
               os_error(errno));
  errno = 0;
  bool ok = std::fwrite(preamble.data(), 1, preamble.size(), f.get()) == preamble.size();
  if constexpr (std::endian::native == std::endian::little) {
    // An empty vector's data() may be null, which fwrite must not be given even for 0 items.
    ok = ok &&
         (tensor.data.empty() || std::fwrite(tensor.data.data(), sizeof(float), tensor.data.size(),
                                             f.get()) == tensor.data.size());
  } else {
    std::array<float, 1024> chunk{};
    for (std::size_t i = 0; ok && i < tensor.data.size(); i += chunk.size()) {
      const std::size_t n = std::min(chunk.size(), tensor.data.size() - i);
      std::copy_n(tensor.data.begin() + static_cast<std::ptrdiff_t>(i), n, chunk.begin());
      byteswap_in_place(std::span(chunk).first(n));
      ok = std::fwrite(chunk.data(), sizeof(float), n, f.get()) == n;
    }
  }
  NUMESH_CHECK(ok, IoError, "{}: write failed ({})", where, os_error(errno));
  // stdio buffers: a full disk often shows up only when the buffer is flushed on close.
  errno = 0;
  const int closed = std::fclose(f.release());
  NUMESH_CHECK(closed == 0, IoError, "{}: write failed when closing ({})", where, os_error(errno));
}

}  // namespace numesh::models
