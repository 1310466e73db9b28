// The safetensors reader and writer (format: github.com/huggingface/safetensors).
// The bytes come from user files, so parse() trusts nothing: every length,
// offset and shape is checked before it is used, with overflow-free arithmetic.
#include "metrale/safetensors.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <system_error>
#include <unordered_set>
#include <utility>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/json_checks.hpp"

namespace metrale {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace {

using Json = nlohmann::json;

// The Rust reference implementation's bound is 100 MB; a header is a few KiB in
// practice, and the bound keeps a hostile length from allocating gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;
// A tensor's entry holds about eight JSON values (dtype, a few dims, two offsets), so a million
// values is a hundred thousand tensors, past any model shard; 100 MB of one-byte values would be
// fifty million, which the parsed JSON holds in gigabytes. Counted before anything is built.
constexpr std::uint64_t kMaxJsonValues = 1'000'000;
// A valid header nests three deep (object → entry → shape array); anything much
// deeper is hostile and is refused before it can cost stack or memory.
constexpr int kMaxJsonDepth = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

struct DtypeName {
  Dtype dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DtypeName, 14> kDtypes{{
    {Dtype::f64, "F64", 8},
    {Dtype::f32, "F32", 4},
    {Dtype::f16, "F16", 2},
    {Dtype::bf16, "BF16", 2},
    {Dtype::i64, "I64", 8},
    {Dtype::i32, "I32", 4},
    {Dtype::i16, "I16", 2},
    {Dtype::i8, "I8", 1},
    {Dtype::u64, "U64", 8},
    {Dtype::u32, "U32", 4},
    {Dtype::u16, "U16", 2},
    {Dtype::u8, "U8", 1},
    {Dtype::boolean, "BOOL", 1},
    {Dtype::f8_e4m3, "F8_E4M3", 1},
}};

const DtypeName& dtype_entry(Dtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d;
  fail(Errc::internal, "dtype value {} is not a known dtype", static_cast<int>(dtype));
}

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

// a * b, or nullopt when it does not fit in size_t.
std::optional<std::size_t> checked_mul(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// IEEE binary16 → binary32, exact (every half is a float).
float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {  // inf, or NaN with its payload kept
    return std::bit_cast<float>(sign | 0x7F80'0000u | (mant << 13));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));  // rebias 15 → 127
}

// double → float rounded to nearest; out-of-range values become ±inf explicitly,
// since a C++ cast of a double beyond float's range is undefined.
float narrow_to_float(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  // From half an ulp above the largest float on, the value rounds to infinity
  // (the largest float's mantissa is odd, so the tie goes up too).
  constexpr double kOverflow = kMax + 0x1p103;
  const float sign = std::signbit(v) ? -1.0f : 1.0f;
  if (std::isfinite(v) && std::fabs(v) >= kOverflow) return sign * std::numeric_limits<float>::infinity();
  if (std::isfinite(v) && std::fabs(v) > kMax) return sign * std::numeric_limits<float>::max();
  return static_cast<float>(v);
}

template <class T>
void append_converted(const std::vector<std::byte>& data, std::vector<float>& out) {
  const std::size_t n = data.size() / sizeof(T);
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, data.data() + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, Bf16>) {
      out[i] = v.to_float();
    } else if constexpr (std::is_same_v<T, double>) {
      out[i] = narrow_to_float(v);
    } else {
      out[i] = v;
    }
  }
}

// An unsigned JSON integer, or nullopt (negative, fractional or not a number).
std::optional<std::uint64_t> json_u64(const Json& j) {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer() && j.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(j.get<std::int64_t>());
  return std::nullopt;
}

Json parse_header_json(std::string_view text, std::string_view name) {
  // JSON keeps the last of duplicate keys silently; two entries for one tensor
  // name (or two values of one metadata key, or two dtypes of one tensor) would
  // let two readers see different files, so they are refused in every object.
  // (A NUL or a byte-order mark is refused there too.)
  check_json_shape(
      text, {fmt::format("{}: header", name), kMaxJsonDepth, kMaxJsonValues, " (a tensor's entry needs about 8)"});
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    fail(Errc::invalid_argument, "{}: header is not valid json: {}", name, e.what());
  }
}

std::map<std::string, std::string> parse_metadata(const Json& j, std::string_view name) {
  if (!j.is_object()) fail(Errc::invalid_argument, "{}: __metadata__ is a json {}, not an object", name, j.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      fail(Errc::invalid_argument, "{}: __metadata__ value of '{}' is a json {}, not a string", name, excerpt(key),
           value.type_name());
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// A JSON value for an error message, cut short: a hostile header can hold a
// shape array of millions of entries.
std::string brief(const Json& j) {
  constexpr std::size_t kMax = kExcerptBytes;
  std::string s;
  if (j.is_array()) {  // element by element, up to the cut: never the whole array
    s = "[";
    for (const Json& e : j) {
      if (s.size() > kMax) break;
      s += (s.size() > 1 ? "," : "") + brief(e);
    }
    s += "]";
  } else {
    s = j.dump();  // a scalar, or an object (the shape and offsets readers name arrays)
  }
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

struct Entry {
  Tensor tensor;  // data not yet filled
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

Entry parse_entry(const std::string& tensor_name, const Json& j, std::uint64_t data_size, std::string_view name) {
  const std::string tensor = excerpt(tensor_name);  // as the messages below name it
  if (!j.is_object())
    fail(Errc::invalid_argument, "{}: tensor '{}' is a json {}, not an object", name, tensor, j.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) fail(Errc::invalid_argument, "{}: tensor '{}' has no {}", name, tensor, key);

  Entry e;
  const Json& dtype = j.at("dtype");
  if (!dtype.is_string())
    fail(Errc::invalid_argument, "{}: tensor '{}' dtype is a json {}, not a string", name, tensor, dtype.type_name());
  const auto parsed = parse_dtype(dtype.get<std::string>());
  if (!parsed)
    fail(Errc::invalid_argument, "{}: tensor '{}' has unknown dtype '{}'", name, tensor,
         excerpt(dtype.get<std::string>()));
  e.tensor.dtype = *parsed;

  const Json& shape = j.at("shape");
  if (!shape.is_array())
    fail(Errc::invalid_argument, "{}: tensor '{}' shape is a json {}, not an array", name, tensor, shape.type_name());
  std::size_t numel = 1;
  for (const Json& dim : shape) {
    const auto d = json_u64(dim);
    if (!d)
      fail(Errc::invalid_argument, "{}: tensor '{}' shape {} has a dimension that is not a non-negative integer", name,
           tensor, brief(shape));
    if (*d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(Errc::invalid_argument, "{}: tensor '{}' shape {} has a dimension {} past 2^63 - 1", name, tensor,
           brief(shape), *d);
    const auto n = checked_mul(numel, static_cast<std::size_t>(*d));
    if (!n)
      fail(Errc::invalid_argument, "{}: tensor '{}' shape {} overflows the element count", name, tensor, brief(shape));
    numel = *n;
    e.tensor.shape.push_back(static_cast<std::int64_t>(*d));
  }
  const auto bytes = checked_mul(numel, dtype_size(e.tensor.dtype));
  if (!bytes)
    fail(Errc::invalid_argument, "{}: tensor '{}' shape {} overflows the byte count", name, tensor, brief(shape));

  const Json& offsets = j.at("data_offsets");
  const auto begin = offsets.is_array() && offsets.size() == 2 ? json_u64(offsets[0]) : std::nullopt;
  const auto end = offsets.is_array() && offsets.size() == 2 ? json_u64(offsets[1]) : std::nullopt;
  if (!begin || !end)
    fail(Errc::invalid_argument, "{}: tensor '{}' data_offsets {} is not a pair of non-negative integers", name, tensor,
         brief(offsets));
  if (*begin > *end)
    fail(Errc::invalid_argument, "{}: tensor '{}' data_offsets [{}, {}] end before they begin", name, tensor, *begin,
         *end);
  if (*end > data_size)
    fail(Errc::invalid_argument, "{}: tensor '{}' data_offsets [{}, {}] lie outside the data section of {} bytes", name,
         tensor, *begin, *end, data_size);
  if (*end - *begin != *bytes)
    fail(Errc::invalid_argument, "{}: tensor '{}' data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}",
         name, tensor, *begin, *end, *end - *begin, brief(shape), to_string(e.tensor.dtype), *bytes);
  e.begin = *begin;
  e.end = *end;
  return e;
}

// Two tensors sharing bytes would alias after a write; bytes no tensor covers would be read by
// nobody (a file that is something else besides, or whose header length is off by a few bytes of
// padding, shifting every tensor). The format forbids both: "the byte buffer needs to be
// entirely indexed, and cannot contain holes" (huggingface/safetensors, README, Format).
void check_exact_cover(const std::map<std::string, Entry>& entries, std::uint64_t data_size, std::string_view name) {
  std::vector<std::pair<const std::string*, const Entry*>> sorted;
  for (const auto& [tensor, e] : entries)
    if (e.end > e.begin) sorted.emplace_back(&tensor, &e);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const auto& [cur_name, cur] = sorted[i];
    if (cur->begin < covered)  // covered: the end of the tensor before
      fail(Errc::invalid_argument, "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", name,
           excerpt(*sorted[i - 1].first), sorted[i - 1].second->begin, sorted[i - 1].second->end, excerpt(*cur_name),
           cur->begin, cur->end);
    if (cur->begin > covered)
      fail(Errc::invalid_argument, "{}: bytes [{}, {}) of the data section belong to no tensor (before '{}')", name,
           covered, cur->begin, excerpt(*cur_name));
    covered = cur->end;
  }
  if (covered != data_size)
    fail(Errc::invalid_argument, "{}: the data section has {} bytes, its tensors cover {} (bytes after the last)", name,
         data_size, covered);
}

}  // namespace

std::string_view to_string(Dtype dtype) { return dtype_entry(dtype).name; }

std::size_t dtype_size(Dtype dtype) { return dtype_entry(dtype).size; }

// ---- Tensor -------------------------------------------------------------------

std::size_t Tensor::numel() const {
  std::size_t n = 1;
  for (const std::int64_t d : shape) {
    if (d < 0) fail(Errc::internal, "tensor shape has negative dimension {}", d);
    const auto m = checked_mul(n, static_cast<std::size_t>(d));
    if (!m) fail(Errc::internal, "tensor shape of {} dimensions overflows the element count", shape.size());
    n = *m;
  }
  return n;
}

void Tensor::check_size() const {
  const auto bytes = checked_mul(numel(), dtype_size(dtype));
  if (!bytes || *bytes != data.size())
    fail(Errc::internal, "tensor of {} with {} elements holds {} bytes, expected {}", to_string(dtype), numel(),
         data.size(), bytes ? *bytes : 0);
}

void Tensor::expect_dtype(Dtype want) const {
  if (dtype != want) fail(Errc::invalid_argument, "tensor dtype is {}, expected {}", to_string(dtype), to_string(want));
}

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out;
  switch (dtype) {
    case Dtype::f32:
      append_converted<float>(data, out);
      break;
    case Dtype::f64:
      append_converted<double>(data, out);
      break;
    case Dtype::bf16:
      append_converted<Bf16>(data, out);
      break;
    case Dtype::f16: {
      out.resize(data.size() / 2);
      for (std::size_t i = 0; i < out.size(); ++i) {
        std::uint16_t h;
        std::memcpy(&h, data.data() + 2 * i, 2);
        out[i] = f16_to_float(h);
      }
      break;
    }
    default:
      fail(Errc::invalid_argument, "cannot convert a {} tensor to F32 (F32, F64, BF16 or F16 only)", to_string(dtype));
  }
  return out;
}

// ---- SafeTensors --------------------------------------------------------------

namespace {

// The header of a file of `total` bytes, every check made (length, JSON, entries, exact cover;
// every size against `total`), its tensors' data not yet filled. `bytes` holds at least the
// 8-byte length and the header, so a file is checked before any of its data is read.
struct Header {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Entry> entries;
  std::uint64_t data_begin = 0;  // 8 + the header's length
};
Header parse_header(std::span<const std::byte> bytes, std::uint64_t total, std::string_view name) {
  if (total < 8)
    fail(Errc::invalid_argument, "{}: file of {} bytes is too short for the 8-byte header length{}", name, total,
         total == 0 ? " (empty, or a file whose size its file system does not give, as /proc's)" : "");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  const std::uint64_t rest = total - 8;
  if (header_len > rest)
    fail(Errc::invalid_argument,
         "{}: header length {} is larger than the {} bytes after it (is it a safetensors file? one starts with its "
         "header's length as 8 little-endian bytes)",
         name, header_len, rest);
  if (header_len > kMaxHeaderBytes)
    fail(Errc::invalid_argument, "{}: header length {} exceeds the limit of {} bytes", name, header_len,
         kMaxHeaderBytes);

  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
  const Json header = parse_header_json(text, name);
  if (!header.is_object())
    fail(Errc::invalid_argument, "{}: header is a json {}, not an object", name, header.type_name());

  const std::uint64_t data_size = rest - header_len;
  Header out;
  out.data_begin = 8 + header_len;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      out.metadata = parse_metadata(value, name);
    } else {
      out.entries.emplace(key, parse_entry(key, value, data_size, name));
    }
  }
  check_exact_cover(out.entries, data_size, name);
  return out;
}

// The header's tensors filled from `bytes` (the whole file, or at least its header and data).
SafeTensors fill(Header header, std::span<const std::byte> bytes) {
  SafeTensors out;
  out.metadata = std::move(header.metadata);
  const auto data = bytes.subspan(header.data_begin);
  for (auto& [key, e] : header.entries) {
    const auto src = data.subspan(e.begin, e.end - e.begin);
    e.tensor.data.assign(src.begin(), src.end());
    out.tensors.emplace(key, std::move(e.tensor));
  }
  return out;
}

// Physical memory, in bytes (0 when the host does not say).
std::uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
}

}  // namespace

namespace {

// An open file whose 8-byte length and header have been read and checked (read_header); nothing
// after them read yet.
struct OpenedFile {
  std::ifstream in;
  std::string name;
  std::uint64_t total = 0;
  std::vector<std::byte> bytes;  // what has been read, from the file's start
  Header header;

  // The file's bytes up to `n` (from where `bytes` ends).
  void read_up_to(std::uint64_t n) {
    const std::size_t have = bytes.size();
    try {
      bytes.resize(static_cast<std::size_t>(n));
    } catch (const std::bad_alloc&) {
      fail(Errc::out_of_memory, "{}: cannot hold {} bytes of the file in memory", name, n);
    }
    if (!in.read(reinterpret_cast<char*>(bytes.data() + have), static_cast<std::streamsize>(n - have)))
      fail(Errc::invalid_argument, "cannot read {}", name);
  }
};

// The length and the header first, checked whole (its tensors must cover the data section
// exactly), and only then any data: the file's size bounds nothing (a sparse file of a terabyte
// behind a small header is refused unread), and neither does a tensor's (a case file whose header
// the caller refuses is refused unread).
OpenedFile open_checked(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found)
    fail(Errc::not_found, "safetensors file {} does not exist{}", path.string(), relative_note(path));
  if (ec) fail(Errc::invalid_argument, "cannot stat {}: {}", path.string(), ec.message());
  if (!std::filesystem::is_regular_file(status))
    fail(Errc::invalid_argument, "{} is not a regular file", path.string());
  OpenedFile f;
  f.name = path.string();
  errno = 0;
  f.in.open(path, std::ios::binary);
  if (!f.in)
    fail(Errc::invalid_argument, "cannot open {}{}", f.name,
         errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : "");
  f.in.seekg(0, std::ios::end);
  const std::streamoff size = f.in.tellg();
  f.in.seekg(0, std::ios::beg);
  if (size < 0) fail(Errc::invalid_argument, "cannot determine the size of {}", f.name);
  f.total = static_cast<std::uint64_t>(size);
  f.read_up_to(std::min<std::uint64_t>(f.total, 8));
  if (f.total >= 8) {
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<std::uint64_t>(f.bytes[i]);
    if (header_len <= std::min(f.total - 8, kMaxHeaderBytes))  // else parse_header says which limit it breaks
      f.read_up_to(8 + header_len);
  }
  f.header = parse_header(f.bytes, f.total, f.name);
  return f;
}

// `bytes` of tensors to be read from a file for `use`, within the host's memory. The bytes, then
// the tensors' copies of them: twice the data; a case run on the emulator then holds the tensors
// and, for each device byte, the byte and its written mark: three times; a model case's replay its
// tensors as FP32 and BF16 beside them and the caches: about six times (measured, forty-fourth
// session: 282 MB for a 46 MB file, 1.38 GB for 230 MB). Past the host's memory an allocation may
// still succeed (overcommit) and the process be killed as it fills it.
void check_host_memory(std::string_view name, std::uint64_t bytes, SafeTensors::Use use) {
  const std::uint64_t host = host_memory_bytes();
  const bool model = use == SafeTensors::Use::model_case;
  if (host != 0 && bytes > host / (model ? 8 : 4))
    fail(Errc::out_of_memory,
         "{}: its tensors hold {} bytes, more than {} of this host's {} bytes of memory (reading them takes twice "
         "that, {})",
         name, bytes, model ? "an eighth" : "a quarter", host,
         model ? "a replay about six times" : "a case run on the emulator three times");
}

}  // namespace

SafeTensors SafeTensors::read(const std::filesystem::path& path, Use use) {
  OpenedFile f = open_checked(path);
  check_host_memory(f.name, f.total - f.header.data_begin, use);  // all of it the tensors' (exact cover)
  f.read_up_to(f.total);
  try {
    return fill(std::move(f.header), f.bytes);
  } catch (const std::bad_alloc&) {  // the tensors' copies of the bytes
    fail(Errc::out_of_memory, "{}: cannot hold its {} bytes of tensors in memory", f.name, f.bytes.size());
  }
}

SafeTensors SafeTensors::read_header(const std::filesystem::path& path, const TensorFilter& with_data) {
  OpenedFile f = open_checked(path);
  SafeTensors out;
  out.metadata = std::move(f.header.metadata);
  std::uint64_t picked = 0;
  for (const auto& [key, e] : f.header.entries)
    if (with_data && with_data(key)) picked += e.end - e.begin;
  check_host_memory(f.name, picked, Use::kernel_case);
  for (auto& [key, e] : f.header.entries) {
    if (with_data && with_data(key) && e.end > e.begin) {
      e.tensor.data.resize(e.end - e.begin);
      f.in.seekg(static_cast<std::streamoff>(f.header.data_begin + e.begin));
      if (!f.in.read(reinterpret_cast<char*>(e.tensor.data.data()), static_cast<std::streamsize>(e.end - e.begin)))
        fail(Errc::invalid_argument, "cannot read {}", f.name);
    }
    out.tensors.emplace(key, std::move(e.tensor));
  }
  return out;
}

SafeTensors SafeTensors::parse(std::span<const std::byte> bytes, std::string_view name) {
  return fill(parse_header(bytes, bytes.size(), name), bytes);
}

std::vector<std::byte> SafeTensors::serialize() const {
  Json header = Json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    if (key == kMetadataKey) fail(Errc::invalid_argument, "a tensor cannot be named {}", kMetadataKey);
    t.check_size();
    header[key] = {{"dtype", std::string(to_string(t.dtype))},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - (text.size() % 8)) % 8, ' ');

  std::vector<std::byte> out;
  out.reserve(8 + text.size() + offset);
  const std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((len >> (8 * i)) & 0xFFu));
  for (const char c : text) out.push_back(static_cast<std::byte>(c));
  for (const auto& [key, t] : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

void SafeTensors::write(const std::filesystem::path& path) const { write_file(path, serialize()); }

bool SafeTensors::write_new(const std::filesystem::path& path) const {
  return StagedFile(path, serialize()).commit_new();
}

const Tensor& SafeTensors::at(std::string_view name) const {
  const auto it = tensors.find(std::string(name));
  if (it == tensors.end()) fail(Errc::not_found, "no tensor named '{}'", excerpt(name));
  return it->second;
}

const std::string& SafeTensors::meta(std::string_view key) const {
  const auto it = metadata.find(std::string(key));
  if (it == metadata.end()) fail(Errc::not_found, "no metadata key '{}'", excerpt(key));
  return it->second;
}

double SafeTensors::meta_f64(std::string_view key) const {
  const std::string& s = meta(key);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v))
    fail(Errc::invalid_argument, "metadata '{}' = '{}' is not a finite number", excerpt(key), excerpt(s));
  return v;
}

std::int64_t SafeTensors::meta_i64(std::string_view key) const {
  const std::string& s = meta(key);
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
    fail(Errc::invalid_argument, "metadata '{}' = '{}' is not a 64-bit integer", excerpt(key), excerpt(s));
  return v;
}

}  // namespace metrale
