// The safetensors reader and writer: round trips, the golden files, and one
// test per malformed-input rule. Fixtures are built byte by byte here, with
// header JSON written by hand, so the reader is checked against files its own
// writer did not produce.
#include <catch2/catch.hpp>
#include <rapidcheck/catch.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "metrale/files.hpp"
#include "metrale/safetensors.hpp"
#include "support.hpp"

namespace {

using metrale::Dtype;
using metrale::Errc;
using metrale::SafeTensors;
using metrale::Tensor;
using metrale::test::require_error;

constexpr std::string_view kName = "fixture.safetensors";

// A file: 8-byte little-endian length (or `len_override`), `header`, then
// `data_len` bytes 0, 1, 2, ….
std::vector<std::byte> file_bytes(std::string_view header, std::size_t data_len,
                                  std::optional<std::uint64_t> len_override = std::nullopt) {
  const std::uint64_t len = len_override.value_or(header.size());
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((len >> (8 * i)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  for (std::size_t i = 0; i < data_len; ++i) out.push_back(static_cast<std::byte>(i & 0xFF));
  return out;
}

SafeTensors parse(const std::vector<std::byte>& bytes) { return SafeTensors::parse(bytes, kName); }

// Must be rejected as invalid_argument naming the fixture and each needle.
void require_malformed(std::string_view header, std::size_t data_len, std::initializer_list<std::string> needles) {
  INFO("header: " << header);
  const auto bytes = file_bytes(header, data_len);
  std::vector<std::string> all(needles);
  all.emplace_back(kName);
  try {
    parse(bytes);
  } catch (const metrale::Error& e) {
    INFO("error: " << e.what());
    CHECK(metrale::to_string(e.code()) == "invalid_argument");
    for (const auto& n : all) CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains(n));
    return;
  }
  FAIL("no metrale::Error was thrown");
}

// A scratch path removed at scope exit.
struct TempPath {
  std::filesystem::path path;
  TempPath() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("metrale_st_" + std::to_string(rd()) + ".safetensors");
  }
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

// A scratch folder removed at scope exit, with what the staged-file tests read of it.
struct TempFolder {
  std::filesystem::path dir;
  explicit TempFolder(const std::string& prefix)
      : dir(std::filesystem::temp_directory_path() / (prefix + std::to_string(std::random_device{}()))) {
    std::filesystem::create_directories(dir);
  }
  ~TempFolder() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  static std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The folder's entries, files and folders alike.
  std::ptrdiff_t entries() const {
    return std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{});
  }
};

template <class T>
Tensor make(std::vector<std::int64_t> shape, const std::vector<T>& v) {
  return Tensor::from<T>(std::move(shape), std::span<const T>(v));
}

Tensor raw(Dtype dtype, std::vector<std::int64_t> shape, const std::vector<std::uint8_t>& bytes) {
  Tensor t{dtype, std::move(shape), {}};
  for (auto b : bytes) t.data.push_back(static_cast<std::byte>(b));
  t.check_size();
  return t;
}

void require_same(const SafeTensors& a, const SafeTensors& b) {
  CHECK(a.metadata == b.metadata);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    INFO("tensor " << name);
    REQUIRE(b.has(name));
    const Tensor& u = b.at(name);
    CHECK(t.dtype == u.dtype);
    CHECK(t.shape == u.shape);
    CHECK(t.data == u.data);
  }
}

SafeTensors sample() {
  SafeTensors st;
  st.metadata = {{"heads", "16"}, {"rope_theta", "10000.0"}, {"note", "utf-8 \xE2\x9C\x93 and \"quotes\""}};
  st.tensors["b_f32"] = make<float>({2, 3}, {1.5f, -2.0f, 0.0f, -0.0f, 1e-40f, 3.25f});
  st.tensors["a_bf16"] = make<metrale::Bf16>({4}, {{0x3F80}, {0xC000}, {0x7F80}, {0x0001}});
  st.tensors["c_u8"] = make<std::uint8_t>({5}, {0, 1, 127, 128, 255});
  st.tensors["d_i64"] = make<std::int64_t>({2}, {-1, INT64_MAX});
  st.tensors["e_f64"] = make<double>({1, 1, 3}, {0.1, -1e300, 2.0});
  st.tensors["f_f16"] = raw(Dtype::f16, {2}, {0x00, 0x3C, 0x00, 0xC0});  // 1.0, -2.0
  st.tensors["g_scalar"] = make<std::int32_t>({}, {42});
  st.tensors["h_empty"] = make<float>({0, 4}, {});
  st.tensors["i_fp8"] = raw(Dtype::f8_e4m3, {3}, {0x38, 0x7E, 0x7F});
  st.tensors["j_bool"] = raw(Dtype::boolean, {2}, {0, 1});
  return st;
}

}  // namespace

// ---- round trips ----------------------------------------------------------------

TEST_CASE("safetensors round trip through a file", "[safetensors]") {
  const SafeTensors st = sample();
  TempPath tmp;
  st.write(tmp.path);
  const SafeTensors back = SafeTensors::read(tmp.path);
  require_same(st, back);
  CHECK(back.meta_i64("heads") == 16);
  CHECK(back.meta_f64("rope_theta") == 10000.0);
  CHECK(back.at("g_scalar").numel() == 1);
  CHECK(back.at("h_empty").numel() == 0);
  CHECK(back.at("d_i64").values<std::int64_t>() == std::vector<std::int64_t>{-1, INT64_MAX});
}

TEST_CASE("safetensors serialize layout", "[safetensors]") {
  const SafeTensors st = sample();
  const auto bytes = st.serialize();
  REQUIRE(bytes.size() >= 8);
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  CHECK(len % 8 == 0);
  REQUIRE(8 + len <= bytes.size());
  const std::string header(reinterpret_cast<const char*>(bytes.data() + 8), len);
  // Padding is spaces after the JSON.
  const auto close = header.find_last_of('}');
  REQUIRE(close != std::string::npos);
  CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);

  // The header read with nlohmann directly: tensors packed in name order.
  const auto j = nlohmann::json::parse(header);
  CHECK(j.at("__metadata__").at("heads") == "16");
  std::uint64_t offset = 0;
  for (const auto& [name, t] : st.tensors) {
    INFO("tensor " << name);
    const auto& e = j.at(name);
    CHECK(e.at("dtype") == std::string(metrale::to_string(t.dtype)));
    CHECK(e.at("shape").get<std::vector<std::int64_t>>() == t.shape);
    CHECK(e.at("data_offsets").at(0).get<std::uint64_t>() == offset);
    CHECK(e.at("data_offsets").at(1).get<std::uint64_t>() == offset + t.data.size());
    CHECK(std::equal(t.data.begin(), t.data.end(), bytes.begin() + static_cast<std::ptrdiff_t>(8 + len + offset)));
    offset += t.data.size();
  }
  CHECK(bytes.size() == 8 + len + offset);
  require_same(st, SafeTensors::parse(bytes, "memory"));
}

TEST_CASE("safetensors reads a hand-built file", "[safetensors]") {
  // Offsets deliberately unaligned and out of name order, trailing spaces, and
  // an entry with extra whitespace in the JSON.
  const std::string header =
      R"({"z": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},)"
      R"( "a": {"dtype":"F16","shape":[1,2],"data_offsets":[3,7]},)"
      R"( "__metadata__": {"k": "v"}}   )";
  auto bytes = file_bytes(header, 7);
  // a = F16 [1, 0x3C00 → 1.0] written at 3..7: little-endian 00 3C 00 BC.
  bytes[8 + header.size() + 3] = std::byte{0x00};
  bytes[8 + header.size() + 4] = std::byte{0x3C};
  bytes[8 + header.size() + 5] = std::byte{0x00};
  bytes[8 + header.size() + 6] = std::byte{0xBC};
  const SafeTensors st = parse(bytes);
  CHECK(st.meta("k") == "v");
  CHECK(st.at("z").dtype == Dtype::u8);
  CHECK(st.at("z").values<std::uint8_t>() == std::vector<std::uint8_t>{0, 1, 2});
  CHECK(st.at("a").shape == std::vector<std::int64_t>{1, 2});
  CHECK(st.at("a").to_f32() == std::vector<float>{1.0f, -1.0f});
}

TEST_CASE("safetensors to_f32 converts f32, f64, bf16 and f16", "[safetensors]") {
  CHECK(make<float>({2}, {1.5f, -0.25f}).to_f32() == std::vector<float>{1.5f, -0.25f});
  CHECK(make<double>({3}, {0.5, -3.0, 1e300}).to_f32() ==
        std::vector<float>{0.5f, -3.0f, std::numeric_limits<float>::infinity()});
  CHECK(make<metrale::Bf16>({2}, {{0x3F80}, {0xC040}}).to_f32() == std::vector<float>{1.0f, -3.0f});

  // F16 bit patterns and their values, from the IEEE binary16 definition.
  struct Case {
    std::uint16_t h;
    float f;
  };
  const Case cases[] = {
      {0x3C00, 1.0f},          {0xC000, -2.0f},           {0x7BFF, 65504.0f},
      {0x0001, 0x1p-24f},      {0x03FF, 1023 * 0x1p-24f}, {0x0400, 0x1p-14f},
      {0x3555, 0x1.554p-2f},   {0x0000, 0.0f},            {0x7C00, std::numeric_limits<float>::infinity()},
      {0xFC00, -std::numeric_limits<float>::infinity()},
  };
  std::vector<std::uint8_t> bytes;
  for (const auto& c : cases) {
    bytes.push_back(static_cast<std::uint8_t>(c.h & 0xFF));
    bytes.push_back(static_cast<std::uint8_t>(c.h >> 8));
  }
  const auto n = static_cast<std::int64_t>(std::size(cases));
  const auto got = raw(Dtype::f16, {n}, bytes).to_f32();
  REQUIRE(got.size() == std::size(cases));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("f16 0x" << std::hex << cases[i].h);
    CHECK(got[i] == cases[i].f);
  }
  const auto special = raw(Dtype::f16, {3}, {0x00, 0x80, 0x00, 0x7E, 0x01, 0xFC}).to_f32();
  CHECK(std::signbit(special[0]));
  CHECK(special[0] == 0.0f);
  CHECK(std::isnan(special[1]));
  CHECK(std::isnan(special[2]));

  require_error([] { (void)make<std::int32_t>({1}, {7}).to_f32(); }, Errc::invalid_argument, {"I32"});
  require_error([] { (void)raw(Dtype::u8, {1}, {7}).to_f32(); }, Errc::invalid_argument, {"U8"});
}

TEST_CASE("safetensors lookups and metadata parsing", "[safetensors]") {
  SafeTensors st;
  st.metadata = {{"heads", "16"},     {"theta", "10000.0"}, {"neg", "-3"},  {"word", "abc"},
                 {"trail", "16x"},    {"space", " 16"},     {"empty", ""},  {"huge", "1e400"},
                 {"big", "99999999999999999999"}, {"inf", "inf"}};
  st.tensors["t"] = make<std::uint8_t>({1}, {1});
  CHECK(st.meta_i64("heads") == 16);
  CHECK(st.meta_i64("neg") == -3);
  CHECK(st.meta_f64("theta") == 10000.0);
  CHECK(st.meta_f64("heads") == 16.0);
  for (const char* key : {"word", "trail", "space", "empty", "huge", "inf"}) {
    INFO("key " << key);
    require_error([&] { (void)st.meta_f64(key); }, Errc::invalid_argument, {key, "'" + st.meta(key) + "'"});
  }
  for (const char* key : {"theta", "word", "trail", "space", "empty", "big"}) {
    INFO("key " << key);
    require_error([&] { (void)st.meta_i64(key); }, Errc::invalid_argument, {key, "'" + st.meta(key) + "'"});
  }
  require_error([&] { (void)st.meta("nope"); }, Errc::not_found, {"nope"});
  require_error([&] { (void)st.meta_f64("nope"); }, Errc::not_found, {"nope"});
  require_error([&] { (void)st.at("missing_tensor"); }, Errc::not_found, {"missing_tensor"});
  CHECK(st.has("t"));
  CHECK_FALSE(st.has("missing_tensor"));
  require_error([&] { (void)st.at("t").values<float>(); }, Errc::invalid_argument, {"U8", "F32"});
}

TEST_CASE("safetensors tensor construction checks its size", "[safetensors]") {
  const std::vector<float> three{1, 2, 3};
  require_error([&] { (void)Tensor::from<float>({2, 2}, std::span<const float>(three)); }, Errc::internal, {"3"});
  Tensor bad{Dtype::f32, {-1}, {}};
  require_error([&] { (void)bad.numel(); }, Errc::internal, {"-1"});
  SafeTensors st;
  st.tensors["__metadata__"] = make<float>({1}, {1});
  require_error([&] { (void)st.serialize(); }, Errc::invalid_argument, {"__metadata__"});
}

// ---- golden files -----------------------------------------------------------------

TEST_CASE("safetensors reads the golden model cases", "[safetensors][golden]") {
  const auto h16 = metrale::test::golden("dsv3_h16_t37.safetensors");
  if (std::filesystem::exists(h16)) {
    const SafeTensors st = SafeTensors::read(h16);
    CHECK(st.meta_i64("heads") == 16);
    CHECK(st.meta_i64("tokens") == 37);
    CHECK(st.meta_i64("position") == 36);
    CHECK(st.meta_f64("rope_theta") == 10000.0);
    CHECK(st.meta_f64("softmax_scale") == Approx(1.0 / std::sqrt(192.0)).epsilon(1e-15));
    CHECK(st.meta("rope") == "pairs(2i,2i+1)");
    CHECK(st.at("q_nope").shape == std::vector<std::int64_t>{16, 128});
    CHECK(st.at("kv_latent").shape == std::vector<std::int64_t>{37, 512});
    CHECK(st.at("q_absorbed").shape == std::vector<std::int64_t>{16, 576});
    CHECK(st.at("w_uk").shape == std::vector<std::int64_t>{16, 128, 512});
    CHECK(st.at("w_uk").dtype == Dtype::bf16);
    CHECK(st.at("attn_out").dtype == Dtype::f32);
    const auto w = st.at("w_uk").to_f32();
    CHECK(w.size() == 16u * 128 * 512);
    CHECK(std::all_of(w.begin(), w.end(), [](float v) { return std::isfinite(v); }));
  } else {
    WARN("golden " << h16 << " not found; dsv3_h16_t37 checks skipped");
  }

  // Shipped in cases/golden, so this one always runs.
  const SafeTensors st = SafeTensors::read(metrale::test::golden("dsv3_h8_t300_theta50k.safetensors"));
  CHECK(st.meta_i64("heads") == 8);
  CHECK(st.meta_i64("tokens") == 300);
  CHECK(st.meta_f64("rope_theta") == 50000.0);
  CHECK(st.at("kv_latent").shape == std::vector<std::int64_t>{300, 512});
  CHECK(st.at("w_uv").shape == std::vector<std::int64_t>{8, 128, 512});
  CHECK(st.at("o_latent").values<float>().size() == 8u * 512);
}

TEST_CASE("safetensors reads the golden codec tables (unaligned offsets)", "[safetensors][golden]") {
  const SafeTensors st = SafeTensors::read(metrale::test::golden("quant_codecs.safetensors"));
  CHECK(st.at("fp8_e4m3fn_decode").shape == std::vector<std::int64_t>{256});
  CHECK(st.at("fp4_e2m1_decode").shape == std::vector<std::int64_t>{16});
  CHECK(st.at("fp8_encode_out").dtype == Dtype::u8);
  CHECK(st.at("fp8_encode_in").numel() == st.at("fp8_encode_out").numel());
  CHECK(st.at("fp4_encode_in").numel() == st.at("fp4_encode_out").numel());
  CHECK(st.metadata.count("source") == 1);
}

// ---- malformed input ----------------------------------------------------------------

TEST_CASE("safetensors rejects a file too short or truncated", "[safetensors][malformed]") {
  for (std::size_t n : {0, 1, 7}) {
    INFO("size " << n);
    std::vector<std::byte> bytes(n, std::byte{0});
    require_error([&] { parse(bytes); }, Errc::invalid_argument, {std::string(kName), "too short"});
  }
  const std::string header = R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  auto bytes = file_bytes(header, 16);
  CHECK_NOTHROW(parse(bytes));
  // Cut inside the data: the offsets now reach past it.
  bytes.resize(8 + header.size() + 10);
  require_error([&] { parse(bytes); }, Errc::invalid_argument, {std::string(kName), "'t'", "outside the data section"});
  // Cut inside the header.
  bytes.resize(8 + header.size() / 2);
  require_error([&] { parse(bytes); }, Errc::invalid_argument, {std::string(kName), "header length", "larger"});
}

TEST_CASE("safetensors rejects a header length beyond the file or the limit", "[safetensors][malformed]") {
  const std::string header = R"({})";
  require_error([&] { parse(file_bytes(header, 0, 3)); }, Errc::invalid_argument, {"header length 3", "larger"});
  require_error([&] { parse(file_bytes(header, 0, ~std::uint64_t{0})); }, Errc::invalid_argument,
                {"header length 18446744073709551615"});
  // Over 100 MiB, within the file.
  const std::uint64_t over = (100ull << 20) + 8;
  std::vector<std::byte> big(8 + over, std::byte{' '});
  for (int i = 0; i < 8; ++i) big[static_cast<std::size_t>(i)] = static_cast<std::byte>((over >> (8 * i)) & 0xFF);
  require_error([&] { parse(big); }, Errc::invalid_argument, {"header length", "limit"});
}

TEST_CASE("safetensors rejects bad json", "[safetensors][malformed]") {
  require_malformed(R"({"t": )", 0, {"not valid json"});
  require_malformed("", 0, {"not valid json"});
  require_malformed("{\"t\xFF\": 1}", 0, {"not valid json"});  // invalid UTF-8
  require_malformed(R"([1, 2])", 0, {"not an object"});
  require_malformed(R"("text")", 0, {"not an object"});
  require_malformed(R"(7)", 0, {"not an object"});
  require_malformed(R"({"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})",
                    1, {"'a'", "twice"});
  require_malformed(R"({"m":)" + std::string(10000, '[') + std::string(10000, ']') + "}", 0, {"nests deeper"});
  // Before: a shape of 49 million zeros (a 98 MB header) took 2.3 GB and 25 s before its refusal.
  std::string zeros;
  for (int i = 0; i < 1'000'000; ++i) zeros += "0,";
  require_malformed(R"({"t": {"dtype": "U8", "data_offsets": [0, 0], "shape": [)" + zeros + "0]}}", 0,
                    {"header holds more than 1000000 json values (a tensor's entry needs about 8)"});
  // 1,000,001 dims and 7 more values (the header, the entry, dtype, the offsets and theirs, the
  // shape) above; 8 dims fewer is 1,000,000 values in all, which are parsed (and the entry's
  // next error, with its shape cut short, is reported).
  zeros.resize(zeros.size() - 2 * 8);
  require_malformed(R"({"t": {"dtype": "U8", "data_offsets": [0, 1], "shape": [)" + zeros + "0]}}", 1,
                    {"'t' data_offsets [0, 1] hold 1 bytes but shape [0,0,0,"});
  // Before: the parser stopped at a NUL (trailing garbage accepted) and skipped a byte-order mark.
  require_malformed(std::string("{}\0 this is garbage {{{", 24), 0, {"header holds a NUL byte at offset 2"});
  require_malformed("\xEF\xBB\xBF{}", 0, {"byte-order mark"});
}

TEST_CASE("safetensors rejects bad tensor entries", "[safetensors][malformed]") {
  require_malformed(R"({"t": [1]})", 0, {"'t'", "not an object"});
  require_malformed(R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"'t'", "no dtype"});
  require_malformed(R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"'t'", "no shape"});
  require_malformed(R"({"t": {"dtype": "F32", "shape": [1]}})", 4, {"'t'", "no data_offsets"});
  require_malformed(R"({"t": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}})", 1, {"'t'", "unknown dtype", "'F7'"});
  require_malformed(R"({"t": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4, {"unknown dtype", "'f32'"});
  require_malformed(R"({"t": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4, {"'t'", "dtype", "not a string"});
  require_malformed(R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, {"'t'", "[-1]", "non-negative"});
  require_malformed(R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4, {"'t'", "non-negative"});
  require_malformed(R"({"t": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4, {"'t'", "shape", "not an array"});
  require_malformed(R"({"t": {"dtype": "U8", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})", 0,
                    {"'t'", "overflows"});
  require_malformed(R"({"t": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0,
                    {"'t'", "overflows"});
  // a dimension past int64: named as too large, not as "not a non-negative integer" (adversarial
  // trial, forty-ninth session)
  require_malformed(R"({"t": {"dtype": "U8", "shape": [9223372036854775808], "data_offsets": [0, 0]}})", 0,
                    {"'t'", "a dimension 9223372036854775808 past 2^63 - 1"});
}

// A header's names and strings can be megabytes long; a message echoes their start only.
TEST_CASE("safetensors cuts long names and values short in its messages", "[safetensors][malformed]") {
  const std::string huge(1 << 20, 'n');
  const auto message_of = [](std::string_view header, std::size_t data_len) {
    try {
      parse(file_bytes(header, data_len));
    } catch (const metrale::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (
      const auto& [header, data_len, wanted] : std::vector<std::tuple<std::string, std::size_t, std::string>>{
          {R"({")" + huge + R"(": {"dtype": "F7", "shape": [1], "data_offsets": [0, 1]}})", 1, "unknown dtype"},
          {R"({"t": {"dtype": ")" + huge + R"(", "shape": [1], "data_offsets": [0, 1]}})", 1, "unknown dtype"},
          {R"({")" + huge +
               R"(": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
           2, "overlap"},
          {R"({"__metadata__": {")" + huge + R"(": 1}})", 0, "not a string"},
      }) {
    const std::string m = message_of(header, data_len);
    CHECK_THAT(m, Catch::Matchers::Contains(wanted));
    CHECK_THAT(m, Catch::Matchers::Contains("... (1048576 bytes)"));
    CHECK(m.size() < 400);
  }
  SafeTensors f;
  f.metadata["x"] = "1" + huge;
  const auto m = [&] {
    try {
      (void)f.meta_i64("x");
    } catch (const metrale::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  CHECK_THAT(m, Catch::Matchers::Contains("metadata 'x' = '1nnn"));
  CHECK(m.size() < 400);
}

TEST_CASE("safetensors rejects bad data offsets", "[safetensors][malformed]") {
  // Past the data.
  require_malformed(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
                    {"'t'", "[0, 8]", "outside the data section of 4 bytes"});
  require_malformed(R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [9, 9]}})", 4, {"'t'", "outside"});
  // begin > end.
  require_malformed(R"({"t": {"dtype": "U8", "shape": [0], "data_offsets": [3, 1]}})", 4, {"'t'", "[3, 1]"});
  // Shape and offsets disagree.
  require_malformed(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8,
                    {"'t'", "hold 4 bytes", "needs 8"});
  require_malformed(R"({"t": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 8,
                    {"'t'", "[2,3]", "BF16", "needs 12"});
  // Not a pair of non-negative integers.
  for (const char* off : {"[0]", "[0, 1, 2]", "[-1, 0]", "[0.0, 1]", "\"0,1\"", "[0, 18446744073709551616]"}) {
    require_malformed(std::string(R"({"t": {"dtype": "U8", "shape": [1], "data_offsets": )") + off + "}}", 4,
                      {"'t'", "data_offsets", "pair"});
  }
  // Two tensors sharing bytes.
  require_malformed(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                    R"( "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}})",
                    8, {"'a'", "'b'", "overlap"});
}

TEST_CASE("safetensors rejects bad metadata", "[safetensors][malformed]") {
  require_malformed(R"({"__metadata__": [1]})", 0, {"__metadata__", "not an object"});
  require_malformed(R"({"__metadata__": {"heads": 16}})", 0, {"__metadata__", "'heads'", "not a string"});
}

TEST_CASE("safetensors read errors name the path", "[safetensors][malformed]") {
  const auto missing = std::filesystem::temp_directory_path() / "metrale_no_such_file.safetensors";
  require_error([&] { (void)SafeTensors::read(missing); }, Errc::not_found, {missing.string()});
  const auto dir = std::filesystem::temp_directory_path();
  require_error([&] { (void)SafeTensors::read(dir); }, Errc::invalid_argument, {dir.string()});

  TempPath tmp;
  {
    std::ofstream out(tmp.path, std::ios::binary);
    out << "abc";
  }
  require_error([&] { (void)SafeTensors::read(tmp.path); }, Errc::invalid_argument, {tmp.path.string(), "too short"});

  const auto unwritable = std::filesystem::temp_directory_path() / "metrale_no_such_dir" / "x.safetensors";
  require_error([&] { sample().write(unwritable); }, Errc::invalid_argument, {unwritable.string()});
}

TEST_CASE("safetensors parse of a corrupted file throws only metrale::Error", "[safetensors][property]") {
  const auto good = sample().serialize();
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<std::uint64_t>(good[static_cast<std::size_t>(i)]);
  rc::prop("random byte edits and truncation", [&good, header_len] {
    auto bytes = good;
    // Most edits land in the length and the header, where the parsing is.
    const std::size_t reach = *rc::gen::element<std::size_t>(8, 8 + header_len, bytes.size());
    const auto edits = *rc::gen::inRange(1, 8);
    for (int i = 0; i < edits; ++i) {
      const auto at = *rc::gen::inRange<std::size_t>(0, reach);
      bytes[at] = static_cast<std::byte>(*rc::gen::arbitrary<std::uint8_t>());
    }
    bytes.resize(*rc::gen::inRange<std::size_t>(0, bytes.size() + 1));
    try {
      const SafeTensors st = SafeTensors::parse(bytes, "corrupt");
      for (const auto& [name, t] : st.tensors) t.check_size();  // whatever parsed is consistent
    } catch (const metrale::Error& e) {
      RC_ASSERT(e.code() == Errc::invalid_argument);
    }
  });
}

// The rename that puts a staged file in place needs only the folder's write permission: a file its
// user may not write is refused, as the shell's `>` refuses it (adversarial trial, forty-fifth
// session: `bench --json` and `conform --report`, run as nobody in a world-writable folder,
// replaced root's files). As root (CI), the write is tried by a child process that became nobody.
TEST_CASE("a staged write refuses a file its user may not write", "[safetensors][files]") {
  const TempFolder scratch("metrale_staged_perm_");
  const auto target = scratch.dir / "report.json";
  metrale::write_file(target, std::as_bytes(std::span(std::string_view("old"))));
  using std::filesystem::perms;
  std::filesystem::permissions(scratch.dir, perms::all);  // anyone may create files in the folder
  std::filesystem::permissions(target, perms::owner_read | perms::group_read | perms::others_read);
  // 0: refused with the reason; 1: refused otherwise; 2: written; 3: the user could not be
  // changed; 4: the folder is out of the user's reach (a temporary folder under one only root may
  // enter), so that a refusal would prove nothing.
  auto attempt = [&]() -> int {
    if (::faccessat(AT_FDCWD, scratch.dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) return 4;
    try {
      metrale::StagedFile(target, std::string_view("new")).commit();
      return 2;
    } catch (const metrale::Error& e) {
      const std::string what = e.what();
      return what.find("cannot write " + target.string()) != std::string::npos &&
                     what.find("Permission denied") != std::string::npos
                 ? 0
                 : 1;
    }
  };
  int outcome = 3;
  if (::geteuid() != 0) {
    outcome = attempt();
  } else {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) ::_exit(::setgid(65534) == 0 && ::setuid(65534) == 0 ? attempt() : 3);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    outcome = WEXITSTATUS(status);
  }
  if (outcome == 3 || outcome == 4) {  // nothing to test here: said, not failed
    WARN("not run: " << (outcome == 3 ? "could not become user 65534" : "the folder is out of the user's reach"));
    return;
  }
  CHECK(outcome == 0);
  CHECK(TempFolder::slurp(target) == "old");
  CHECK(scratch.entries() == 1);  // no staged file left behind
}

TEST_CASE("staged writes replace a file whole, or leave it and nothing else", "[safetensors][files]") {
  const TempFolder scratch("metrale_staged_");
  const auto& dir = scratch.dir;
  const auto slurp = &TempFolder::slurp;
  auto entries = [&] { return scratch.entries(); };
  const auto target = dir / "a.txt";
  metrale::write_file(target, std::as_bytes(std::span(std::string_view("old"))));
  CHECK(slurp(target) == "old");
  {
    metrale::StagedFile staged(target, std::string_view("new"));
    CHECK(slurp(target) == "old");  // nothing replaced before the commit
    CHECK(entries() == 2);
    CHECK_FALSE(staged.commit_new());  // a file is there: left as it was
    CHECK(slurp(target) == "old");
  }
  CHECK(entries() == 1);  // the uncommitted staged file removed
  // The file it replaces keeps its permissions (they had become the umask's: 0600 to 0644); 0604
  // is no umask's.
  using std::filesystem::perms;
  const perms odd = perms::owner_read | perms::owner_write | perms::others_read;
  std::filesystem::permissions(target, odd);
  metrale::StagedFile(target, std::string_view("new")).commit();
  CHECK(slurp(target) == "new");
  CHECK(std::filesystem::status(target).permissions() == odd);
  CHECK(metrale::StagedFile(dir / "b.txt", std::string_view("b")).commit_new());
  CHECK(slurp(dir / "b.txt") == "b");
  CHECK(entries() == 2);
  // A folder in the way: the check and the commit name the path; nothing is left behind.
  std::filesystem::create_directories(dir / "c.txt");
  require_error([&] { metrale::check_writable(dir / "c.txt"); }, Errc::invalid_argument,
                {"cannot write " + (dir / "c.txt").string(), "a folder is in the way"});
  require_error([&] { metrale::StagedFile(dir / "c.txt", std::string_view("c")).commit(); }, Errc::invalid_argument,
                {"cannot write " + (dir / "c.txt").string()});
  require_error([&] { metrale::check_writable(dir / "no" / "d.txt"); }, Errc::invalid_argument,
                {"cannot write " + (dir / "no" / "d.txt").string(), "No such file or directory"});
  CHECK(entries() == 3);
  // Before: the rename put a regular file where a symbolic link or a FIFO was (twentieth
  // session's adversarial run: `bench --json` and `conform --report` destroyed them).
  std::filesystem::create_symlink(dir / "b.txt", dir / "link.txt");
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  for (const auto& [name, kind] : {std::pair{"link.txt", "a symbolic link"}, std::pair{"fifo", "a FIFO"}}) {
    INFO(name);
    require_error([&] { metrale::check_writable(dir / name); }, Errc::invalid_argument,
                  {"cannot write " + (dir / name).string(), std::string(kind) + ", not a regular file"});
    require_error([&] { metrale::StagedFile(dir / name, std::string_view("x")).commit(); }, Errc::invalid_argument,
                  {std::string(kind)});
  }
  CHECK(std::filesystem::is_symlink(dir / "link.txt"));
  CHECK(std::filesystem::is_fifo(dir / "fifo"));
  CHECK(slurp(dir / "b.txt") == "b");
  CHECK(entries() == 5);  // nothing staged left behind
  // Before: a name of 250 bytes, which the file system takes, was refused ("File name too long")
  // because the staged name beside it added its suffix (twenty-first session's adversarial run).
  const auto long_name = dir / (std::string(245, 'a') + ".json");
  metrale::StagedFile(long_name, std::string_view("long")).commit();
  CHECK(slurp(long_name) == "long");
  CHECK(entries() == 6);
}

TEST_CASE("a signal removes the staged files not yet in place and ends the process by it", "[safetensors][files]") {
  // Before (adversarial trial, forty-second session): Ctrl-C during `--record` left a
  // `.part-<pid>-<n>` file beside the cases.
  const TempFolder scratch("metrale_signal_");
  const auto& dir = scratch.dir;
  for (const int sig : {SIGINT, SIGTERM, SIGQUIT}) {  // (SIGQUIT: the adversarial trial, forty-sixth session)
    INFO("signal " << sig);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // (no Catch2 in the child: its exit status says what happened)
      for (const int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        ::signal(s, SIG_DFL);      // as a program starts (not Catch2's)
      const rlimit no_core{0, 0};  // SIGQUIT's default action dumps core: none here
      ::setrlimit(RLIMIT_CORE, &no_core);
      metrale::remove_staged_files_on_signals();
      metrale::StagedFile kept(dir / "kept.txt", std::string_view("kept"));
      kept.commit();
      // Swapped into place by commit_all: its staged name now holds the old file, which the
      // signal leaves (commit_all's way back, were a later file to fail, needs it).
      metrale::write_file(dir / "swapped.txt", std::as_bytes(std::span(std::string_view("old"))));
      metrale::StagedFile swapped(dir / "swapped.txt", std::string_view("new"));
      metrale::StagedFile::commit_all({swapped});
      metrale::StagedFile staged(dir / "staged.txt", std::string_view("half"));
      ::raise(sig);
      std::_Exit(3);  // not reached where the signal ended it
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK((WIFSIGNALED(status) ? WTERMSIG(status) : -1) == sig);
    CHECK(TempFolder::slurp(dir / "kept.txt") == "kept");  // what was put in place stays
    CHECK(TempFolder::slurp(dir / "swapped.txt") == "new");
    CHECK_FALSE(std::filesystem::exists(dir / "staged.txt"));
    std::vector<std::string> left;  // beside them only the swapped file's old bytes, never the half-written one
    for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
    CHECK(left.size() == 3);
    for (const auto& name : left)
      if (name != "kept.txt" && name != "swapped.txt") {
        CHECK(name.starts_with("swapped.txt.part-"));
        CHECK(TempFolder::slurp(dir / name) == "old");
      }
    for (const auto& name : left) std::filesystem::remove(dir / name);
  }
}

TEST_CASE("staged files committed together change whole or not at all", "[safetensors][files]") {
  // Before: `conform --report` renamed report.json into place, then failed on report.md and left
  // the new json beside the old md (adversarial helper, thirty-ninth session).
  const TempFolder scratch("metrale_together_");
  const auto& dir = scratch.dir;
  const auto slurp = &TempFolder::slurp;
  auto entries = [&] { return scratch.entries(); };
  const auto a = dir / "a.json", b = dir / "b.md", c = dir / "c.txt";
  metrale::write_file(a, std::as_bytes(std::span(std::string_view("old a"))));
  {
    // b is new, c's rename fails (a folder with a file in it appears after staging): a and b are
    // as before, nothing staged is left.
    metrale::StagedFile sa(a, std::string_view("new a")), sb(b, std::string_view("new b")),
        sc(c, std::string_view("new c"));
    std::filesystem::create_directories(c);
    metrale::write_file(c / "in", std::as_bytes(std::span(std::string_view("x"))));
    require_error(
        [&] {
          metrale::StagedFile::commit_all({sa, sb, sc});
        },
        Errc::invalid_argument, {"cannot write " + c.string()});
    CHECK(slurp(a) == "old a");
    CHECK_FALSE(std::filesystem::exists(b));
  }
  CHECK(entries() == 2);  // a and the folder c
  std::filesystem::remove_all(c);
  {
    metrale::StagedFile sa(a, std::string_view("new a")), sb(b, std::string_view("new b"));
    metrale::StagedFile::commit_all({sa, sb});
    CHECK(slurp(a) == "new a");
    CHECK(slurp(b) == "new b");
  }
  CHECK(entries() == 2);  // the old a removed with its staged name
}
