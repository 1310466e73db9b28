// Bad input, from files and from the API: each gets a clear error naming the
// value (never a crash, a hang or a silent wrong answer), and nothing already
// stored changes. One test per fixed finding of the adversarial review.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <regex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrale/case_gen.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/dispatch.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/formats.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/model_case.hpp"
#include "metrale/paged_cache.hpp"
#include "metrale/reference.hpp"
#include "metrale/safetensors.hpp"
#include "support.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

using namespace metrale;
using metrale::test::require_error;

namespace {

// A file under the temp directory, removed at the end of the scope.
struct TempPath {
  std::filesystem::path path;
  explicit TempPath(const std::string& suffix) {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("metrale_bad_input_" + std::to_string(rd()) + suffix);
  }
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::vector<std::byte> header_only_file(const std::string& json) {
  std::vector<std::byte> out(8);
  const std::uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((len >> (8 * i)) & 0xFFu);
  for (const char c : json) out.push_back(static_cast<std::byte>(c));
  return out;
}

void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), std::fclose);
  REQUIRE(f);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size());
}

// A safetensors file's header as JSON, and its data section's bytes.
struct FileParts {
  nlohmann::json header;
  std::vector<std::byte> data;
};
FileParts read_parts(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string text(len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(len));
  FileParts parts{nlohmann::json::parse(text), std::vector<std::byte>(std::filesystem::file_size(path) - 8 - len)};
  in.read(reinterpret_cast<char*>(parts.data.data()), static_cast<std::streamsize>(parts.data.size()));
  REQUIRE(in);
  return parts;
}

// `header` (as header_only_file writes it), then `data`, at `path`, and `sparse` bytes more past
// them, which take no disk and no memory. False, with a warning, where the file system has no
// sparse files (the test is then skipped).
bool write_sparse(const std::filesystem::path& path, const nlohmann::json& header, std::span<const std::byte> data,
                  std::uint64_t sparse) {
  std::vector<std::byte> bytes = header_only_file(header.dump());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(path, bytes);
  std::error_code ec;
  std::filesystem::resize_file(path, bytes.size() + sparse, ec);
  if (ec) WARN("no sparse files here (" << ec.message() << "); test skipped");
  return !ec;
}

// Shell command `cmd`'s exit status, its standard output and error appended to `out`.
int run_command(const std::string& cmd, std::string& out) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((cmd + " 2>&1").c_str(), "r"), pclose);
  REQUIRE(pipe);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int status = pclose(pipe.release());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Run the CLI, stdout and stderr together, with `env` (NAME=value ...) before it; returns the
// exit status.
int run_cli(const std::string& args, std::string& out, const std::string& env = "") {
  return run_command(env + " " + std::string(METRALE_CLI) + " " + args, out);
}

SafeTensors recorded_decode_case() {
  return SafeTensors::read(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                           "dsv3_h8_t300_fp8_0606_mla_paged_decode_fp8.safetensors");
}

Tensor f64_tensor(std::vector<double> v) { return Tensor::from<double>({static_cast<std::int64_t>(v.size())}, v); }

// A small DeepSeek decoder over a small FP8 cache.
struct SmallDeepseek {
  static constexpr std::uint32_t kHeads = 2;
  static constexpr MlaDims kDims{16, 4, 8, 8};
  emu::EmulatorBackend gpu;
  PagedKvCache cache{gpu, [] {
                       PagedCacheConfig pc;
                       pc.num_blocks = 4;
                       pc.block_size = 2;
                       pc.kv_cache_dim = kDims.cache_dim();
                       return pc;
                     }()};
  std::vector<Bf16> w_uk = std::vector<Bf16>(kHeads * kDims.nope * kDims.kv_lora, Bf16::from_float(0.1f));
  std::vector<Bf16> w_uv = std::vector<Bf16>(kHeads * kDims.v_head * kDims.kv_lora, Bf16::from_float(0.1f));

  DeepseekMlaConfig config() const { return {kHeads, kDims, 0.25f, 10000.0f, true}; }
};

}  // namespace

// ---- safetensors ----------------------------------------------------------------------

TEST_CASE("bad input: a sparse terabyte file behind a small header is refused without allocating it",
          "[bad_input][safetensors]") {
  // Before: read() allocated the whole file (std::bad_alloc, a crash in the CLI); then it read
  // only the header's tensors and ignored the rest, which the format forbids (no holes).
  TempPath tmp(".safetensors");
  SafeTensors st;
  st.metadata["heads"] = "2";
  const std::vector<float> values{1.0f, -2.5f, 3.0f};
  st.tensors["x"] = Tensor::from<float>({3}, values);
  st.write(tmp.path);
  std::error_code ec;
  std::filesystem::resize_file(tmp.path, std::uint64_t{1} << 40, ec);  // sparse: no disk, no memory
  if (ec) {
    WARN("no sparse files here (" << ec.message() << "); test skipped");
    return;
  }
  const std::uint64_t head = st.serialize().size() - 12;  // the length field and the header
  require_error([&] { (void)SafeTensors::read(tmp.path); }, Errc::invalid_argument,
                {fmt::format("the data section has {} bytes, its tensors cover 12", (std::uint64_t{1} << 40) - head)});
}

TEST_CASE("bad input: a safetensors file of more than a quarter of the host's memory is refused before reading",
          "[bad_input][safetensors]") {
  // Before: read() took the bytes and then the tensors' copies; past the host's memory the
  // allocations succeeded (overcommit) and the process was killed filling them. At half the
  // host's memory, a case run on the emulator (the tensors, each device byte and its written
  // mark: three times) was killed the same way; a replay (about six times: adversarial trial,
  // forty-fourth session) at a quarter, so a model case stops at an eighth.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  REQUIRE(pages > 0);
  const std::uint64_t host = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  const std::uint64_t n = host / 4 + 64;  // one U8 tensor of n bytes
  std::string header = fmt::format(R"({{"x":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}})", n, n);
  header.append((8 - header.size() % 8) % 8, ' ');
  TempPath tmp(".safetensors");
  {
    std::ofstream out(tmp.path, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
    out << header;
  }
  std::error_code ec;
  std::filesystem::resize_file(tmp.path, 8 + header.size() + n, ec);  // sparse: no disk, no memory
  if (ec) {
    WARN("no sparse files here (" << ec.message() << "); test skipped");
    return;
  }
  require_error(
      [&] { (void)SafeTensors::read(tmp.path); }, Errc::out_of_memory,
      {fmt::format("its tensors hold {} bytes, more than a quarter of this host's {} bytes of memory", n, host)});
  // A model case (its replay holds about six times its file) at an eighth.
  std::filesystem::resize_file(tmp.path, 0);
  const std::uint64_t m = host / 8 + 64;
  std::string small = fmt::format(R"({{"x":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}})", m, m);
  small.append((8 - small.size() % 8) % 8, ' ');
  {
    std::ofstream out(tmp.path, std::ios::binary);
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((small.size() >> (8 * i)) & 0xFF));
    out << small;
  }
  std::filesystem::resize_file(tmp.path, 8 + small.size() + m, ec);
  REQUIRE(!ec);
  require_error(
      [&] { (void)SafeTensors::read(tmp.path, SafeTensors::Use::model_case); }, Errc::out_of_memory,
      {fmt::format("its tensors hold {} bytes, more than an eighth of this host's {} bytes of memory", m, host),
       "a replay about six times"});
}

TEST_CASE("bad input: safetensors data no tensor covers is refused", "[bad_input][safetensors]") {
  SafeTensors st;
  st.tensors["a"] = Tensor::from<float>({2}, std::vector<float>{1.0f, 2.0f});
  st.tensors["b"] = Tensor::from<float>({1}, std::vector<float>{3.0f});
  std::vector<std::byte> bytes = st.serialize();
  REQUIRE_NOTHROW(SafeTensors::parse(bytes, "f"));
  // A byte after the last tensor (a header length one short reads so: the shifted JSON's last
  // padding space becomes data).
  bytes.push_back(std::byte{0});
  require_error([&] { (void)SafeTensors::parse(bytes, "f"); }, Errc::invalid_argument,
                {"the data section has 13 bytes, its tensors cover 12"});
  // A gap between two tensors.
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})";
  std::vector<std::byte> gap = header_only_file(header);
  gap.insert(gap.end(), 4, std::byte{7});
  require_error([&] { (void)SafeTensors::parse(gap, "f"); }, Errc::invalid_argument,
                {"bytes [2, 3) of the data section belong to no tensor (before 'b')"});
}

TEST_CASE("bad input: a header whose data lies past a sparse file's end is refused before reading data",
          "[bad_input][safetensors]") {
  TempPath tmp(".safetensors");
  const std::uint64_t two_tib = std::uint64_t{1} << 41;
  write_bytes(tmp.path, header_only_file(
                            fmt::format(R"({{"t":{{"dtype":"U8","shape":[{0}],"data_offsets":[0,{0}]}}}})", two_tib)));
  std::error_code ec;
  std::filesystem::resize_file(tmp.path, std::uint64_t{1} << 40, ec);
  if (ec) {
    WARN("no sparse files here (" << ec.message() << "); test skipped");
    return;
  }
  require_error([&] { (void)SafeTensors::read(tmp.path); }, Errc::invalid_argument,
                {tmp.path.string(), "'t'", fmt::format("[0, {}]", two_tib), "outside the data section"});
}

TEST_CASE("bad input: a kernel case file's header is checked before its data is read", "[bad_input][kernel_case]") {
  // Before: every tensor was read before the case's checks (adversarial trial, forty-ninth
  // session: a 3 GB tensor under a name that is no parameter took 11-24 s and 6.3 GB to refuse).
  // A terabyte of a sparse file now fails on its name, not on the host's memory.
  nlohmann::json header;
  header["__metadata__"] = recorded_decode_case().metadata;
  const std::uint64_t tib = std::uint64_t{1} << 40;
  header["bogus"] = {{"dtype", "U8"}, {"shape", {tib}}, {"data_offsets", {0, tib}}};
  TempPath tmp(".safetensors");
  if (!write_sparse(tmp.path, header, {}, tib)) return;
  require_error([&] { (void)read_kernel_case(tmp.path); }, Errc::invalid_argument,
                {tmp.path.string(), "tensor 'bogus' is not a pointer parameter of mla_paged_decode_fp8"});
  std::string out;  // and so through the CLI's case show
  CHECK(run_cli("case show " + tmp.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("tensor 'bogus' is not a pointer parameter"));
  // A header alone: dtypes and shapes, no data but the tensors picked (a case's tolerances).
  const SafeTensors whole = recorded_decode_case();
  const SafeTensors head_only =
      SafeTensors::read_header(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                                   "dsv3_h8_t300_fp8_0606_mla_paged_decode_fp8.safetensors",
                               [](const std::string& name) { return name.starts_with("tolerance."); });
  CHECK(head_only.metadata == whole.metadata);
  REQUIRE(head_only.tensors.size() == whole.tensors.size());
  std::size_t with_data = 0;
  for (const auto& [name, t] : head_only.tensors) {
    INFO(name);
    const Tensor& w = whole.at(name);
    CHECK(t.dtype == w.dtype);
    CHECK(t.shape == w.shape);
    if (name.starts_with("tolerance.")) {
      CHECK(t.data == w.data);
      ++with_data;
    } else {
      CHECK(t.data.empty());
    }
  }
  CHECK(with_data > 0);
  // The case from it: described as the whole file's is (case show reads the header alone).
  const auto file = std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                    "dsv3_h8_t300_fp8_0606_mla_paged_decode_fp8.safetensors";
  CHECK(describe_kernel_case(read_kernel_case_header(file)) == describe_kernel_case(read_kernel_case(file)));
}

TEST_CASE("bad input: conform and case show do not read the data of a case file they do not run",
          "[bad_input][kernel_case]") {
  // Before: every case file was read whole before --only picked (adversarial trial, fiftieth
  // session: --only rope_pairs read a 2.1 GB case file whole, 4.6 GB), and case show read the data
  // it does not show. A recorded GEMV case whose weight grows to a sparse terabyte: past the
  // host's memory, so reading it would fail.
  const auto recorded = std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                        "dsv3_h8_t300_fp8_0599_mla_batched_gemv.safetensors";
  FileParts parts = read_parts(recorded);
  const std::uint64_t weight_begin = parts.header["weight"]["data_offsets"][0];  // the last tensor
  REQUIRE(parts.header["weight"]["data_offsets"][1] == parts.data.size());
  const std::uint64_t tib = std::uint64_t{1} << 40;
  parts.header["weight"] = {
      {"dtype", "BF16"}, {"shape", {tib / 2}}, {"data_offsets", {weight_begin, weight_begin + tib}}};
  const auto dir = test::scratch_dir("metrale_big_case_test");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto file = dir / "big_gemv.safetensors";
  // (the tensors before the weight, as recorded)
  if (!write_sparse(file, parts.header, std::span(parts.data).first(weight_begin), tib)) return;
  std::string out;
  CHECK(run_cli("conform --backend emu --no-golden --only rope_pairs_bf16 --cases " + dir.string(), out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("PASS"));
  out.clear();
  CHECK(run_cli("case show " + file.string(), out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains(fmt::format("weight                 BF16 [{}], {} bytes", tib / 2, tib)));
  CHECK_THAT(out, Catch::Matchers::Contains("tolerance abs 2.125e-06, rel 0, ulps 1 (the case's)"));
  out.clear();  // picked, it is read, and the memory guard refuses it
  CHECK(run_cli("conform --backend emu --no-golden --only big_gemv --cases " + dir.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("more than a quarter of this host's"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("bad input: replay checks a model case's metadata and shapes before reading its data",
          "[bad_input][model_case]") {
  // Before: only q_nope and heads were looked for first (adversarial trial, fiftieth session: a
  // 2.5 GB file was read whole before "no metadata key 'kv_lora_rank'"). A golden case without
  // that key and with a sparse terabyte beside its tensors: past the memory guard, if it were read.
  const auto golden = test::golden("dsv3_h16_t37.safetensors");
  FileParts parts = read_parts(golden);
  nlohmann::json& header = parts.header;
  const std::uint64_t data = parts.data.size(), tib = std::uint64_t{1} << 40;
  header["__metadata__"].erase("kv_lora_rank");
  header["zz_junk"] = {{"dtype", "U8"}, {"shape", {tib}}, {"data_offsets", {data, data + tib}}};
  TempPath tmp(".safetensors");
  if (!write_sparse(tmp.path, header, parts.data, tib)) return;
  std::string out;
  CHECK(run_cli("replay --backend emu " + tmp.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no metadata key 'kv_lora_rank'"));
  CHECK_THAT(out, !Catch::Matchers::Contains("of this host's"));
  // and a shape: named from the header too
  header["__metadata__"]["kv_lora_rank"] = "512";
  header["kv_latent"]["shape"] = {1, header["kv_latent"]["shape"][0].get<std::uint64_t>() * 512};
  REQUIRE(write_sparse(tmp.path, header, parts.data, tib));
  out.clear();
  CHECK(run_cli("replay --backend emu " + tmp.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("tensor kv_latent has shape [1, "));
}

TEST_CASE("bad input: a key given twice in a nested header object is refused", "[bad_input][safetensors]") {
  // Before: only top-level duplicates were refused; the last metadata value or dtype silently won.
  SECTION("a metadata key") {
    const auto bytes = header_only_file(R"({"__metadata__":{"heads":"16","heads":"8"}})");
    require_error([&] { (void)SafeTensors::parse(bytes, "dup.safetensors"); }, Errc::invalid_argument,
                  {"dup.safetensors", "header has key 'heads' twice"});
  }
  SECTION("a field of a tensor entry") {
    const auto bytes = header_only_file(R"({"t":{"dtype":"F32","dtype":"U8","shape":[0],"data_offsets":[0,0]}})");
    require_error([&] { (void)SafeTensors::parse(bytes, "dup.safetensors"); }, Errc::invalid_argument,
                  {"dup.safetensors", "header has key 'dtype' twice"});
  }
  SECTION("the same key in two different objects is fine") {
    const auto bytes = header_only_file(
        R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})");
    const SafeTensors st = SafeTensors::parse(bytes, "ok.safetensors");
    CHECK(st.tensors.size() == 2);
  }
}

// ---- the case generator -----------------------------------------------------------------

// Before: SIGFPE (block_size, num_blocks or num_kv_heads 0), a null write (cache_store_case
// without slots), a bare std::out_of_range (too few seq_lens) and `internal` errors (35th
// session's adversarial run). The generator is a library API too: each is named.
TEST_CASE("bad input: the case generator refuses a spec it cannot build", "[bad_input][case_gen]") {
  gen::PagedSpec base;
  base.seq_lens = {5};
  REQUIRE_NOTHROW(gen::paged_decode_case(base));
  const std::vector<std::pair<std::function<void(gen::PagedSpec&)>, std::string>> bad{
      {[](gen::PagedSpec& p) { p.block_size = 0; }, "block_size 0, num_blocks 8 and max_blocks_per_seq 4"},
      {[](gen::PagedSpec& p) { p.num_blocks = 0; }, "block_size 4, num_blocks 0"},
      {[](gen::PagedSpec& p) { p.num_kv_heads = 0; }, "num_kv_heads 0 must be positive and divide num_q_heads 1"},
      {[](gen::PagedSpec& p) { p.num_q_heads = 3, p.num_kv_heads = 2; }, "num_kv_heads 2 must be positive"},
      {[](gen::PagedSpec& p) { p.num_seqs = 2; }, "1 seq_lens for num_seqs 2"},
      {[](gen::PagedSpec& p) {
         p.seq_lens = {1, 2, 3};
       },
       "3 seq_lens for num_seqs 1"},
      {[](gen::PagedSpec& p) { p.cache_stride = 4; }, "cache_stride 4 is below the row width 8"},
      {[](gen::PagedSpec& p) { p.format = KvFormat::nvfp4; }, "an nvfp4 row width 8"}};
  for (const auto& [mutate, needle] : bad) {
    gen::PagedSpec p = base;
    mutate(p);
    INFO(p.vars());
    require_error([&] { (void)gen::paged_decode_case(p); }, Errc::invalid_argument, {"paged_decode_case: " + needle});
    require_error([&] { (void)gen::split_path_case(p); }, Errc::invalid_argument, {needle});
  }
  REQUIRE_NOTHROW(gen::cache_store_case(KvFormat::fp8, 2, 16, 4, 1, 16, 1));
  require_error([&] { (void)gen::cache_store_case(KvFormat::fp8, 2, 16, 0, 4, 16, 1); }, Errc::invalid_argument,
                {"cache_store_case: block_size 0, num_blocks 4 and row_width 16 must be positive"});
  require_error([&] { (void)gen::cache_store_case(KvFormat::fp8, 5, 16, 2, 2, 16, 1); }, Errc::invalid_argument,
                {"cache_store_case: 5 tokens for 4 slots"});
  require_error([&] { (void)gen::cache_store_case(KvFormat::fp8, 2, 16, 4, 1, 8, 1); }, Errc::invalid_argument,
                {"pitch 8 is below row_width 16"});
  require_error([&] { (void)gen::cache_store_case(KvFormat::nvfp4, 2, 24, 4, 1, 0, 1); }, Errc::invalid_argument,
                {"an nvfp4 row_width 24 that is not a multiple of 16"});
  // (Before: "o_partial is null" / "input is null" from the launcher, the count unnamed.)
  require_error([&] { (void)gen::combine_case(1, 2, 8, 0, false, 1); }, Errc::invalid_argument,
                {"combine_case: num_splits is 0"});
  require_error([&] { (void)gen::gemv_case(4, 0, 2, 0, 0, 1); }, Errc::invalid_argument, {"gemv_case: k is 0"});
}

// ---- model cases ----------------------------------------------------------------------

TEST_CASE("bad input: a DeepSeek case with a tensor of the wrong dtype names the tensor", "[bad_input][replay]") {
  // Before: "tensor dtype is F32, expected BF16", naming no tensor.
  SafeTensors f = SafeTensors::read(test::golden("dsv3_h16_t37.safetensors"));
  emu::EmulatorBackend gpu;
  SECTION("w_uk as F32") {
    const Tensor& w = f.at("w_uk");
    const auto values = w.to_f32();
    f.tensors["w_uk"] = Tensor::from<float>(w.shape, values);
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor w_uk is F32, expected BF16"});
  }
  SECTION("q_nope as I32") {
    f.tensors["q_nope"].dtype = Dtype::i32;  // same bytes, now integers
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor q_nope", "cannot convert a I32 tensor"});
  }
  SECTION("a softmax_scale of 0") {
    f.metadata["softmax_scale"] = "0";
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"softmax_scale 0 is not a finite positive number"});
  }
  SECTION("q_nope of the right size in the wrong shape") {
    Tensor& q = f.tensors["q_nope"];
    q.shape = {q.shape[1], q.shape[0]};
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor q_nope has shape [128, 16], expected [16, 128]"});
  }
  SECTION("q_nope with a hundred thousand leading dims of 1") {  // (adversarial trial, forty-fourth
    Tensor& q = f.tensors["q_nope"];                             // session: the line was 300 KB)
    std::vector<std::int64_t> shape(100000, 1);
    shape.insert(shape.end(), q.shape.begin(), q.shape.end());
    q.shape = shape;
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor q_nope has shape [1, 1, 1, ", "1... (300009 bytes), expected [16, 128]"});
  }
  SECTION("a k_rope value whose rotation passes FP32's range") {  // (was "k_scale inf", a name the
    auto values = f.at("k_rope").to_f32();                        // file does not hold)
    values[3] = -3.4e38f;
    f.tensors["k_rope"] = Tensor::from<float>(f.at("k_rope").shape, values);
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor k_rope holds 3.4e+38 in magnitude; rotated, a pair can grow by √2 to 4.80833e+38, past "
                   "FP32's range"});
  }
  SECTION("KV values whose fp8 scale would be subnormal") {  // (before: floored at 1e-30 / 448, and a
    for (const char* name : {"kv_latent", "k_rope"}) {       // FAIL at 93% error; adversarial trial)
      auto values = f.at(name).to_f32();
      for (float& v : values) v = std::ldexp(v, -124);
      f.tensors[name] = Tensor::from<float>(f.at(name).shape, values);
    }
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"the K rows' largest magnitude is ", "(kv_latent's ", "; k_rope's ",
                   " × √2, as the rotation can grow a pair), below 5.26621e-36 (448 × FP32's smallest normal number)"});
    // an nvfp4 cache has no such scale: the case runs (its groups stored as zeros, noted)
    CHECK_FALSE(replay_deepseek_case(gpu, f, "case", {KvFormat::nvfp4, 16}).notes.empty());
  }
  SECTION("V values whose fp8 scale would be subnormal, K's not") {  // (the diff review: the V rows'
    auto values = f.at("kv_latent").to_f32();                        // refusal had no test)
    for (float& v : values) v = std::ldexp(v, -124);
    f.tensors["kv_latent"] = Tensor::from<float>(f.at("kv_latent").shape, values);
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"the V rows' largest magnitude is ", " (kv_latent's), below 5.26621e-36"});
    // One latent pool has K's scale alone, so V's codes round to 0: run, and said in a note.
    const auto latent = replay_deepseek_case(gpu, f, "case", {KvFormat::fp8, 16, true});
    REQUIRE(latent.notes.size() == 1);
    CHECK_THAT(latent.notes[0], Catch::Matchers::Contains(" nonzero values of its one pool's rows (V = K) as zeros: "
                                                          "each is at most 2^-10 times its pool's scale"));
    CHECK_FALSE(latent.pass);
  }
  SECTION("an Inf in kv_latent") {
    auto values = f.at("kv_latent").to_f32();
    values[7] = std::numeric_limits<float>::infinity();
    f.tensors["kv_latent"] = Tensor::from<float>(f.at("kv_latent").shape, values);
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor kv_latent element 7 is inf"});
  }
  SECTION("a softmax_scale beyond a float") {  // before: reported as inf (the cast is undefined)
    f.metadata["softmax_scale"] = "1e300";
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"metadata softmax_scale = 1e300 is beyond a float's range"});
  }
  SECTION("a rope_theta below a float") {  // before: "rope_theta 0 is not ..." (the cast made it 0)
    f.metadata["rope_theta"] = "1e-300";
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"metadata rope_theta = 1e-300 is below a float's range (it would be 0)"});
  }
  SECTION("a head count out of range") {
    f.metadata["heads"] = "0";
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"metadata heads = 0 is out of range (1 to 1,000,000)"});
  }
  SECTION("a NaN in w_uv") {  // before: the replay ran and failed its comparison (exit 1)
    auto values = f.at("w_uv").values<Bf16>();
    values[5] = Bf16::from_float(std::numeric_limits<float>::quiet_NaN());
    f.tensors["w_uv"] = Tensor::from<Bf16>(f.at("w_uv").shape, values);
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"tensor w_uv element 5 is nan"});
  }
  SECTION("a position that is not the last token's") {
    f.metadata["position"] = "3";
    require_error([&] { (void)replay_deepseek_case(gpu, f, "case", {}); }, Errc::invalid_argument,
                  {"metadata position = 3", "tokens − 1 = 36"});
  }
  CHECK(gpu.live_allocations().empty());
}

TEST_CASE("bad input: a small K3 case whose metadata asks for terabytes is refused", "[bad_input][replay]") {
  // Before: std::bad_alloc from the host projection (the CLI aborted).
  SafeTensors f;
  f.metadata = {
      {"heads", "1000000"},      {"tokens", "1000000"}, {"kv_lora_rank", "1"}, {"qk_nope_head_dim", "1"},
      {"qk_rope_head_dim", "1"}, {"v_head_dim", "1"},   {"rope", "none"},      {"softmax_scale", "0.7071067811865476"},
      {"rope_theta", "10000"}};
  emu::EmulatorBackend gpu;
  for (const bool device : {true, false}) {
    require_error([&] { (void)replay_kimi_case(gpu, f, "bomb", device); }, Errc::invalid_argument,
                  {"tokens 1000000 x heads 1000000", "(qk_head_dim 2 + v_head_dim 1) = 3000000000000",
                   "exceed the replay's limit"});
  }
  // A million one-dim tokens fit in memory but would take days: each attends to all before it.
  f.metadata["heads"] = "1";
  for (const bool device : {true, false}) {
    require_error([&] { (void)replay_kimi_case(gpu, f, "slow", device); }, Errc::invalid_argument,
                  {"tokens 1000000 attend to 5e+11 keys in all", "x heads 1 x (qk_head_dim 2 + v_head_dim 1 + 64",
                   "= 3.35e+13, past the replay's work limit of 1.374e+11 on the emulator (some minutes of work); "
                   "replay fewer tokens or heads"});
  }
  // A few tokens of heads wider than the split SDPA takes: the seed kernel's port costs the
  // emulator about 20 times as much (the adversarial trial, forty-sixth session: 2,000 tokens of
  // one 67,000-dim head passed the bound and would have run for 40 minutes).
  f.metadata["tokens"] = "2000", f.metadata["qk_nope_head_dim"] = "67000";
  require_error([&] { (void)replay_kimi_case(gpu, f, "wide", true); }, Errc::invalid_argument,
                {"tokens 2000 attend to 2.001e+06 keys in all",
                 "(qk_head_dim 67001 + v_head_dim 1 + 64 for a key's "
                 "fixed cost) x 20 (the seed kernel: dq 67001 or dv 1 above 256 (the split kernel's registers)) = "
                 "2.684e+12, past the replay's work limit"});
  CHECK(gpu.calls() == 0);
}

// ---- kernel cases ---------------------------------------------------------------------

TEST_CASE("bad input: a kernel case grid must be exactly three u32", "[bad_input][kernel_case]") {
  // Before: sscanf took "-1" as 4294967295, overflowed silently and ignored trailing text.
  SafeTensors f = recorded_decode_case();
  for (const std::string grid : {"8,-1,1", "8,1,1junk", "8,99999999999,1", "8,1", "8,,1", ""}) {
    INFO("grid '" << grid << "'");
    f.metadata["grid"] = grid;
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"grid '" + grid + "' is not x,y,z"});
  }
  f.metadata["grid"] = "8,2,1";
  CHECK(kernel_case_from(f, "c").scalars.at("num_seqs").as_u32() == 2);  // num_seqs comes from grid.y
}

TEST_CASE("bad input: a kernel case without a grid does not default its launch-shape fields",
          "[bad_input][kernel_case]") {
  // Before: the default grid {1,1,1} gave num_seqs = 1 silently.
  SafeTensors f = recorded_decode_case();
  REQUIRE(f.metadata.count("num_seqs") == 0);
  f.metadata.erase("grid");
  // One of grid and block alone: an edited one could not be checked against the launch.
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"metadata block without grid (a recorded launch gives both"});
  SafeTensors g = recorded_decode_case();
  g.metadata.erase("block");
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument, {"metadata grid without block"});
  f.metadata.erase("block");
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument, {"no value for num_seqs"});
  f.metadata["num_seqs"] = "1";
  CHECK(kernel_case_from(f, "c").scalars.at("num_seqs").as_u32() == 1);
}

// A metadata key the entry does not take was once ignored: a misspelt num_splits ran with the
// grid's value.
TEST_CASE("bad input: a kernel case's unknown metadata key is named", "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  REQUIRE_NOTHROW(kernel_case_from(f, "c"));
  f.metadata["num_split"] = "1";
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"metadata num_split = '1' is not a scalar parameter of"});
}

// alias.<param> (one buffer for two pointer parameters): each way it can name the wrong thing.
TEST_CASE("bad input: a kernel case's alias names a pointer parameter and an input", "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  f.tensors.erase("v_cache");
  f.metadata["alias.v_cache"] = "k_cache";
  CHECK(kernel_case_from(f, "c").aliases.at("v_cache") == "k_cache");
  SafeTensors g = f;
  g.metadata["alias.w_cache"] = "k_cache";
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"alias.w_cache = 'k_cache'", "'w_cache' is not a pointer parameter of mla_paged_decode_fp8"});
  g = f, g.metadata["alias."] = "k_cache";
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument, {"'' is not a pointer parameter"});
  g = f, g.metadata["alias.v_cache"] = "sinks";
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"alias.v_cache = 'sinks'", "'sinks' is not an input tensor of the case"});
  g = f, g.metadata["alias.sinks"] = "v_cache";
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"'v_cache' is not an input tensor of the case (it is an alias itself)"});
  g = f, g.tensors["v_cache"] = f.tensors.at("k_cache");
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"v_cache has a tensor of its own (an alias shares k_cache's)"});
  // Another dtype would reinterpret the buffer (the pool read as BF16 q).
  g = f, g.tensors.erase("q"), g.metadata["alias.q"] = "k_cache";
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"alias.q = 'k_cache'", "tensor k_cache is U8, but parameter q of mla_paged_decode_fp8 is BF16"});
  g = f, g.tensors["expected.v_cache"] = f.tensors.at("k_cache");
  require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                {"expected.v_cache, but v_cache is an alias of k_cache"});
}

// An expectation of a buffer the kernel only reads passed whatever the kernel did (adversarial
// trial, forty-fourth session: expected.q in place of expected.o).
TEST_CASE("bad input: a kernel case's expectation of a buffer the kernel does not write is refused",
          "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  REQUIRE(f.tensors.count("expected.o") == 1);
  f.tensors.erase("expected.o");
  f.tensors.erase("tolerance.o");
  f.tensors["expected.q"] = f.tensors.at("q");
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"expected.q, but mla_paged_decode_fp8 does not write q (it only reads it)", "its outputs: o"});
  // An input an output aliases is written: the expectation stands (the rope's in-place buffer
  // given through two names, say).
  f.tensors.erase("expected.q");
  f.tensors.erase("o");
  f.metadata["alias.o"] = "q";
  f.tensors["expected.q"] = f.tensors.at("q");
  CHECK(kernel_case_from(f, "c").expected.count("q") == 1);
}

// A required pointer the file has no tensor for reached the launcher as null and was reported as
// "q is null", which no file can hold (the adversarial trial, forty-seventh session). An optional
// one left out stays a null pointer the launcher takes (here sinks and comp_pool).
TEST_CASE("bad input: a kernel case without a required pointer's tensor names what it lacks",
          "[bad_input][kernel_case]") {
  emu::EmulatorBackend emu;
  for (const char* name : {"q", "seq_lens", "block_tables"}) {
    INFO(name);
    SafeTensors f = recorded_decode_case();
    REQUIRE(f.tensors.erase(name) == 1);
    const KernelCase c = kernel_case_from(f, "c");
    require_error([&] { (void)run_kernel_case(emu, c); }, Errc::invalid_argument,
                  {fmt::format("mla_paged_decode_fp8: {} is null: the case has no tensor '{}', a pointer parameter "
                               "mla_paged_decode_fp8 needs",
                               name, name)});
  }
  const KernelCase whole = kernel_case_from(recorded_decode_case(), "c");
  REQUIRE(whole.inputs.count("sinks") == 0);
  CHECK(run_kernel_case(emu, whole).count("o") == 1);
}

// Which parameters kernel_writes calls outputs is what each port declares (a Global of non-const T).
TEST_CASE("kernel_writes agrees with the emulator's ports on every kernel's outputs", "[kernel_case]") {
  emu::EmulatorBackend emu;
  std::size_t outputs = 0, checked = 0;
  for (const auto& e : emu.registry().entries()) {
    if (e.module == "test") continue;
    INFO(e.full_name());
    for (const auto& p : e.params) {
      if (p.kind != ArgKind::ptr) continue;
      INFO(p.name);
      CHECK(kernel_writes(e.module, e.entry, p.name) == p.writable);
      outputs += p.writable ? 1 : 0, ++checked;
    }
  }
  CHECK(outputs >= 40);  // (a registry walked, not an empty one)
  CHECK(checked > 2 * outputs);
  // The launcher-level paths, which have no port of their own: their output is the combine's.
  CHECK(kernel_writes("mla_fast", "paged_decode_fp8_split_path", "o"));
  CHECK_FALSE(kernel_writes("mla_fast", "paged_decode_fp8_split_path", "k_cache"));
  CHECK(kernel_writes("k3_fast", "k3_sdpa_split_path", "out"));
  CHECK_FALSE(kernel_writes("k3_fast", "k3_sdpa_split_path", "q"));
}

// A split case too large for the device's shared memory is skipped (case_unavailable), but one
// whose shape the launcher refuses is not: a skip would hide the broken file (the diff review:
// rows_per_block 1000 and kv_cache_dim 4096 were "skipped").
TEST_CASE("case_unavailable skips a split case the device cannot hold, not one the launcher refuses", "[kernel_case]") {
  emu::EmulatorOptions o;
  o.max_shared_bytes_per_block = 49152;
  emu::EmulatorBackend small(o);
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.seq_lens = {40}, p.num_blocks = 4, p.max_blocks_per_seq = 4;
  KernelCase c = gen::split_kernel_case(p, 1, gen::SplitEntry::split16);
  const auto why = case_unavailable(small, c);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Matchers::Contains("needs 59904 bytes of shared memory per block, the device allows 49152"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::uint32_t>>{
           {"rows_per_block", 1000}, {"kv_cache_dim", 4096}, {"kv_cache_dim", 100}}) {
    INFO(key << " " << value);
    KernelCase bad = c;
    bad.scalars[key] = KernelArg::u32(value);
    CHECK_FALSE(case_unavailable(small, bad).has_value());
    require_error([&] { (void)run_kernel_case(small, bad); }, Errc::invalid_argument, {key});
  }
}

// A split path's launches are the dispatcher's: a grid in its file was once ignored without a word.
TEST_CASE("bad input: a launch shape in a split-path case file is refused", "[bad_input][kernel_case]") {
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 64, p.seq_lens = {5}, p.num_blocks = 4;
  SafeTensors f = to_safetensors(gen::split_path_case(p));
  REQUIRE_NOTHROW(kernel_case_from(f, "c"));
  for (const char* key : {"grid", "block"}) {
    SafeTensors g = f;
    g.metadata[key] = "8,1,1";
    require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                  {"paged_decode_fp8_split_path is a path of several launches", std::string("drop its ") + key});
  }
}

// A case name or metadata value with a newline or an escape sequence was printed raw, so a file
// could fake a PASS line in a report or a log.
TEST_CASE("bad input: control characters from a case file are escaped in names and messages",
          "[bad_input][kernel_case]") {
  CHECK(printable("a\nb\x1b[2Jc\x7f\td") == "a\\x0Ab\\x1B[2Jc\\x7F\\x09d");
  CHECK(printable("plain ü") == "plain ü");
  // Well-formed UTF-8 stays (2, 3 and 4 bytes); a byte that is not part of it is escaped, alone:
  // a stray continuation, a lead byte cut short or at the end, an overlong form, a surrogate,
  // past U+10FFFF. (A JSON parser's excerpt of a binary file had reached stderr raw.)
  CHECK(printable("\xE2\x82\xAC \xF0\x9F\x98\x80") == "\xE2\x82\xAC \xF0\x9F\x98\x80");
  CHECK(printable("a\xFF\xC3(b") == "a\\xFF\\xC3(b");
  CHECK(printable("\x80x\xE2\x82") == "\\x80x\\xE2\\x82");
  CHECK(printable("\xC0\xAF\xED\xA0\x80\xF4\x90\x80\x80") == "\\xC0\\xAF\\xED\\xA0\\x80\\xF4\\x90\\x80\\x80");
  // A character that reorders or hides the rest of the line (U+202E shows it reversed), a C1
  // control and a line separator: written as \uNNNN (they had reached the terminal raw).
  CHECK(printable("etc/passwd\xE2\x80\xAE.txt") == "etc/passwd\\u202E.txt");
  CHECK(printable("\xC2\x9B"
                  "2J \xE2\x80\xA8 \xE2\x81\xA6x\xE2\x81\xA9 \xE2\x80\x8F") ==
        "\\u009B2J \\u2028 \\u2066x\\u2069 \\u200F");
  CHECK(printable("a\xD8\x9C"
                  "b") == "a\\u061Cb");  // the Arabic letter mark, another bidirectional mark
  CHECK(printable("\xE2\x80\x94 \xC2\xA0") == "\xE2\x80\x94 \xC2\xA0");  // an em dash, a no-break space
  SafeTensors f = recorded_decode_case();
  f.metadata["case"] = "x\nPASS all";
  const KernelCase c = kernel_case_from(f, "c");
  CHECK(c.name == "x\\x0APASS all");
  f.metadata["num_split\r"] = "1\n";
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"metadata num_split\\x0D = '1\\x0A' is not a scalar parameter"});
  try {
    (void)kernel_case_from(f, "c");
  } catch (const Error& e) {
    CHECK(std::string_view(e.what()).find_first_of("\n\r") == std::string_view::npos);
  }
}

// A 10 MB metadata value, key, entry or tensor name was echoed whole in the error line and in
// conform's report.
TEST_CASE("bad input: a megabyte-long value from a case file is cut short in names and messages",
          "[bad_input][kernel_case]") {
  CHECK(excerpt(std::string(kExcerptBytes, 'a')) == std::string(kExcerptBytes, 'a'));
  CHECK(excerpt(std::string(kExcerptBytes + 1, 'a')) == std::string(kExcerptBytes, 'a') + "... (81 bytes)");
  // The cut falls before a character it would split (the euro sign's 3 bytes straddle byte 80).
  const std::string euros = std::string(kExcerptBytes - 1, 'e') + "\xE2\x82\xAC" + "tail";
  CHECK(excerpt(euros) == std::string(kExcerptBytes - 1, 'e') + "... (86 bytes)");
  CHECK(excerpt("a\nb" + std::string(100, 'c')).starts_with("a\\x0Ab"));  // still printable()'s escapes
  const std::string huge(1 << 20, '9');
  const auto message_of = [](const SafeTensors& f) {
    try {
      (void)kernel_case_from(f, "c");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto check_short = [&](const SafeTensors& f, const std::string& wanted) {
    const std::string m = message_of(f);
    CHECK_THAT(m, Catch::Matchers::Contains(wanted));
    CHECK_THAT(m, Catch::Matchers::Contains("... (1048576 bytes)"));
    CHECK(m.size() < 600);
  };
  SafeTensors f = recorded_decode_case();
  {
    SafeTensors g = f;
    g.metadata["k_scale"] = huge;  // a scalar's value
    check_short(g, "scalar k_scale = '9999");
    g = f;
    g.metadata[huge] = "1";  // a key that is no scalar
    check_short(g, "is not a scalar parameter");
    g = f;
    g.metadata["entry"] = huge;
    check_short(g, "no launcher for kernel");
    g = f;
    g.metadata["grid"] = huge;
    check_short(g, "grid '9999");
    g = f;
    g.tensors[huge] = g.tensors.begin()->second;  // a tensor that is no parameter
    check_short(g, "is not a pointer parameter");
    g = f;
    g.metadata["alias." + huge] = "q";
    check_short(g, "alias.9999");
  }
  f.metadata["case"] = huge;  // the name reports print
  CHECK(kernel_case_from(f, "c").name == std::string(kExcerptBytes, '9') + "... (1048576 bytes)");
}

TEST_CASE("bad input: a kernel case scalar the recorded grid contradicts is refused", "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  REQUIRE(f.meta("grid") == "8,1,1");  // [num_q_heads, num_seqs]
  f.metadata["num_seqs"] = "1";        // agrees: accepted
  CHECK(kernel_case_from(f, "c").scalars.at("num_seqs").as_u32() == 1);
  f.metadata["num_seqs"] = "2";  // the launcher would take 2 and run another launch than the recorded one
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"num_seqs = 2 but the recorded grid (8,1,1) gives 1"});
}

TEST_CASE("bad input: a kernel case whose recorded launch shape its launcher does not run is refused",
          "[bad_input][kernel_case]") {
  emu::EmulatorBackend gpu;
  SafeTensors f = recorded_decode_case();  // mla_paged_decode_fp8: grid [num_q_heads = 8, num_seqs = 1]
  CHECK_NOTHROW(run_kernel_case(gpu, kernel_case_from(f, "c")));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"grid", "16,1,1"}, {"grid", "8,1,7"}, {"block", "128,1,1"}}) {
    INFO(key << " " << value);
    SafeTensors g = f;
    g.metadata[key] = value;
    const std::string want =
        key == "grid" ? "grid (" + value + ") block (256,1,1)" : "grid (8,1,1) block (" + value + ")";
    require_error([&] { (void)run_kernel_case(gpu, kernel_case_from(g, "c")); }, Errc::invalid_argument,
                  {"the launcher would run grid (8,1,1) block (256,1,1), but the case records " + want + "; not run"});
  }
  // A generated case has no recorded shape: none is written, and it reads back and runs.
  const KernelCase gen_case = kernel_case_from(f, "c");
  KernelCase unshaped = gen_case;
  unshaped.shape_recorded = false;
  const SafeTensors written = to_safetensors(unshaped);
  CHECK(written.metadata.count("grid") == 0);
  CHECK_FALSE(kernel_case_from(written, "c").shape_recorded);
}

TEST_CASE("bad input: a kernel case edited past its buffers is refused before its launch runs",
          "[bad_input][kernel_case]") {
  // Before (forty-second session): the shape was compared after the run, which on the emulator
  // faulted first and on a GPU would have written past x.
  emu::EmulatorBackend gpu;
  SafeTensors f = SafeTensors::read(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                                    "dsv3_h8_t300_fp8_0601_rope_pairs_bf16.safetensors");
  REQUIRE(f.meta("grid") == "1,1,1");  // 8 rows × 32 pairs: one 256-thread block
  CHECK_NOTHROW(run_kernel_case(gpu, kernel_case_from(f, "c")));
  f.metadata["rows"] = "9";  // a second block, which would read and write past x's 8 rows
  try {
    (void)run_kernel_case(gpu, kernel_case_from(f, "c"));
    FAIL("the edited case ran");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("the launcher would run grid (2,1,1) block (256,1,1), "
                                                                "but the case records grid (1,1,1) block (256,1,1); "
                                                                "not run"));
    CHECK_THAT(std::string(e.what()), !Catch::Matchers::Contains("out-of-bounds"));  // refused before the run
  }
}

TEST_CASE("bad input: a kernel case's empty tensor or short expectation is refused before a launch",
          "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  SECTION("an empty pointer tensor") {
    f.tensors["block_tables"] = Tensor{Dtype::i32, {0}, {}};
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"tensor block_tables has no elements"});
  }
  SECTION("an expectation shorter than its buffer") {
    const Tensor& want = f.tensors.at("expected.o");
    f.tensors["expected.o"] = Tensor{want.dtype,
                                     {static_cast<std::int64_t>(want.numel()) - 1},
                                     std::vector<std::byte>(want.data.begin(), want.data.end() - 2)};
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"expected.o has 4607 values, its buffer o 4608"});
  }
}

TEST_CASE("bad input: a kernel case grid with a zero dimension is named as such", "[bad_input][kernel_case]") {
  SafeTensors f = recorded_decode_case();
  f.metadata["grid"] = "8,0,1";
  require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                {"grid (8,0,1) has a zero dimension, so no value for num_seqs"});
}

// The wgmma entries' block follows from the entry (the launcher sets it): a recorded block that
// differs once replayed and passed.
TEST_CASE("bad input: a recorded wgmma16 case with another block is refused", "[bad_input][kernel_case]") {
  SafeTensors f = SafeTensors::read(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                                    "dsv3_h8_t300_fp8_0606_mla_paged_decode_wgmma16_fp8.safetensors");
  REQUIRE(f.meta("block") == "384,1,1");
  CHECK(kernel_case_from(f, "c").scalars.at("rows_per_block").as_u32() == 16);
  for (const std::string block : {"256,1,1", "128,1,1", "384,2,1"}) {
    INFO("block " << block);
    f.metadata["block"] = block;
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"but mla_paged_decode_wgmma16_fp8 runs blocks of 384 threads"});
  }
}

TEST_CASE("bad input: kernel case tolerances are F64, non-negative, whole ulps", "[bad_input][kernel_case]") {
  // Before: an F32 tolerance gave an error naming no tensor, and ulps of -1, NaN or 1e20
  // were cast to u32 (undefined behaviour).
  SafeTensors f = recorded_decode_case();
  SECTION("F32") {
    const std::vector<float> v{0, 0, 1};
    f.tensors["tolerance.o"] = Tensor::from<float>({3}, v);
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"tolerance.o is F32, expected F64"});
  }
  SECTION("ulps") {
    for (const double ulps : {-1.0, std::nan(""), 1e20, 1.5, 4294967296.0}) {
      INFO("ulps " << ulps);
      f.tensors["tolerance.o"] = f64_tensor({0, 0, ulps});
      require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                    {"tolerance.o ulps", "is not a whole number in [0, 4294967295]"});
    }
    f.tensors["backend_tolerance.o"] = f64_tensor({0, 0, -5});
    f.tensors["tolerance.o"] = f64_tensor({0, 0, 1});
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument, {"backend_tolerance.o ulps -5"});
  }
  SECTION("abs and rel") {
    f.tensors["tolerance.o"] = f64_tensor({std::nan(""), 0, 0});
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"tolerance.o abs nan and rel 0 must be non-negative numbers (+inf allowed, not nan)"});
    f.tensors["tolerance.o"] = f64_tensor({0, -1e-3, 0});
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument, {"rel -0.001"});
  }
  SECTION("for an output the case does not check") {
    f.tensors["tolerance.zzz"] = f64_tensor({0, 0, 1});
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"a tolerance for zzz, which has no expected.zzz tensor"});
  }
  SECTION("valid ones are kept") {
    f.tensors["tolerance.o"] = f64_tensor({1e-3, std::numeric_limits<double>::infinity(), 4294967295.0});
    const Tolerance t = kernel_case_from(f, "c").tolerance.at("o");
    CHECK(t.abs == 1e-3);
    CHECK(std::isinf(t.rel));
    CHECK(t.ulps == 4294967295u);
  }
}

TEST_CASE("bad input: a kernel case tensor of another dtype than its parameter is refused",
          "[bad_input][kernel_case]") {
  // Before: the bytes were uploaded as they were and reinterpreted (q as F32 ran as BF16).
  SafeTensors f = recorded_decode_case();
  SECTION("q as F32") {
    const auto q = f.at("q").to_f32();
    f.tensors["q"] = Tensor::from<float>({static_cast<std::int64_t>(q.size())}, q);
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"tensor q is F32, but parameter q of mla_paged_decode_fp8 is BF16"});
  }
  SECTION("q as F32 in a case of the heads-in-M entry") {  // (its entry had been missing from the table)
    gen::PagedSpec p;
    p.q_head_dim = p.kv_cache_dim = 576, p.num_q_heads = 40, p.block_size = 16, p.num_seqs = 1;
    p.max_blocks_per_seq = 4, p.num_blocks = 8, p.seq_lens = {50}, p.latent = true;
    SafeTensors g = to_safetensors(gen::split_kernel_case(p, 1, gen::SplitEntry::wgmma_latent));
    const auto q = g.at("q").to_f32();
    g.tensors["q"] = Tensor::from<float>({static_cast<std::int64_t>(q.size())}, q);
    require_error([&] { (void)kernel_case_from(g, "c"); }, Errc::invalid_argument,
                  {"tensor q is F32, but parameter q of mla_paged_decode_wgmma_latent_fp8 is BF16"});
  }
  SECTION("block_tables as U8 bytes") {
    f.tensors["block_tables"].dtype = Dtype::u8;
    f.tensors["block_tables"].shape = {static_cast<std::int64_t>(f.at("block_tables").data.size())};
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"tensor block_tables is U8", "is I32"});
  }
  SECTION("an expectation check_output cannot compare") {
    Tensor& want = f.tensors["expected.o"];
    want.dtype = Dtype::i16;  // same bytes as BF16
    require_error([&] { (void)kernel_case_from(f, "c"); }, Errc::invalid_argument,
                  {"expected.o is I16", "F64, F32, BF16, F16, I32 or U8"});
  }
  SECTION("the recorded dtypes pass and run") {
    emu::EmulatorBackend gpu;
    const KernelCase c = kernel_case_from(f, "c");
    const auto out = run_kernel_case(gpu, c);
    CHECK(check_output("o", out.at("o"), c.expected.at("o"), c.tolerance.at("o")).pass);
  }
}

// ---- paged cache ----------------------------------------------------------------------

TEST_CASE("bad input: a block table wider than the pool is refused", "[bad_input][paged_cache]") {
  // Before: max_blocks_per_seq 2^32 - 1 made every upload_tables build a 16 GiB table.
  emu::EmulatorBackend gpu;
  PagedCacheConfig cfg;
  cfg.num_blocks = 4;
  cfg.block_size = 2;
  cfg.kv_cache_dim = 16;
  for (const std::uint32_t width : {5u, 0xFFFF'FFFFu}) {
    cfg.max_blocks_per_seq = width;
    require_error([&] { PagedKvCache c(gpu, cfg); }, Errc::invalid_argument,
                  {fmt::format("max_blocks_per_seq {} exceeds num_blocks 4", width)});
  }
  CHECK(gpu.calls() == 0);
  cfg.max_blocks_per_seq = 4;
  PagedKvCache c(gpu, cfg);
  CHECK(c.max_blocks_per_seq() == 4);
}

// ---- the dispatchers' workspace ---------------------------------------------------------

TEST_CASE("bad input: a decode workspace serves one backend", "[bad_input][dispatch]") {
  // Before: a workspace grown on one emulator handed its address to a dispatcher on another, whose
  // split kernel then wrote its partials into a live buffer there (adversarial helper, thirty-sixth
  // session: every emulator's addresses start at the same place).
  emu::EmulatorBackend a, b;
  DecodeWorkspace ws;
  const DevicePtr on_a = ws.get(a, 1024);
  const DeviceBuffer live_on_b(b, 4096);
  CHECK(live_on_b.ptr() == on_a);  // the address the workspace holds is b's buffer
  require_error([&] { (void)ws.get(b, 64); }, Errc::invalid_argument,
                {fmt::format("decode workspace: its 1024 bytes at {:#x} live on another backend object (emu) than "
                             "the one asked (emu); use one workspace per backend",
                             on_a.addr)});
  CHECK(b.calls(emu::Op::alloc) == 1);
  CHECK(ws.get(a, 512) == on_a);  // a's still
  DecodeWorkspace fresh;
  CHECK(fresh.get(b, 64) != DevicePtr{});
}

// ---- the float64 reference ------------------------------------------------------------

TEST_CASE("bad input: the reference names shapes its spans cannot hold", "[bad_input][reference]") {
  // Before: SIGFPE (num_kv_heads 0, rope 0) or reads past the spans (adversarial helper,
  // thirty-sixth session). The oracle is public: a test that builds it wrong must be told so.
  const std::vector<float> q(2 * 16, 0.5f);
  const std::vector<std::uint8_t> pool(64, 0x38);
  const std::vector<std::int32_t> table{0, 0}, lens{1, 1};
  ref::PagedAttentionProblem p;
  p.q = q, p.k_pool = pool, p.v_pool = pool, p.block_tables = table, p.seq_lens = lens;
  p.num_seqs = 2, p.max_blocks_per_seq = 1, p.num_q_heads = 1, p.q_head_dim = 16, p.kv_cache_dim = 16;
  p.block_size = 2, p.inv_sqrt_d = 0.25, p.cache_stride = 16;
  REQUIRE(ref::paged_attention(p).size() == 32);
  const auto refused = [&](std::initializer_list<std::string> needles) {
    require_error([&] { (void)ref::paged_attention(p); }, Errc::invalid_argument, needles);
    require_error([&] { (void)ref::split_partials(p, 1.0, 64, 1); }, Errc::invalid_argument, needles);
  };
  SECTION("num_kv_heads 0") {
    p.num_kv_heads = 0;
    refused({"reference: num_q_heads 1 is not a multiple of num_kv_heads 0"});
  }
  SECTION("block_size 0") {
    p.block_size = 0;
    refused({"reference: block_size is 0"});
  }
  SECTION("more sequences than q, seq_lens or the tables hold") {
    p.num_seqs = 3;
    refused({"reference: q holds 32 values, short of the 48 its shape needs"});
    p.q_head_dim = 8;  // 3 x 8 fits in q
    refused({"reference: seq_lens holds 2 values, short of the 3 its shape needs"});
  }
  SECTION("q_head_dim past kv_cache_dim") {
    p.kv_cache_dim = 8;
    refused({"reference: q_head_dim 16 exceeds kv_cache_dim 8"});
  }
  SECTION("rope 0, or rows it does not divide") {
    std::vector<double> x(4, 1.0);
    require_error([&] { ref::rope_pairs(x, 0, 1, 1e4); }, Errc::invalid_argument,
                  {"reference: 4 values are not rows of rope 0"});
    require_error([&] { ref::rope_pairs(x, 3, 1, 1e4); }, Errc::invalid_argument,
                  {"reference: 4 values are not rows of rope 3"});
  }
  SECTION("short partials") {
    const std::vector<float> o(10), ml(4);
    require_error([&] { (void)ref::combine_partials(o, ml, {}, 1, 2, 1, 8, 1.0); }, Errc::invalid_argument,
                  {"reference: o_partial holds 10 values, short of the 16 its shape needs"});
  }
  SECTION("the GEMV, the DeepSeek step and K3's functions") {
    const std::vector<float> v(12, 0.5f);
    require_error([&] { (void)ref::batched_gemv(v, v, 2, 4, 2, 8); }, Errc::invalid_argument,
                  {"reference: weight holds 12 values, short of the 16 its shape needs"});
    require_error([&] { (void)ref::batched_gemv(v, std::vector<float>(16), 2, 4, 2, 10); }, Errc::invalid_argument,
                  {"reference: input holds 12 values, short of the 14 its shape needs"});
    ref::DeepseekStepProblem d;
    d.heads = 1, d.tokens = 1, d.kv_lora = 4, d.rope = 2, d.nope = 2, d.v_head = 2, d.softmax_scale = 0.5;
    d.q_nope = d.q_rope = d.kv_latent = d.k_rope = d.w_uk = d.w_uv = v;
    REQUIRE(ref::deepseek_step(d).attn_out.size() == 2);
    d.tokens = 0;
    require_error([&] { (void)ref::deepseek_step(d); }, Errc::invalid_argument,
                  {"reference: no tokens (the last one is the query)"});
    d.tokens = 4;
    require_error([&] { (void)ref::deepseek_step(d); }, Errc::invalid_argument,
                  {"reference: kv_latent holds 12 values, short of the 16 its shape needs"});
    // heads x (nope + rope) past 2^64 saturates rather than wrapping to a size that fits
    require_error([&] { (void)ref::k3_rope({1.0f}, 0xFFFF'FFFFu, 0xFFFF'FFFFu, 0xFFFF'FFFFu, 1, 1e4, false); },
                  Errc::invalid_argument, {"reference: x holds 1 values, short of the 18446744073709551615"});
    ref::K3SdpaProblem k;
    k.heads = 2, k.dq = 4, k.dv = 4, k.seq_len = 3;
    k.q = k.g = std::vector<float>(8, 0.5f), k.k = k.v = std::vector<float>(23, 0.5f);
    require_error([&] { (void)ref::k3_sdpa_gate(k); }, Errc::invalid_argument,
                  {"reference: k holds 23 values, short of the 24 its shape needs"});
    k.k = k.v = std::vector<float>(24, 0.5f), k.dq = 0;
    require_error([&] { (void)ref::k3_split_partials(k, 4, 1); }, Errc::invalid_argument, {"reference: dq is 0"});
  }
}

// ---- DeepSeek decoder -----------------------------------------------------------------

TEST_CASE("bad input: a DeepSeek step checks every size before its first launch", "[bad_input][deepseek]") {
  // Before: positions was indexed by the q rope stage first: an empty span was a null dereference.
  SmallDeepseek t;
  DeepseekMlaDecoder dec(t.gpu, t.config(), t.w_uk, t.w_uv, t.cache);
  const SeqId s = t.cache.add_sequence();
  const MlaDims d = SmallDeepseek::kDims;
  const std::vector<float> q_nope(SmallDeepseek::kHeads * d.nope, 0.5f), q_rope(SmallDeepseek::kHeads * d.rope, 0.5f);
  const std::vector<float> latent(d.kv_lora, 0.3f), k_rope(d.rope, 0.2f);
  const std::uint32_t pos = 0;
  dec.step({std::span(&s, 1), q_nope, q_rope, latent, k_rope, std::span(&pos, 1)});  // one token in

  const auto table = std::vector<std::int32_t>(t.cache.block_table(s).begin(), t.cache.block_table(s).end());
  const auto free_blocks = t.cache.free_blocks();
  const auto live = t.gpu.live_allocations().size();
  const auto calls = t.gpu.calls();
  const std::uint32_t p1 = 1;
  SECTION("no positions") {
    require_error(
        [&] {
          dec.step({std::span(&s, 1), q_nope, q_rope, latent, k_rope, {}});
        },
        Errc::invalid_argument, {"deepseek mla: positions has 0 values, expected 1"});
  }
  SECTION("a position past 2^24") {
    // Before: accepted, and rotated with FP32 angles off by radians; named now before any launch.
    const std::uint32_t far = (1u << 24) + 1;
    require_error(
        [&] {
          dec.step({std::span(&s, 1), q_nope, q_rope, latent, k_rope, std::span(&far, 1)});
        },
        Errc::invalid_argument, {"deepseek mla: positions[0]: position 16777217 is past 2^24 = 16777216"});
    require_error([&] { dec.append_kv(std::span(&s, 1), latent, k_rope, std::span(&far, 1)); }, Errc::invalid_argument,
                  {"deepseek mla: positions[0]: position 16777217 is past 2^24 = 16777216"});
  }
  SECTION("more sequences than the decode's grid holds") {
    // Before: named by the decode launcher, after a rope, assemble and store launch per token.
    std::vector<SeqId> many;
    for (std::uint32_t i = 0; i < 65536; ++i) many.push_back(t.cache.add_sequence());
    require_error(
        [&] {
          dec.step({many, q_nope, q_rope, latent, k_rope, std::span(&p1, 1)});
        },
        Errc::invalid_argument, {"deepseek mla: 65536 sequences in one decode step exceed 65535 (the decode's grid)"});
  }
  SECTION("a short kv_latent") {
    require_error(
        [&] {
          dec.step({std::span(&s, 1), q_nope, q_rope, std::span(latent).first(3), k_rope, std::span(&p1, 1)});
        },
        Errc::invalid_argument, {"kv_latent has 3 values, expected 16"});
  }
  SECTION("no k_rope") {
    require_error(
        [&] {
          dec.step({std::span(&s, 1), q_nope, q_rope, latent, {}, std::span(&p1, 1)});
        },
        Errc::invalid_argument, {"k_rope has 0 values, expected 4"});
  }
  SECTION("a NaN or an infinity in the new token's rows") {
    // Before: the token was stored (a NaN poisoned every later step of the sequence; an infinity
    // saturated to 448·k_scale without a word).
    for (const bool in_latent : {true, false}) {
      for (const float bad : {std::nanf(""), -std::numeric_limits<float>::infinity()}) {
        std::vector<float> latent_bad = latent, k_rope_bad = k_rope;
        (in_latent ? latent_bad[5] : k_rope_bad[2]) = bad;
        require_error(
            [&] {
              dec.step({std::span(&s, 1), q_nope, q_rope, latent_bad, k_rope_bad, std::span(&p1, 1)});
            },
            Errc::invalid_argument,
            {in_latent ? fmt::format("kv_latent[5] is {}", bad) : fmt::format("k_rope[2] is {}", bad),
             "must be finite"});
      }
    }
  }
  CHECK(t.gpu.calls() == calls);  // refused before any backend call
  CHECK(t.cache.seq_len(s) == 1);
  CHECK(std::vector<std::int32_t>(t.cache.block_table(s).begin(), t.cache.block_table(s).end()) == table);
  CHECK(t.cache.free_blocks() == free_blocks);
  CHECK(t.gpu.live_allocations().size() == live);
}

TEST_CASE("bad input: a DeepSeek step's block tables grow with its sequences, not the pool", "[bad_input][deepseek]") {
  // Before: every step uploaded [num_seqs, max_blocks_per_seq] entries, max_blocks_per_seq
  // defaulting to num_blocks: 8000 one-token sequences over a pool of 70000 one-token blocks
  // took 6.6 GB (adversarial helper, thirty-sixth session).
  constexpr std::uint32_t H = SmallDeepseek::kHeads;
  const MlaDims d = SmallDeepseek::kDims;
  SmallDeepseek t;
  PagedCacheConfig pc = t.cache.config();
  pc.num_blocks = 70000, pc.block_size = 1;
  PagedKvCache cache(t.gpu, pc);
  DeepseekMlaDecoder dec(t.gpu, t.config(), t.w_uk, t.w_uv, cache);
  const std::vector<SeqId> seqs{cache.add_sequence(), cache.add_sequence()};
  const std::vector<float> latent(d.kv_lora, 0.3f), k_rope(d.rope, 0.2f);
  const std::vector<std::uint32_t> p0{0};
  const std::vector<float> q_nope(2 * H * d.nope, 0.5f), q_rope(2 * H * d.rope, 0.5f), latents(2 * d.kv_lora, 0.3f),
      k_ropes(2 * d.rope, 0.2f);
  const std::vector<std::uint32_t> positions{1, 0};
  const auto step = [&](PagedKvCache& c, DeepseekMlaDecoder& dd, const std::vector<SeqId>& ids) {
    dd.append_kv(std::span(&ids[0], 1), latent, k_rope, p0);  // sequence 0: one token, then the step's
    t.gpu.clear_launch_log();
    const auto out = dd.step({ids, q_nope, q_rope, latents, k_ropes, positions});
    std::uint32_t decodes = 0;
    for (const emu::LaunchRecord& r : t.gpu.launch_log())
      for (const auto& a : r.args)
        if (a.name == "max_blocks_per_seq") {
          ++decodes;
          CHECK(a.value.as_u32() == 2);  // the longer table: sequence 0's two blocks
        }
    CHECK(decodes >= 1);
    CHECK(c.used_blocks() == 3);
    return out;
  };
  t.gpu.record_launches(true);
  const auto wide = step(cache, dec, seqs);
  // The same step over a pool of 4 blocks: the same tables, so the same bits.
  pc.num_blocks = 4;
  PagedKvCache small(t.gpu, pc);
  DeepseekMlaDecoder small_dec(t.gpu, t.config(), t.w_uk, t.w_uv, small);
  const auto narrow = step(small, small_dec, {small.add_sequence(), small.add_sequence()});
  CHECK(wide.o_latent == narrow.o_latent);
  CHECK(wide.attn_out == narrow.attn_out);
}

// Before: a value past the cache format's range was clipped without a word (FP8 stored 1000 as
// 448), a NaN in q ran, and a step whose scores overflowed FP32 returned NaN or dropped keys
// (twentieth session's adversarial run). Each is now refused, and the cache keeps what it had.
TEST_CASE("bad input: a DeepSeek value the cache cannot hold, a NaN query or overflowing scores change nothing",
          "[bad_input][deepseek]") {
  const MlaDims d = SmallDeepseek::kDims;
  constexpr std::uint32_t H = SmallDeepseek::kHeads;
  SmallDeepseek t;
  DeepseekMlaConfig cfg = t.config();
  const bool overflow = GENERATE(false, true);
  if (overflow) cfg.softmax_scale = 1e30f;  // finite and positive, so the config is accepted
  DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, t.cache);
  const SeqId s = t.cache.add_sequence();
  std::vector<float> latent(d.kv_lora, 0.3f), k_rope(d.rope, 0.2f);
  latent[1] = 460.0f;  // rounds to E4M3's 448: accepted
  const std::uint32_t p0 = 0, p1 = 1;
  dec.append_kv(std::span(&s, 1), latent, k_rope, std::span(&p0, 1));
  const auto table = std::vector<std::int32_t>(t.cache.block_table(s).begin(), t.cache.block_table(s).end());
  const auto free_blocks = t.cache.free_blocks();
  const auto live = t.gpu.live_allocations().size();
  std::vector<float> q_nope(H * d.nope, 0.5f), q_rope(H * d.rope, 0.5f);
  const auto step = [&] { dec.step({std::span(&s, 1), q_nope, q_rope, latent, k_rope, std::span(&p1, 1)}); };
  if (!overflow) {
    SECTION("a latent value past the FP8 cache's range") {
      latent[3] = 1000.0f;
      require_error(step, Errc::invalid_argument,
                    {"kv_latent[3] is 1000, more than the fp8 cache holds: its largest value is 448 (E4M3's 448 x "
                     "k_scale 1), and past 464 the store saturates"});
    }
    SECTION("a rope pair whose rotation can leave the range") {
      k_rope[0] = k_rope[1] = 400.0f;  // each fits, but rotated, one may reach 565.7
      require_error(step, Errc::invalid_argument, {"k_rope[0] is 400 (its rotation pair's length 565.685)"});
    }
    SECTION("a NaN or an infinity in q") {
      q_rope[2] = std::numeric_limits<float>::infinity();
      require_error(step, Errc::invalid_argument, {"deepseek mla: q_rope[2] is inf; a query must be finite"});
      q_rope[2] = 0.5f, q_nope[7] = std::nanf("");
      require_error(step, Errc::invalid_argument, {"deepseek mla: q_nope[7] is nan; a query must be finite"});
    }
    SECTION("a finite q whose absorbed query overflows BF16") {
      // Before: "|q_absorbed|_1 nan ... = nan reaches 2^126" (helper's adversarial run, 35th session).
      std::fill(q_nope.begin(), q_nope.end(), 3.4e38f);
      require_error(step, Errc::invalid_argument,
                    {"deepseek mla: q_absorbed[0] is inf; the step overflowed its BF16 outputs; it was not applied"});
    }
  } else {
    SECTION("scores that could pass FP32's range") {
      std::fill(q_nope.begin(), q_nope.end(), 1e5f);
      require_error(step, Errc::invalid_argument,
                    {"sequence 0 head 0: softmax_scale 1e+30 x |q_absorbed|_1", "could overflow FP32",
                     "the step was not applied"});
    }
  }
  CHECK(t.cache.seq_len(s) == 1);
  CHECK(std::vector<std::int32_t>(t.cache.block_table(s).begin(), t.cache.block_table(s).end()) == table);
  CHECK(t.cache.free_blocks() == free_blocks);
  CHECK(t.gpu.live_allocations().size() == live);
}

TEST_CASE("bad input: an NVFP4 cache refuses a value past 448 x 6, rounding included", "[bad_input][deepseek]") {
  constexpr MlaDims d{12, 4, 8, 8};  // a row of 16 values: one NVFP4 group
  emu::EmulatorBackend gpu;
  PagedCacheConfig pc;
  pc.format = KvFormat::nvfp4, pc.num_blocks = 2, pc.block_size = 2, pc.kv_cache_dim = d.cache_dim();
  PagedKvCache cache(gpu, pc);
  const std::vector<Bf16> w_uk(2 * d.nope * d.kv_lora, Bf16::from_float(0.1f)),
      w_uv(2 * d.v_head * d.kv_lora, Bf16::from_float(0.1f));
  DeepseekMlaDecoder dec(gpu, {2, d, 0.25f, 10000.0f, true}, w_uk, w_uv, cache);
  const SeqId s = cache.add_sequence();
  std::vector<float> latent(d.kv_lora, 0.3f), k_rope(d.rope, 0.2f);
  const std::uint32_t p0 = 0;
  latent[0] = -3000.0f;  // E4M3(3000 / 6) = 448 and E2M1(3000 / 448) = 6: rounding, not clipping
  dec.append_kv(std::span(&s, 1), latent, k_rope, std::span(&p0, 1));
  latent[0] = 4000.0f;
  const std::uint32_t p1 = 1;
  require_error([&] { dec.append_kv(std::span(&s, 1), latent, k_rope, std::span(&p1, 1)); }, Errc::invalid_argument,
                {"kv_latent[0] is 4000, more than the nvfp4 cache holds: its largest value is 2688 (an NVFP4 "
                 "group's largest, E4M3 448 x E2M1 6), and past 3136 the store saturates"});
  CHECK(cache.seq_len(s) == 1);
}

TEST_CASE("bad input: a DeepSeek decoder config is checked when the decoder is built", "[bad_input][deepseek]") {
  SmallDeepseek t;
  SECTION("softmax_scale") {
    for (const float scale : {0.0f, -0.25f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
      DeepseekMlaConfig cfg = t.config();
      cfg.softmax_scale = scale;
      require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, t.cache); }, Errc::invalid_argument,
                    {fmt::format("softmax_scale {} is not a finite positive number", scale)});
    }
    // Finite, but past FP32 times log2(e), the wgmma kernels' base-2 logits: named here, not by the
    // decode launcher's inv_sqrt_d after the prefill (the adversarial trial, forty-fifth session).
    DeepseekMlaConfig cfg = t.config();
    cfg.softmax_scale = 3e38f;
    require_error(
        [&] { DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, t.cache); }, Errc::invalid_argument,
        {"deepseek mla: softmax_scale 3e+38 times log2(e) (the wgmma kernels' base-2 logits) is past FP32's range"});
    // Each finite, the FP8 logit scale (softmax_scale × k_scale) not.
    PagedCacheConfig pc = t.cache.config();
    pc.k_scale = pc.v_scale = 1e30f;
    PagedKvCache big(t.gpu, pc);
    cfg.softmax_scale = 1e20f;
    require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, big); }, Errc::invalid_argument,
                  {"deepseek mla: softmax_scale 1e+20 times k_scale 1e+30 (the logit scale) times log2(e) is past "
                   "FP32's range"});
  }
  SECTION("rope_theta, when rotating") {
    DeepseekMlaConfig cfg = t.config();
    cfg.rope_theta = -1.0f;
    require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, t.cache); }, Errc::invalid_argument,
                  {"rope_theta -1 is not a finite positive number"});
    cfg.rotate = false;  // unused then
    DeepseekMlaDecoder dec(t.gpu, cfg, t.w_uk, t.w_uv, t.cache);
  }
  // Before: each was accepted, then refused at the first append by a kernel's limit (or, for
  // weight sizes past 2^64, wrapped to 0 so that empty weights passed and the copy crashed).
  SECTION("a config the kernels cannot run") {
    const auto refused = [&](std::uint32_t heads, MlaDims dims, bool rotate, std::string needle) {
      DeepseekMlaConfig cfg = t.config();
      cfg.heads = heads, cfg.dims = dims, cfg.rotate = rotate;
      require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, {}, {}, t.cache); }, Errc::invalid_argument,
                    {"deepseek mla: " + needle});
    };
    refused(2, {16, 0, 8, 8}, true, "heads 2, kv_lora 16, rope 0, nope 8 and v_head 8 must all be > 0");
    refused(2, {16, 5, 8, 8}, true, "rope 5 is odd; rotation turns pairs (2i, 2i+1)");
    refused(2, {1000, 40, 8, 8}, true, "kv_lora 1000 + rope 40 = 1040 exceeds the kernels' kv_cache_dim limit 1024");
    refused(70000, {16, 4, 8, 8}, true, "heads 70000 exceeds 65535");
    refused(1u << 22, {1u << 21, 64, 1u << 21, 1u << 21}, true, "heads 4194304 exceeds 65535");
    // Without rotation an odd rope is only a width.
    std::vector<float> w_uk(2 * 8 * 15), w_uv(2 * 8 * 15);
    PagedCacheConfig pc;
    pc.num_blocks = 2, pc.block_size = 2, pc.kv_cache_dim = 20;
    PagedKvCache odd_cache(t.gpu, pc);
    DeepseekMlaConfig cfg{2, {15, 5, 8, 8}, 0.25f, 10000.0f, false};
    const auto bf16 = [](const std::vector<float>& x) {
      std::vector<Bf16> out(x.size());
      std::transform(x.begin(), x.end(), out.begin(), Bf16::from_float);
      return out;
    };
    CHECK_NOTHROW(DeepseekMlaDecoder(t.gpu, cfg, bf16(w_uk), bf16(w_uv), odd_cache));
  }
  SECTION("dimension sums past 32 bits") {
    // kv_lora + rope would wrap to 20 = the cache's kv_cache_dim and pass the cache check.
    DeepseekMlaConfig cfg = t.config();
    cfg.dims = MlaDims{0xFFFF'FFFFu, 21, 8, 8};
    require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, {}, {}, t.cache); }, Errc::invalid_argument,
                  {"kv_lora 4294967295 + rope 21 exceeds 4294967295"});
    cfg.dims = MlaDims{16, 4, 0xFFFF'FFFFu, 8};
    require_error([&] { DeepseekMlaDecoder dec(t.gpu, cfg, {}, {}, t.cache); }, Errc::invalid_argument,
                  {"nope 4294967295 + rope 4 exceeds 4294967295"});
  }
}

// ---- Kimi K3 host reference and history -------------------------------------------------

TEST_CASE("bad input: the K3 CPU reference checks theta and the history before rotating", "[bad_input][k3]") {
  // Before: theta 0 returned NaN without an error, and a bad history was found only after q
  // and k had been rotated in place.
  const MlaConfig cfg{2, 4, 4, 4, false, true};
  std::vector<float> q(16, 1.0f), k(16, 1.0f);
  const std::vector<float> v(8, 1.0f), g(8, 0.0f);
  SECTION("theta") {
    MlaKv kv;
    for (const float theta : {0.0f, -10000.0f, std::nanf("")}) {
      require_error([&] { (void)mla_decode_token(q, k, v, g, kv, cfg, 3, theta); }, Errc::invalid_argument,
                    {fmt::format("theta {} is not a finite positive number", theta)});
    }
    CHECK(kv == MlaKv{});
    MlaConfig nope = cfg;
    nope.mla_use_nope = true;  // theta unused
    CHECK(std::isfinite(mla_decode_token(q, k, v, g, kv, nope, 3, 0.0f)[0]));
  }
  SECTION("a history the config's rows do not fit") {
    MlaKv kv;
    kv.seq_len = 1;
    kv.k.assign(5, 0.0f);
    kv.v.assign(8, 0.0f);
    const MlaKv before = kv;
    require_error([&] { (void)mla_decode_token(q, k, v, g, kv, cfg, 3, 10000.0f); }, Errc::invalid_argument,
                  {"host KV of 1 tokens holds 5 K and 8 V values, the config needs 16 and 8"});
    CHECK(kv == before);
  }
  SECTION("a NaN or an infinity in the new K or V row, on the reference and both launchers") {
    // Before: the row joined the history, and every later token's output was NaN.
    emu::EmulatorBackend gpu;
    const auto kernels = K3MlaDecodeKernels::resolve(gpu);
    for (const bool in_k : {true, false}) {
      std::vector<float> k_bad = k, v_bad = v;
      (in_k ? k_bad[7] : v_bad[3]) = std::numeric_limits<float>::infinity();
      const std::string needle = in_k ? "k[7] is inf" : "v[3] is inf";
      MlaKv kv;
      require_error([&] { (void)mla_decode_token(q, k_bad, v_bad, g, kv, cfg, 3, 10000.0f); }, Errc::invalid_argument,
                    {needle, "must be finite"});
      require_error([&] { (void)launch_k3_mla_decode_token(gpu, kernels, q, k_bad, v_bad, g, kv, cfg, 3, 10000.0f); },
                    Errc::invalid_argument, {needle});
      CHECK(kv == MlaKv{});
      auto device = MlaDeviceKv::alloc(gpu, 4, cfg.k_row(), cfg.v_row());
      require_error(
          [&] {
            (void)launch_k3_mla_decode_token_on_device(gpu, kernels, q, k_bad, v_bad, g, device, cfg, 3, 10000.0f);
          },
          Errc::invalid_argument, {needle});
      CHECK(device.seq_len() == 0);
    }
  }
  CHECK(q == std::vector<float>(16, 1.0f));  // not rotated
  CHECK(k == std::vector<float>(16, 1.0f));
}

TEST_CASE("bad input: truncating a host KV that is not whole rows is refused", "[bad_input][k3]") {
  // Before: k.size() / seq_len * len silently cut a mis-sized history at a wrong offset.
  MlaKv kv;
  kv.seq_len = 3;
  kv.k.assign(5, 1.0f);
  kv.v.assign(6, 1.0f);
  const MlaKv before = kv;
  require_error([&] { kv.truncate(1); }, Errc::invalid_argument,
                {"host KV of 3 tokens holds 5 K and 6 V values, not whole rows"});
  CHECK(kv == before);
  kv.k.assign(6, 1.0f);
  kv.truncate(1);
  CHECK(kv.seq_len == 1);
  CHECK(kv.k.size() == 2);
  CHECK(kv.v.size() == 2);
}

// ---- the CLI ----------------------------------------------------------------------------

// An emulator given a GB10's shared memory cannot launch mla_wgmma's blocks: conform and case
// run skip those cases with a note (they had failed with launch_failed), and pass.
TEST_CASE("bad input: cases the device cannot run are skipped, not failed", "[bad_input][cli]") {
  std::string out;
  const std::string wgmma16 =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0606_mla_paged_decode_wgmma16_fp8.safetensors";
  CHECK(run_cli("case run --backend emu " + wgmma16, out) == 0);
  CHECK_THAT(out, !Catch::Matchers::Contains("skipped"));
  out.clear();
  CHECK(run_cli("case run --backend emu " + wgmma16, out, "METRALE_EMU_SHARED_BYTES=101376") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("skipped: mla_paged_decode_wgmma16_fp8 needs 169280 bytes of shared "
                                            "memory per block, the device allows 101376"));
  CHECK_THAT(out, Catch::Matchers::Contains("1 file on emu (1 skipped: the device cannot run them)"));
  // Every case skipped checks nothing: an error, not a PASS (the adversarial helper's finding);
  // with a file that runs beside it, the run passes.
  CHECK_THAT(out, Catch::Matchers::Contains("the device (emu) cannot run the one file: nothing was checked"));
  const std::string combine =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0607_mla_paged_decode_combine.safetensors";
  out.clear();
  CHECK(run_cli("case run --backend emu " + wgmma16 + " " + combine, out, "METRALE_EMU_SHARED_BYTES=101376") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("2 files on emu (1 skipped: the device cannot run them): PASS"));
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --only wgmma16", out, "METRALE_EMU_COMPUTE_CAPABILITY=121") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform: the device (emu) cannot run any of the"));
}

// Before: "error (not_found): no tensor named 'attn_out'", naming no file (35th session's
// adversarial run). What a model case lacks is named with the file.
// An NVFP4 cache of a model whose row is not whole scale groups: said in the file's names (the
// adversarial trial, forty-sixth session: "paged cache: nvfp4 row width 17 is not a multiple of 16").
TEST_CASE("bad input: replay --kv-cache nvfp4 names the model's dims that NVFP4 cannot take", "[bad_input][replay]") {
  SafeTensors f = SafeTensors::read(test::golden("dsv3_h16_t37.safetensors"));
  f.metadata["qk_rope_head_dim"] = "63";  // 512 + 63
  emu::EmulatorBackend gpu;
  require_error(
      [&] {
        (void)replay_deepseek_case(gpu, f, "odd", {KvFormat::nvfp4, 16, false});
      },
      Errc::invalid_argument,
      {"kv_lora_rank 512 + qk_rope_head_dim 63 = 575 is not a multiple of 16, the NVFP4 cache's scale "
       "groups; --kv-cache fp8 takes it"});
}

TEST_CASE("bad input: replay names the file whose case lacks a tensor", "[bad_input][cli]") {
  SafeTensors f = SafeTensors::read(test::golden("dsv3_h16_t37.safetensors"));
  f.tensors.erase("attn_out");
  const TempPath file(".safetensors");
  f.write(file.path);
  std::string out;
  CHECK(run_cli("replay --backend emu " + file.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains(file.path.string() + ": no tensor named 'attn_out'"));
}

// A golden replay out of tolerance says by how much (the fresh-user trial, forty-sixth session: its
// line read "1 of 1 bad, worst " and the report's worst was empty).
TEST_CASE("conform names a failed golden replay's rel_l2 and tolerance", "[cli]") {
  SafeTensors f = SafeTensors::read(test::golden("dsv3_h16_t37.safetensors"));
  auto& attn_out = f.tensors.at("attn_out").data;
  std::fill(attn_out.begin(), attn_out.end(), std::byte{0x3F});  // 0.747 each (F32)
  const TempPath dir("_zero_golden");
  std::filesystem::create_directories(dir.path);
  f.write(dir.path / "dsv3_zeroed.safetensors");
  std::string out;
  CHECK(run_cli("conform --backend emu --only 'dsv3_zeroed fp8 block 16 latent' --cases " +
                    std::string(METRALE_SOURCE_DIR) + "/cases/kernels --golden " + dir.path.string(),
                out) == 1);
  CHECK_THAT(out, Catch::Matchers::Contains("attn_out vs golden: 1 of 1 bad, worst rel_l2 "));
  CHECK_THAT(out, Catch::Matchers::Matches("(.|\n)*worst rel_l2 [0-9.e+-]+ > tolerance [0-9.e+-]+\n(.|\n)*"));
}

// Two formats' recordings of one launch share the case's name: a row names its file.
TEST_CASE("a case run labels each row by its file", "[cli]") {
  const std::string dir = std::string(METRALE_SOURCE_DIR) + "/cases/kernels/";
  std::string out;
  CHECK(run_cli("case run --backend emu " + dir + "dsv3_h8_t300_fp8_0607_mla_paged_decode_combine.safetensors " + dir +
                    "dsv3_h8_t300_nvfp4_0607_mla_paged_decode_combine.safetensors",
                out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("dsv3_h8_t300_fp8_0607_mla_paged_decode_combine"));
  CHECK_THAT(out, Catch::Matchers::Contains("dsv3_h8_t300_nvfp4_0607_mla_paged_decode_combine"));
  CHECK_THAT(out, Catch::Matchers::Contains("2 files on emu: PASS"));
}

// Nineteenth session's adversarial run: a file named twice ran twice, an empty --only ran the
// whole set, and a report folder made for a run that then failed was left behind.
// (No semicolon in a test name: catch_discover_tests splits the name there into CTest tests that
// match no case, and Catch2 passes a filter that matches nothing.)
TEST_CASE("bad input: a file named twice runs once, an empty filter is refused, no stray report folder",
          "[bad_input][cli]") {
  const std::string dir = std::string(METRALE_SOURCE_DIR) + "/cases/kernels/";
  const std::string file = dir + "dsv3_h8_t300_fp8_0607_mla_paged_decode_combine.safetensors";
  std::string out;
  CHECK(run_cli("case run --backend emu " + file + " " + file + " " + dir + "/../kernels/" +
                    "dsv3_h8_t300_fp8_0607_mla_paged_decode_combine.safetensors",
                out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("1 file on emu: PASS"));
  for (const std::string cmd : {"conform --backend emu --only ''", "bench --only ''"}) {
    out.clear();
    INFO(cmd);
    CHECK(run_cli(cmd, out) != 0);
    CHECK_THAT(out, Catch::Matchers::Contains("--only: an empty filter (it would match everything)"));
  }
  const auto root = test::scratch_dir("metrale_report_folder_test");
  std::filesystem::remove_all(root);
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --only no_such_kernel --report " + (root / "a" / "b").string(),
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no case matches --only 'no_such_kernel'"));
  CHECK_THAT(out, !Catch::Matchers::Contains("case-sensitive"));
  // What there is to pick, named (the sweep's kernels, a seed one and a fast one among them).
  CHECK_THAT(out, Catch::Matchers::Contains("the sweep's kernels are "));
  CHECK_THAT(out, Catch::Matchers::Contains("mla_paged_decode_fp8, "));
  CHECK_THAT(out, Catch::Matchers::Contains("mla_paged_decode_combine"));
  // The outermost folder it made, said (before, a mistyped parent was made without a word).
  CHECK_THAT(out, Catch::Matchers::Contains("conform --report: created " + root.string()));
  CHECK_THAT(out, Catch::Matchers::Contains("conform --report: removed " + root.string() +
                                            " again, as no report was written"));
  CHECK_FALSE(std::filesystem::exists(root));
  out.clear();  // upper case: the match is case-sensitive, which the error says (fresh-user trial)
  CHECK(run_cli("conform --backend emu --no-golden --only WGMMA16", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no case matches --only 'WGMMA16' (the match is case-sensitive"));
  // Before: "a/../b" created a as well, and the cleanup, measuring the normal path, left it.
  out.clear();
  CHECK(
      run_cli("conform --backend emu --no-golden --only no_such_kernel --report " + (root / "a" / ".." / "b").string(),
              out) == 2);
  CHECK_FALSE(std::filesystem::exists(root));
  // A link before "..": the folder beside the link's target, as the system resolves the path
  // (before, "lnk/../b" was read as "b" beside the link).
  std::filesystem::create_directories(root / "x" / "y");
  std::filesystem::create_symlink(root / "x" / "y", root / "lnk");
  out.clear();
  CHECK(run_cli(
            "conform --backend emu --no-golden --only no_such_kernel --report " + (root / "lnk" / ".." / "b").string(),
            out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform --report: created " + (root / "x" / "b").string()));
  CHECK_FALSE(std::filesystem::exists(root / "b"));
  CHECK_FALSE(std::filesystem::exists(root / "x" / "b"));  // removed again
  std::filesystem::remove_all(root);
}

// A recorded step over one latent pool carries no "latent" in its name, only its alias: conform's
// --only latent picks it all the same, as it picks the sweep's latent cases.
TEST_CASE("conform --only latent picks a case file whose v_cache is an alias of k_cache", "[cli]") {
  gen::PagedSpec p;
  p.num_q_heads = 16, p.q_head_dim = p.kv_cache_dim = 576, p.block_size = 16, p.max_blocks_per_seq = 4,
  p.num_blocks = 4, p.seq_lens = {40}, p.latent = true;
  const KernelCase c = gen::split_kernel_case(p, 1, gen::SplitEntry::wgmma16_rs);
  REQUIRE(c.aliases.at("v_cache") == "k_cache");
  const auto dir = test::scratch_dir("metrale_conform_latent_file");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  to_safetensors(c).write(dir / "0000_recorded_step.safetensors");
  std::string out;
  CHECK(run_cli("conform --backend emu --no-golden --only latent --cases " + dir.string(), out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("file     mla_paged_decode_wgmma16_rs_fp8"));
  std::filesystem::remove_all(dir);
}

// Twenty-first session's adversarial run: METRALE_GOLDEN_DIR pointing nowhere passed (exit 0), and
// a folder named twice ran its cases twice.
TEST_CASE("bad input: conform refuses a METRALE_GOLDEN_DIR that is not a folder and runs a file once",
          "[bad_input][cli]") {
  std::string out;
  CHECK(run_cli("conform --backend emu --only rope_pairs", out, "METRALE_GOLDEN_DIR=/nonexistent") == 2);
  // (the variable named: a fresh user's trial, thirty-sixth session, had only the path to go on)
  CHECK_THAT(out, Catch::Matchers::Contains("METRALE_GOLDEN_DIR: conform: no folder /nonexistent"));
  out.clear();  // a relative one says what it is relative to, as case run does (fresh-user trial, forty-ninth session)
  CHECK(run_cli("conform --backend emu --cases nosuchdir", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform: no folder nosuchdir (relative to "));
  out.clear();
  CHECK(run_cli("conform --backend emu --only rope_pairs", out, "METRALE_GOLDEN_DIR=/dev/null") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("METRALE_GOLDEN_DIR: conform: not a folder: /dev/null"));
  out.clear();
  const std::string dir = std::string(METRALE_SOURCE_DIR) + "/cases/kernels";
  CHECK(run_cli("conform --backend emu --no-golden --only 0599_mla_batched_gemv --cases " + dir + " " + dir + "/ " +
                    dir + "/../kernels",
                out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("file     mla_batched_gemv                                    1      0"));
}

// Twenty-first session's new user: a fuzz run killed by a signal left an empty --out folder.
TEST_CASE("a fuzz driver killed mid-run leaves no --out folder", "[cli]") {
  const auto fuzz = std::filesystem::path(METRALE_CLI).parent_path() / "fuzz_capacity";
  const auto out_dir = test::scratch_dir("metrale_fuzz_killed") / "failures";
  std::filesystem::remove_all(out_dir.parent_path());
  const std::string cmd =
      "timeout -s TERM 1 " + fuzz.string() + " --seconds 30 --seed 7 --out " + out_dir.string() + " >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 124);  // timeout's: the driver was still running
  CHECK(!std::filesystem::exists(out_dir.parent_path()));
}

// Thirty-third session's adversarial run: under a GB10's settings or a small shared memory, the
// argument-order and validation families reported false failures (an entry the device cannot run
// counted as "valid arguments refused"; the combine's grid sized for 132 SMs; the split path
// expected where its block does not fit).
TEST_CASE("the launcher property families hold on the devices the emulator plays", "[cli]") {
  const auto bin = std::filesystem::path(METRALE_CLI).parent_path();
  for (const char* env : {"METRALE_EMU_COMPUTE_CAPABILITY=121", "METRALE_EMU_SHARED_BYTES=49152"})
    for (const char* family : {"fuzz_argorder", "fuzz_validation"}) {
      INFO(env << " " << family);
      const std::string cmd = std::string(env) + " " + (bin / family).string() + " --cases 300 --seed 5 --out " +
                              test::scratch_dir("metrale_props_devices").string() + " >/dev/null 2>&1";
      const int status = std::system(cmd.c_str());
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
}

// Fresh-user trial, forty-fourth session: under a small shared memory conform failed the mma.sync
// split entries' cases and the split paths' ("the device's 49152 bytes ... are too few"), which
// it skips for the wgmma entries; case run the same.
TEST_CASE("conform, case run and bench skip the split cases whose blocks do not fit the device's shared memory",
          "[cli]") {
  std::string out;
  CHECK(run_cli("conform --backend emu --no-golden --only split", out, "METRALE_EMU_SHARED_BYTES=49152") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains(
                      "skipped (paged_decode_fp8_split_path needs 59904 bytes of shared memory per block, the device "
                      "allows 49152)"));
  CHECK_THAT(out, Catch::Matchers::Contains(
                      "skipped (mla_paged_decode_split16_fp8 needs 59904 bytes of shared memory per block"));
  CHECK_THAT(out, Catch::Matchers::Contains(", 0 failed"));
  const auto dir = test::scratch_dir("metrale_split_small_shared");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  gen::PagedSpec p;
  p.q_head_dim = p.kv_cache_dim = 576, p.seq_lens = {40}, p.num_blocks = 4, p.max_blocks_per_seq = 4;
  to_safetensors(gen::split_path_case(p)).write(dir / "split_path.safetensors");
  out.clear();
  CHECK(run_cli("case run --backend emu " + dir.string(), out, "METRALE_EMU_SHARED_BYTES=49152") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("skipped: paged_decode_fp8_split_path needs 59904 bytes"));
  out.clear();  // where it fits, it runs and passes
  CHECK(run_cli("case run --backend emu " + dir.string(), out) == 0);
  std::filesystem::remove_all(dir);
  // bench: the split rows said and left out, the others run (the first had failed the run)
  out.clear();
  CHECK(run_cli("bench --backend emu --only paged_decode_fp8", out, "METRALE_EMU_SHARED_BYTES=49152") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("bench: paged_decode_fp8 (split) B=1 L=256 H=16 skipped: its smallest "
                                            "split block needs 59904 bytes of shared memory, the device allows 49152"));
  CHECK_THAT(out, Catch::Matchers::Contains("\npaged_decode_fp8 (seed) "));
  out.clear();
  CHECK(run_cli("bench --backend emu --only 'paged_decode_fp8 (split)'", out, "METRALE_EMU_SHARED_BYTES=49152") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("bench: backend emu can run none of the rows selected"));
}

// Twenty-seventh and thirty-third sessions: --out under /proc passed the check as root (access()
// says yes; mkdir there fails), and the run went on. The check now makes and removes a probe folder.
// Before: "Value abc not in range 0.001000 to 10000000.000000" for text that is no number, and
// "0x10" taken as 16 s where --cases and --seed take decimal digits only (35th session's helper).
TEST_CASE("a fuzz driver's --seconds is a decimal number", "[cli]") {
  const auto fuzz = std::filesystem::path(METRALE_CLI).parent_path() / "fuzz_capacity";
  for (const char* bad : {"abc", "0x10", "1e-3x", "nan", "inf", "''"}) {
    std::string out;
    INFO(bad);
    CHECK(run_command(fuzz.string() + " --list --seconds " + bad, out) == 2);
    const std::string shown = std::string(bad) == "''" ? "" : bad;
    CHECK_THAT(out, Catch::Matchers::Contains("--seconds: '" + shown + "' is not a number (2, 0.5, 1e-3)"));
  }
  // Out of range, a double's too (the adversarial trial, forty-seventh session: "1e-400" was "not a
  // number", and 0 had CLI11's "Value 0 not in range 0.001000 to 10000000.000000").
  for (const char* far : {"1e8", "0", "1e-400", "1e400", "-5"}) {
    INFO(far);
    std::string out;
    CHECK(run_command(fuzz.string() + " --list --seconds " + far, out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("--seconds: '" + std::string(far) + "' is outside 0.001 to 10000000"));
  }
  std::string out;
  out.clear();
  CHECK(run_command(fuzz.string() + " --list --seconds 0.5", out) == 0);
}

// Every property of a round runs its batch with that round's seed (--seed + round): the summary
// had said "a seed a batch", and a run of one round over several properties listed one seed.
TEST_CASE("a fuzz driver's summary says one seed a round of its properties", "[cli]") {
  const auto fuzz = std::filesystem::path(METRALE_CLI).parent_path() / "fuzz_capacity";
  std::string out;
  REQUIRE(run_command(fuzz.string() + " --cases 1 --seed 7", out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("a seed a round of them)"));
  CHECK_THAT(out, Catch::Matchers::Contains("seeds 7..7: no failure"));
  CHECK_THAT(out, !Catch::Matchers::Contains(" in 1 batch "));  // one round, several properties' batches
}

// A failure's files go to a folder of their own: one an earlier run left at the seed's name is
// kept as it was, a link in it included, and the new files go beside it (the adversarial trials:
// forty-seventh session, an ofstream had written the report through a link into its target;
// fiftieth, a stale case file sat among a new failure's). The emulator's block budget of one
// access fails fuzz_paged's first property at once.
TEST_CASE("a fuzz driver writes a failure to a folder of its own", "[cli]") {
  const auto fuzz = std::filesystem::path(METRALE_CLI).parent_path() / "fuzz_paged";
  const auto scratch = test::scratch_dir("metrale_fuzz_report");
  std::filesystem::remove_all(scratch);
  const auto dir = scratch / "paged-paged-decode-of-random-batches-matches-t-seed1";
  std::filesystem::create_directories(dir);
  write_bytes(scratch / "precious", std::vector<std::byte>(3, std::byte{0x50}));
  std::filesystem::create_symlink(scratch / "precious", dir / "report.txt");
  write_bytes(dir / "01_stale.safetensors", std::vector<std::byte>(5, std::byte{0x51}));
  std::string out;
  CHECK(run_command(
            "METRALE_EMU_BLOCK_ACCESSES=1 " + fuzz.string() + " --cases 1 --batch 1 --seed 1 --out " + scratch.string(),
            out) == 1);
  CHECK_THAT(out, Catch::Matchers::Contains("FAILED at batch seed 1"));
  const auto fresh = scratch / "paged-paged-decode-of-random-batches-matches-t-seed1.2";
  CHECK_THAT(out, Catch::Matchers::Contains("to " + fresh.string() + ":"));
  CHECK(std::filesystem::is_regular_file(fresh / "report.txt"));
  CHECK_FALSE(std::filesystem::exists(fresh / "01_stale.safetensors"));
  // the earlier folder as it was
  CHECK(std::filesystem::is_symlink(dir / "report.txt"));
  CHECK(std::filesystem::file_size(scratch / "precious") == 3);
  CHECK(std::filesystem::file_size(dir / "01_stale.safetensors") == 5);
  std::filesystem::remove_all(scratch);
}

TEST_CASE("a fuzz driver refuses an --out it could not create, and leaves nothing where it could", "[cli]") {
  const auto fuzz = std::filesystem::path(METRALE_CLI).parent_path() / "fuzz_capacity";
  const auto scratch = test::scratch_dir("metrale_fuzz_out");
  std::filesystem::remove_all(scratch);
  std::filesystem::create_directories(scratch);
  write_bytes(scratch / "a_file", std::vector<std::byte>(1, std::byte{1}));
  auto run = [&](const std::filesystem::path& out_dir, std::string& out) {
    return run_command(fuzz.string() + " --cases 1 --seed 7 --out " + out_dir.string(), out);
  };
  std::string out;
  CHECK(run("/proc/metrale_fuzz_out/failures", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("--out '/proc/metrale_fuzz_out/failures': not a directory that can be "
                                            "created (no folder can be made in '/proc': "));
  // /proc's mkdir says ENOENT: said as the file system's refusal, not as a missing path.
  CHECK_THAT(out, Catch::Matchers::Contains("its file system makes none"));
  out.clear();
  CHECK(run(scratch / "a_file" / "failures", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("is not a folder"));
  out.clear();  // a loop of links: the driver's own words (it had ended with the library's exception)
  std::filesystem::create_symlink(scratch / "loop2", scratch / "loop1");
  std::filesystem::create_symlink(scratch / "loop1", scratch / "loop2");
  CHECK(run(scratch / "loop1", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("--out '" + (scratch / "loop1").string() +
                                            "': not a directory that can be created ('" + (scratch / "loop1").string() +
                                            "': Too many levels of symbolic links)"));
  std::filesystem::remove(scratch / "loop1"), std::filesystem::remove(scratch / "loop2");
  out.clear();  // a link to nothing (it had passed, and the failure's files were then lost)
  std::filesystem::create_symlink(scratch / "nowhere" / "x", scratch / "dangling");
  CHECK(run(scratch / "dangling", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("dangling' is not a folder"));
  std::filesystem::remove(scratch / "dangling");
  out.clear();
  CHECK(run(scratch / "new" / "failures", out) == 0);  // a clean run: no --out folder, no probe left
  CHECK(std::vector<std::filesystem::path>(std::filesystem::directory_iterator(scratch), {}) ==
        std::vector<std::filesystem::path>{scratch / "a_file"});
  std::filesystem::remove_all(scratch);
}

// Nineteenth session's adversarial run: use_nope = 2 ran as true and passed. (The thirty-first's:
// the message named the case twice.)
TEST_CASE("bad input: a kernel case's switch is 0 or 1", "[bad_input][kernel_case]") {
  emu::EmulatorBackend gpu;
  KernelCase rope = gen::k3_rope_case(2, 4, 8, 3, 10000.0f, true, 1);
  rope.scalars.at("use_nope") = KernelArg::u32(2);
  require_error([&] { (void)run_kernel_case(gpu, rope); }, Errc::invalid_argument,
                {"case " + rope.name + ": use_nope = 2, but it is a switch (0 or 1)"});
  try {
    (void)run_kernel_case(gpu, rope);
  } catch (const Error& e) {
    const std::string what = e.what(), named = "case " + rope.name;
    CHECK(what.find(named) == what.rfind(named));  // once
  }
  KernelCase sdpa = gen::k3_sdpa_case(2, 8, 8, 5, true, 1);
  sdpa.scalars.at("use_gate") = KernelArg::u32(7);
  require_error([&] { (void)run_kernel_case(gpu, sdpa); }, Errc::invalid_argument,
                {"use_gate = 7, but it is a switch (0 or 1)"});
}

TEST_CASE("bad input: a case run's summary counts the files that had nothing to check", "[bad_input][cli]") {
  SafeTensors f = recorded_decode_case();
  f.tensors.erase("expected.o");
  f.tensors.erase("tolerance.o");
  TempPath tmp(".safetensors");
  f.write(tmp.path);
  std::string out;
  // A run that compared nothing is no PASS (adversarial trial, forty-third session: it was one).
  CHECK(run_cli("case run --backend emu " + tmp.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("ran (no expectation)"));
  CHECK_THAT(out, Catch::Matchers::Contains("1 file on emu (1 ran with no expectation to check): NOTHING CHECKED"));
  CHECK_THAT(out, Catch::Matchers::Contains("case run: the file run has no expected.<output> tensor, so no output was "
                                            "compared; the emulator's memory checks passed"));
  // Two such files (the adversarial trial, forty-sixth session: "none of the files run has no ...").
  TempPath tmp2(".safetensors");
  f.write(tmp2.path);
  out.clear();
  CHECK(run_cli("case run --backend emu " + tmp.path.string() + " " + tmp2.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("case run: none of the files run has an expected.<output> tensor, so no "
                                            "output was compared"));
  // Beside a file that compares its output: a PASS, the line counting the other.
  out.clear();
  const std::string compared =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/" + "dsv3_h8_t300_fp8_0601_rope_pairs_bf16.safetensors";
  CHECK(run_cli("case run --backend emu " + tmp.path.string() + " " + compared, out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("2 files on emu (1 ran with no expectation to check): PASS"));
  // conform, which checks outputs, fails the file (it had passed it).
  TempPath dir("_noexp");
  std::filesystem::create_directories(dir.path);
  f.write(dir.path / "zq_noexp.safetensors");
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --only zq_noexp --cases " + dir.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("zq_noexp.safetensors: no expected.<output> tensor, so nothing to "
                                            "compare (it ran, and the emulator's memory checks passed)"));
  CHECK_THAT(out, Catch::Matchers::Contains("1 case, 1 failed"));
}

// Before: a case file without a tolerance for an output failed `case run` (an exact compare) and
// passed `conform` (same_arithmetic_tolerance) by one BF16 ulp (seventeenth session's adversarial run).
TEST_CASE("bad input: case run and conform judge an expectation without a tolerance alike", "[bad_input][cli]") {
  for (const int ulps : {1, 64}) {
    INFO(ulps << " ulps off");
    SafeTensors f = recorded_decode_case();
    f.tensors.erase("tolerance.o");
    Tensor& want = f.tensors.at("expected.o");
    REQUIRE(want.dtype == Dtype::bf16);
    std::vector<std::uint16_t> bits(want.numel());
    std::memcpy(bits.data(), want.data.data(), want.data.size());
    const auto peak = std::ranges::max_element(bits, {}, [](std::uint16_t b) { return b & 0x7FFF; });
    *peak = static_cast<std::uint16_t>(*peak + ulps);  // away from zero: the magnitude's bits count up
    std::memcpy(want.data.data(), bits.data(), want.data.size());
    TempPath dir("_tolerance");
    std::filesystem::create_directories(dir.path);
    f.write(dir.path / "no_tolerance.safetensors");
    const int expect = ulps == 1 ? 0 : 1;
    std::string out;
    CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == expect);
    out.clear();
    CHECK(run_cli("conform --backend emu --no-golden --cases " + dir.path.string() + " --only no_tolerance", out) ==
          expect);
  }
}

// The FP16 bits of f16_round(v) (finite values in FP16's range).
std::uint16_t fp16_bits(float v) {
  const float r = f16_round(v), a = std::fabs(r);
  const auto u = std::bit_cast<std::uint32_t>(r);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (a < 0x1p-14f) return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(a * 0x1p24f));  // subnormal
  const std::uint32_t exponent = ((u >> 23) & 0xFFu) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (exponent << 10) | ((u >> 13) & 0x3FFu));
}

// A BF16 output against an F32 expectation (a higher-precision reference's) without a tolerance:
// judged with BF16's one ULP, not F32's 1e-6 (which its own rounding, half an ULP, failed).
TEST_CASE("bad input: BF16 against F32 between an output and its expectation is judged at BF16's ULP",
          "[bad_input][cli]") {
  for (const double off : {0x1.8p-8, 0x1p-5}) {
    INFO("each value off by " << off << " of itself");
    SafeTensors f = recorded_decode_case();
    f.tensors.erase("tolerance.o");
    Tensor& want = f.tensors.at("expected.o");
    REQUIRE(want.dtype == Dtype::bf16);
    std::vector<float> values(want.numel());
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::uint16_t b = 0;
      std::memcpy(&b, want.data.data() + 2 * i, 2);
      values[i] = static_cast<float>(Bf16{b}.to_float() * (1 + off));
    }
    want = Tensor{Dtype::f32, want.shape, std::vector<std::byte>(values.size() * 4)};
    std::memcpy(want.data.data(), values.data(), want.data.size());
    TempPath dir("_f32_expectation");
    std::filesystem::create_directories(dir.path);
    f.write(dir.path / "f32_expectation.safetensors");
    const int expect = off < 0x1p-7 ? 0 : 1;
    std::string out;
    CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == expect);
    out.clear();
    CHECK(run_cli("conform --backend emu --no-golden --cases " + dir.path.string() + " --only f32_expectation", out) ==
          expect);
  }
  // The other way round: an F32 output (a split block's partials) against a BF16 expectation, which
  // had been judged by the floor alone (BF16's ULP count compares two BF16 values only).
  SafeTensors f = SafeTensors::read(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                                    "dsv3_h8_t300_fp8_0606_mla_paged_decode_wgmma16_fp8.safetensors");
  f.tensors.erase("tolerance.o_partial");
  f.tensors.erase("backend_tolerance.o_partial");
  Tensor& want = f.tensors.at("expected.o_partial");
  REQUIRE(want.dtype == Dtype::f32);
  std::vector<float> values(want.numel());
  std::memcpy(values.data(), want.data.data(), want.data.size());
  std::vector<std::uint16_t> bits(values.size());
  std::ranges::transform(values, bits.begin(), [](float v) { return Bf16::from_float(v).bits; });
  want = Tensor{Dtype::bf16, want.shape, std::vector<std::byte>(bits.size() * 2)};
  std::memcpy(want.data.data(), bits.data(), want.data.size());
  TempPath dir("_bf16_expectation");
  std::filesystem::create_directories(dir.path);
  f.write(dir.path / "bf16_expectation.safetensors");
  std::string out;
  CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 0);
  // An F16 expectation: its one ULP (2^-10), where it had been compared exactly.
  std::vector<std::uint16_t> halves(values.size());
  std::ranges::transform(values, halves.begin(), [](float v) { return fp16_bits(v); });
  want = Tensor{Dtype::f16, want.shape, std::vector<std::byte>(halves.size() * 2)};
  std::memcpy(want.data.data(), halves.data(), want.data.size());
  f.write(dir.path / "bf16_expectation.safetensors");
  out.clear();
  CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 0);
  // ULPs in a tolerance count between two BF16 values: for an F32 output they had no effect.
  f.tensors["tolerance.o_partial"] = f64_tensor({0, 0, 100000});
  f.write(dir.path / "bf16_expectation.safetensors");
  out.clear();
  CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 2);  // not run: an error
  CHECK_THAT(out, Catch::Matchers::Contains("tolerance.o_partial allows 100000 ulps, which count between BF16 "
                                            "values only, but o_partial is F32 against an expectation of F16"));
}

// The note on a golden folder's file that is not a model case (ml_dtypes' format tables) was
// printed under any --only, also one that picks a single replay of another file.
TEST_CASE("bad input: conform notes a golden file that is not a model case only where --only picks it",
          "[bad_input][cli]") {
  TempPath golden("_note_golden"), cases("_note_cases"), shadowed("_note_shadowed");
  std::filesystem::create_directories(golden.path);
  std::filesystem::create_directories(shadowed.path);
  std::filesystem::create_directories(cases.path);
  recorded_decode_case().write(cases.path / "zz_kernel.safetensors");  // (an empty --cases folder is refused)
  std::filesystem::copy_file(test::golden("quant_codecs.safetensors"), golden.path / "quant_codecs.safetensors");
  std::filesystem::copy_file(test::golden("dsv3_h16_t37.safetensors"), golden.path / "zq_dsv3.safetensors");
  recorded_decode_case().write(golden.path / "zr_kernel.safetensors");  // a kernel case among the golden ones
  // A second golden folder's file of the same name does not run; that is said where --only picks it too.
  std::filesystem::copy_file(test::golden("quant_codecs.safetensors"), shadowed.path / "quant_codecs.safetensors");
  // The number-format tables (which every default run meets in cases/golden) are named only when
  // --only names them; another file that is not a model case also where --only picks its kind.
  for (const auto& [only, codecs, kernel] : {std::tuple{"zq_dsv3 fp8 block 16 latent", false, false},
                                             {"quant_codecs", true, false},
                                             {"zr_kernel", false, true},
                                             {"model case file", false, true}}) {
    INFO("--only " << only);
    std::string out;
    const int code =
        run_cli("conform --backend emu --cases " + cases.path.string() + " --golden " + golden.path.string() +
                    " --golden " + shadowed.path.string() + " --only '" + only + "'",
                out, "METRALE_GOLDEN_DIR=");
    CHECK(code == (only == std::string("zq_dsv3 fp8 block 16 latent") ? 0 : 2));  // the others match no case
    CHECK((out.find("quant_codecs.safetensors is the number-format tables (the formats tests read them), not a model "
                    "case, skipped") != std::string::npos) == codecs);
    CHECK((out.find("zr_kernel.safetensors is not a model case") != std::string::npos) == kernel);
    CHECK((out.find("quant_codecs.safetensors skipped: ") != std::string::npos) == codecs);
  }
}

// A loop of symbolic links named as a folder, and a working folder removed under the run, had
// come out of conform as "error (internal): filesystem error" (case run and replay named them).
TEST_CASE("bad input: conform names a folder it cannot read, and finds its own from another folder",
          "[bad_input][cli]") {
  TempPath dir("_conform_folders");
  std::filesystem::create_directories(dir.path);
  const auto loop = dir.path / "loop_a";
  std::filesystem::create_symlink(dir.path / "loop_b", loop);
  std::filesystem::create_symlink(loop, dir.path / "loop_b");
  for (const std::string option : {"--no-golden --cases ", "--golden "}) {
    INFO(option);
    std::string out;
    CHECK(run_cli("conform --backend emu --only rope_pairs " + option + loop.string(), out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("conform: cannot read folder " + loop.string() + ": Too many levels"));
    CHECK_THAT(out, !Catch::Matchers::Contains("internal"));
  }
  // The default folders (cases/kernels, cases/golden), from a working folder without them or one
  // that is gone: the source tree's, said in a note (a run from another folder had passed with the
  // case files and golden replays left out).
  const auto gone = dir.path / "gone";
  std::filesystem::create_directories(gone);
  for (const std::string& cd :
       {"cd " + dir.path.string() + " &&", "cd " + gone.string() + " && rmdir " + gone.string() + " &&"}) {
    INFO(cd);
    std::string out;
    CHECK(run_cli("conform --backend emu --only rope_pairs", out, cd) == 0);
    for (const char* folder : {"cases/kernels", "cases/golden"})
      CHECK_THAT(out, Catch::Matchers::Contains(fmt::format("note: conform: no folder {} here; taking {}/{}", folder,
                                                            METRALE_SOURCE_DIR, folder)));
    CHECK_THAT(out, !Catch::Matchers::Contains("not found or empty"));
    CHECK_THAT(out, Catch::Matchers::Contains("file     rope_pairs_bf16"));  // the recorded case files ran
  }
  // Something under the default's name here is the run's, not a reason to take the source tree's:
  // a loop of links is an error, an empty folder a warning the summary repeats.
  const auto here = dir.path / "here";
  std::filesystem::create_directories(here / "cases" / "golden");
  std::filesystem::create_symlink(here / "cases" / "kernels", here / "cases" / "kernels");  // a link to itself
  std::string out;
  CHECK(run_cli("conform --backend emu --only rope_pairs", out, "cd " + here.string() + " &&") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform: cannot read folder cases/kernels: Too many levels"));
  std::filesystem::remove(here / "cases" / "kernels");
  std::filesystem::create_directories(here / "cases" / "kernels");
  out.clear();
  CHECK(run_cli("conform --backend emu --only rope_pairs", out, "cd " + here.string() + " &&") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("warning: conform: no .safetensors files in cases/kernels, skipped"));
  CHECK_THAT(out, Catch::Matchers::Contains("default folders not found or empty: cases/kernels, cases/golden"));
  CHECK_THAT(out, !Catch::Matchers::Contains("taking"));
  // METRALE_GOLDEN_DIR, which the user set, runs before the source tree's cases/golden (its file
  // of a shared name had been skipped for the source tree's), and --no-golden takes none.
  const auto golden = dir.path / "golden";
  std::filesystem::create_directories(golden);
  write_bytes(golden / "dsv3_h16_t37.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  out.clear();
  CHECK(run_cli("conform --backend emu --only dsv3_h16_t37", out,
                "cd " + dir.path.string() + " && METRALE_GOLDEN_DIR=" + golden.string()) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains((golden / "dsv3_h16_t37.safetensors").string() +
                                            ": file of 4 bytes is too short"));  // the user's file ran
  CHECK_THAT(out, Catch::Matchers::Contains(
                      fmt::format("golden case {}/cases/golden/dsv3_h16_t37.safetensors skipped", METRALE_SOURCE_DIR)));
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --only rope_pairs", out, "cd " + dir.path.string() + " &&") == 0);
  CHECK_THAT(out, !Catch::Matchers::Contains("cases/golden"));
}

// The thirty-first session's adversarial run: under --only a case file whose case could not be
// built (its metadata naming the kernel --only picks) was dropped unseen, and the run said PASS.
TEST_CASE("bad input: conform --only reports a broken case file of the kernel it picks", "[bad_input][cli]") {
  TempPath cases("_only_broken");
  std::filesystem::create_directories(cases.path);
  recorded_decode_case().write(cases.path / "aa_good.safetensors");
  SafeTensors bad = recorded_decode_case();
  bad.metadata["rowz"] = "8";  // not a parameter of its entry: the case cannot be built
  bad.write(cases.path / "zz_bad.safetensors");
  write_bytes(cases.path / "zz_unreadable.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  const std::string run = "conform --backend emu --no-golden --cases " + cases.path.string() + " --only ";
  std::string out;
  CHECK(run_cli(run + "mla_paged_decode_fp8", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL file zz_bad.safetensors"));
  CHECK_THAT(out, Catch::Matchers::Contains("metadata rowz = '8' is not a scalar parameter"));
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL file zz_unreadable.safetensors"));  // its kernel unknown: always run
  out.clear();  // another kernel's run: the bad file is not picked, the unreadable one still is
  CHECK(run_cli(run + "rope_pairs", out) == 2);
  CHECK_THAT(out, !Catch::Matchers::Contains("zz_bad"));
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL file zz_unreadable.safetensors"));
  // its summary row names it (fresh-user trial, forty-fourth session: the kernel column was blank)
  CHECK_THAT(out,
             Catch::Matchers::Contains("\nfile     unreadable file                                     1      1\n"));
}

// conform --report into a --cases folder, under a name that ends in .safetensors: the report's
// folder is no case (adversarial trial, fiftieth session: the run failed on its own output folder,
// and every later run again).
TEST_CASE("bad input: conform does not take its report folder for a case file", "[bad_input][cli]") {
  TempPath cases("_report_in_cases");
  std::filesystem::create_directories(cases.path);
  std::filesystem::copy_file(std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels" /
                                 "dsv3_h8_t300_fp8_0601_rope_pairs_bf16.safetensors",
                             cases.path / "rope.safetensors");
  const std::string run = "conform --backend emu --no-golden --only rope_pairs_bf16 --cases " + cases.path.string() +
                          " --report " + (cases.path / "r.safetensors").string();
  for (int i = 0; i < 2; ++i) {  // the second run finds the first's folder there
    INFO("run " << i);
    std::string out;
    CHECK(run_cli(run, out) == 0);
    CHECK_THAT(out, !Catch::Matchers::Contains("r.safetensors is not a regular file"));
    CHECK_THAT(out, Catch::Matchers::Contains("file     rope_pairs_bf16"));
  }
  CHECK(std::filesystem::is_regular_file(cases.path / "r.safetensors" / "report.json"));
}

// The thirty-first session's adversarial run: output to a full disk or a closed stream was lost
// with exit 0.
TEST_CASE("bad input: a command whose standard output cannot be written fails", "[bad_input][cli]") {
  TempPath err("_stdout_err");
  const auto status_of = [&](const std::string& redirect, const std::string& args = "info") {
    const std::string cmd = std::string(METRALE_CLI) + " " + args + " " + redirect + " 2>" + err.path.string();
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    std::ifstream in(err.path);
    return std::pair{WEXITSTATUS(status), std::string(std::istreambuf_iterator<char>(in), {})};
  };
  const auto [closed, closed_err] = status_of(">&-");
  CHECK(closed == 2);
  CHECK_THAT(closed_err, Catch::Matchers::Contains("error (invalid_argument): cannot write standard output ("));
  if (std::filesystem::exists("/dev/full")) {
    const auto [full, full_err] = status_of(">/dev/full");
    CHECK(full == 2);
    CHECK_THAT(full_err, Catch::Matchers::Contains("cannot write standard output (No space left on device)"));
    // --help and --version too (adversarial and fresh-user trials, forty-fourth session: exit 0)
    for (const std::string args : {"--help", "--version", "case --help"}) {
      INFO(args);
      const auto [code, text] = status_of(">/dev/full", args);
      CHECK(code == 2);
      CHECK_THAT(text, Catch::Matchers::Contains("cannot write standard output ("));
    }
    // and a print past the stdio buffer, which throws from inside fmt (adversarial trial,
    // forty-ninth session: "error (internal): cannot write to file")
    const auto [code, text] = status_of(
        ">/dev/full", "case show " + (std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels").string());
    CHECK(code == 2);
    CHECK_THAT(text, Catch::Matchers::Contains(
                         "error (invalid_argument): cannot write standard output (No space left on device)"));
    CHECK_THAT(text, !Catch::Matchers::Contains("internal"));
  }
  CHECK(status_of(">/dev/null").first == 0);
  CHECK(status_of(">/dev/null", "--help").first == 0);
}

// An error row named its file with the extension, every other row by its stem.
TEST_CASE("bad input: metrale case run names a file that cannot run as it names the others", "[bad_input][cli]") {
  TempPath dir("_case_run_labels");
  std::filesystem::create_directories(dir.path);
  recorded_decode_case().write(dir.path / "aa_good.safetensors");
  write_bytes(dir.path / "zz_broken.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  std::string out;
  CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("\naa_good "));
  CHECK_THAT(out, Catch::Matchers::Contains("\nzz_broken "));
  CHECK_THAT(out, !Catch::Matchers::Contains("zz_broken.safetensors "));
}

TEST_CASE("bad input: metrale case run reports path errors and empty folders", "[bad_input][cli]") {
  SECTION("a name too long for the file system") {
    // Before: std::filesystem::filesystem_error escaped main (std::terminate, exit 134).
    std::string out;
    const int code = run_cli("case run --backend emu " + std::string(5000, 'a'), out);
    CHECK(code == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("error (invalid_argument)"));
    CHECK_THAT(out, !Catch::Matchers::Contains("terminate"));
  }
  SECTION("a path that is not there") {
    // Before (fresh-user trial, forty-fifth session): a table row with an empty name for "nosuch/",
    // and the other paths run; now said before anything runs, with the folder it is relative to.
    std::string out;
    CHECK(run_cli("case run --backend emu nosuch/ " +
                      (std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "kernels").string() +
                      " nosuch2.safetensors",
                  out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("error (not_found): case run: nosuch/, nosuch2.safetensors do not exist "
                                              "(relative to " +
                                              std::filesystem::current_path().string() + ")"));
    CHECK_THAT(out, !Catch::Matchers::Contains("case file"));  // no table
    out.clear();  // a model case's path, likewise with the folder it is relative to
    CHECK(run_cli("replay --backend emu nosuch.safetensors", out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("safetensors file nosuch.safetensors does not exist (relative to " +
                                              std::filesystem::current_path().string() + ")"));
  }
  SECTION("a folder without case files") {
    // Before: "0 files on emu: PASS", exit 0.
    TempPath dir("_dir");
    std::filesystem::create_directories(dir.path);
    std::string out;
    CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("error (not_found): folder " + dir.path.string() +
                                              " holds no .safetensors case files"));
    CHECK_THAT(out, !Catch::Matchers::Contains("subfolders"));
    // Subfolders are not searched; those that hold case files are named.
    std::filesystem::create_directories(dir.path / "kernels");
    std::ofstream(dir.path / "kernels" / "a.safetensors").put('x');
    out.clear();
    CHECK(run_cli("case run --backend emu " + dir.path.string(), out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains(
                        "(subfolders are not searched; these hold some: " + (dir.path / "kernels").string() + ")"));
  }
}

TEST_CASE("bad input: conform --report fails when the report cannot be written", "[bad_input][cli]") {
  // Before: "PASS", exit 0, and no report (the writes were not checked).
  TempPath dir("_report");
  std::filesystem::create_directories(dir.path / "report.json");  // a folder where the file goes
  TempPath cases("_cases");
  std::filesystem::create_directories(cases.path);
  recorded_decode_case().write(cases.path / "one.safetensors");
  std::string out;
  CHECK(run_cli("conform --backend emu --no-golden --cases " + cases.path.string() + " --report " + dir.path.string(),
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform --report: cannot write " + (dir.path / "report.json").string()));
}

TEST_CASE("bad input: an empty path option is refused, not read as the option left out", "[bad_input][cli]") {
  // Before: `--record ""` ran without recording and `bench --json ""` / `conform --report ""`
  // wrote nothing, each exiting 0.
  for (const std::string args : {"--record '' info", "bench --backend emu --only gemv --json ''",
                                 "conform --backend emu --no-golden --report ''", "case run ''"}) {
    INFO(args);
    std::string out;
    CHECK(run_cli(args, out) > 100);  // a command-line mistake (CLI11's exit codes)
    CHECK_THAT(out, Catch::Matchers::Contains("an empty path"));
  }
}

TEST_CASE("bad input: an empty --backend and --golden beside --no-golden are refused", "[bad_input][cli]") {
  // Before: `--backend ""` ran on METRALE_BACKEND's choice, and --no-golden silently dropped --golden.
  std::string out;
  CHECK(run_cli("replay --backend '' x.safetensors", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("--backend: '' is not one of emu, cuda, auto"));
  // (CLI11's IsMember had shown an empty value as nothing: "--kv-cache:  not in {fp8,nvfp4}".)
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"replay x --kv-cache ''", "--kv-cache: '' is not one of fp8, nvfp4"},
           {"replay x --kv-layout Latent", "--kv-layout: 'Latent' is not one of separate, latent"},
           {"replay x --model kimi", "--model: 'kimi' is not one of deepseek, kimi-k3"},
           {"bench --sweep --cache fp8,fp16", "--cache: 'fp16' is not one of fp8, nvfp4"}}) {
    out.clear();
    CHECK(run_cli(args, out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains(want));
  }
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --golden /nonexistent", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("excludes --no-golden"));
}

// A write past the file-size limit is an error of the write, its .part file removed (the
// adversarial trial, forty-sixth session: SIGXFSZ ended the run and left the .part file).
TEST_CASE("bad input: a recording past the file-size limit (ulimit -f) fails with its .part file gone",
          "[bad_input][cli]") {
  TempPath dir("_rec_fsize");
  std::string out;
  CHECK(run_cli("--record " + dir.path.string() + " replay --backend emu " + std::string(METRALE_SOURCE_DIR) +
                    "/cases/golden/dsv3_h16_t37.safetensors",
                out, "ulimit -f 200;") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("safetensors (File too large)"));
  CHECK_THAT(out, Catch::Matchers::Contains("error (capacity_exceeded): "));  // not a bad argument
  REQUIRE(std::filesystem::is_directory(dir.path));  // the cases written before it stay
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    INFO(e.path());
    CHECK(e.path().string().find(".part") == std::string::npos);
  }
  // The recording stops there, and conform with it (the diff review, forty-sixth session: a later,
  // smaller case would have been written after the gap).
  std::filesystem::remove_all(dir.path);
  out.clear();
  CHECK(run_cli("--record " + dir.path.string() + " conform --backend emu --no-golden", out, "ulimit -f 200;") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("error (capacity_exceeded): conform: the run stopped after "));
  CHECK_THAT(out, Catch::Matchers::Contains("safetensors (File too large)"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    INFO(e.path());
    CHECK(e.path().string().find(".part") == std::string::npos);
  }
}

// A recording stopped at its limit stops the run (the fresh-user trial, forty-sixth session:
// conform went on, each later case failing alike, the smaller launches recorded after the gap).
TEST_CASE("bad input: a recording that reaches --record-limit stops conform and case run", "[bad_input][cli]") {
  TempPath dir("_rec_stop");
  const auto count = [&] {
    return std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator{});
  };
  std::string out;
  CHECK(run_cli("--record " + dir.path.string() + " --record-limit 300kB conform --backend emu --no-golden", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("error (capacity_exceeded): conform: the run stopped after "));
  CHECK_THAT(out, Catch::Matchers::Contains(", as the recording did: case "));
  CHECK_THAT(out, Catch::Matchers::Contains("past its limit of 300.0 kB"));
  CHECK_THAT(out, !Catch::Matchers::Contains("stopped at its limit of"));  // no case after the refused one ran
  // The summary covers the cases that ran, and says the run stopped (the diff review).
  CHECK_THAT(out, Catch::Matchers::Contains("failed") && Catch::Matchers::Contains("— FAIL (the run stopped early, "
                                                                                   "as the recording did: below)"));
  const auto written = count();
  CHECK(written > 0);
  std::filesystem::remove_all(dir.path);
  out.clear();
  CHECK(run_cli("--record " + dir.path.string() + " --record-limit 300kB case run --backend emu " +
                    std::string(METRALE_SOURCE_DIR) + "/cases/kernels",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("(the recording stopped: "));
  CHECK_THAT(out, Catch::Matchers::Contains(" files not run)"));
  CHECK_THAT(out, !Catch::Matchers::Contains("stopped at its limit of"));
  // In a golden file's replays: it stops after the replay whose launch the limit refused, and
  // quotes that refusal (the diff review, forty-sixth session: the file's later replays ran, and
  // the message quoted the last one's).
  std::filesystem::remove_all(dir.path);
  out.clear();
  TempPath report("_rec_stop_report");
  CHECK(run_cli("--record " + dir.path.string() +
                    " --record-limit 300kB conform --backend emu --only 'dsv3_h16_t37 fp8 block 16' --report " +
                    report.path.string(),
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform: the run stopped after 1 case, as the recording did: "));
  // and the report holds the case that ran
  std::ifstream report_json(report.path / "report.json");
  REQUIRE(report_json);
  const auto report_doc = nlohmann::json::parse(report_json);
  CHECK_THAT(report_doc.at("stopped").get<std::string>(),
             Catch::Matchers::StartsWith("conform: the run stopped after 1 case, as the recording did: "));
  CHECK(report_doc.at("pass") == false);
  const auto cases = report_doc.at("cases");
  REQUIRE(cases.size() == 1);
  CHECK_THAT(cases[0].at("error").get<std::string>(), Catch::Matchers::Contains("past its limit of 300.0 kB"));
  CHECK_THAT(out, Catch::Matchers::Contains("past its limit of 300.0 kB"));
  CHECK_THAT(out, !Catch::Matchers::Contains("stopped at its limit of"));
}

TEST_CASE("bad input: --record-limit and METRALE_RECORD_LIMIT", "[bad_input][cli]") {
  TempPath dir("_rec_limit");
  const std::string some_case =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0603_rope_pairs_bf16.safetensors";
  const std::string run = "--record " + dir.path.string() + " case run --backend emu " + some_case;
  std::string out;
  // A case bigger than the limit: refused before it runs, nothing written.
  CHECK(run_cli("--record-limit 1kb " + run, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("past its limit of 1.0 kB (0 bytes already written in 0 cases); the "
                                            "launch did not run"));
  // The folder it made for the run is gone again (it was left behind, empty).
  CHECK_THAT(out, Catch::Matchers::Contains("; removed the empty folders it made for it"));
  CHECK(!std::filesystem::exists(dir.path));
  // The same after the command (it was "not expected" there, exit 109), into a folder that was
  // there before: it stays.
  std::filesystem::create_directories(dir.path);
  out.clear();
  CHECK(run_cli("case run --backend emu " + some_case + " --record " + dir.path.string() + " --record-limit 1kb",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("past its limit of 1.0 kB"));
  CHECK_THAT(out, !Catch::Matchers::Contains("removed the empty folder"));
  CHECK(std::filesystem::is_empty(dir.path));
  // Folders it made under one that was there: those it made go, that one stays.
  const auto record_nothing = [&](const std::filesystem::path& into) {
    out.clear();
    return run_cli("--record-limit 1kb --record '" + into.string() + "' case run --backend emu " + some_case, out);
  };
  CHECK(record_nothing(dir.path / "a" / "b") == 2);
  CHECK(std::filesystem::is_empty(dir.path));
  // A folder that refuses a new one with ENOENT (/proc): its reason, not "/proc is not a folder".
  if (std::filesystem::is_directory("/proc/self")) {
    CHECK(record_nothing("/proc/metrale_no_such") == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("recorder: cannot create /proc/metrale_no_such: No such file"));
  }
  // Only the folders it made, however the path reaches them: `made/..` makes `made` (removed) and
  // then leads to folders that were there, and a link to a folder that holds files (kept). It had
  // taken everything after a missing component for its own, and removed the user's folders and link.
  const std::filesystem::path base = dir.path / "paths";
  std::filesystem::create_directories(base / "mine" / "inner");
  std::ofstream(base / "data") << "x";
  std::filesystem::create_directory_symlink(base / "mine", base / "link");
  for (const char* path : {"made/../mine/inner", "made/../link", "made/./x/../y/"}) {
    INFO(path);
    CHECK(record_nothing(base / path) == 2);
    CHECK(std::filesystem::is_directory(base / "mine" / "inner"));
    CHECK(std::filesystem::is_symlink(base / "link"));
    CHECK(!std::filesystem::exists(base / "made"));
  }
  // Not a folder: named, and what it made on the way removed.
  CHECK(record_nothing(base / "made" / ".." / "data") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("recorder: cannot record into " + (base / "made" / ".." / "data").string() +
                                            ": it is not a folder"));
  CHECK(!std::filesystem::exists(base / "made"));
  std::filesystem::create_symlink(base / "nowhere", base / "dangling");
  CHECK(record_nothing(base / "dangling") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("it is not a folder (a link to nothing, or to a file)"));
  CHECK(record_nothing(base / "dangling" / "sub") == 2);  // (was "cannot create …/sub: …/sub (No such file …)")
  CHECK_THAT(out, Catch::Matchers::Contains((base / "dangling").string() +
                                            " is not a folder (a link to nothing, or to a file)"));
  // A recording that writes removes the empty folders a `..` passed through, and keeps the rest.
  out.clear();
  CHECK(run_cli("--record '" + (base / "new" / "..").string() + "' case run --backend emu " + some_case, out) == 0);
  CHECK(std::filesystem::exists(base / "0000_rope_pairs_bf16.safetensors"));
  CHECK(!std::filesystem::exists(base / "new"));
  std::filesystem::remove_all(base);
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"0", "a size of 0 bytes (give a positive size)"},
           {"-5", "'-5' is not a size"},
           {"18446744073709551616",
            "'18446744073709551616' bytes is more than 2^64 - 1"},  // (was "error (internal): stoull")
           {"lots", "'lots' is not a size"},
           {"MB", "'MB' is not a size"},  // (was 1 MB: AsSizeValue reads a bare unit as one)
           {"1zb", "'1zb' is not a size: its unit 'zb' is none of B, KB or KiB, "},  // (was CLI11's unit list)
           {"1.5qb", "'1.5qb' is not a size: its unit 'qb' is none of "},            // (was '.5qb')
           {"1.5GB", "'1.5GB' is not a size (4GB, 500MB, 1024: a whole number, then a unit)"},
           {"99999999999GB", "'99999999999GB' bytes is more than 2^64 - 1"},
           // a space before or after, as the whole-number options refuse " 16" (both were taken)
           {" 5MB", "' 5MB' is not a size (4GB, 500MB, 1024: digits first, nothing after the unit)"},
           {"5MB ", "'5MB ' is not a size (4GB, 500MB, 1024: digits first, nothing after the unit)"}}) {
    out.clear();
    CHECK(run_cli(fmt::format("--record-limit '{}' {}", bad, run), out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains("--record-limit") && Catch::Matchers::Contains(why));
  }
  out.clear();
  CHECK(run_cli("--record-limit '2 GiB' info", out) == 0);  // a space between number and unit: CLI11's form
  CHECK_THAT(out, Catch::Matchers::Contains("case files (--record) at most 2147483648 bytes a run (--record-limit)"));
  out.clear();
  CHECK(run_cli(run, out, "METRALE_RECORD_LIMIT=4GB") == 2);
  // (and that units are the option's: fresh-user trial, forty-third session)
  CHECK_THAT(out, Catch::Matchers::Contains("METRALE_RECORD_LIMIT='4GB' is not a positive 64-bit integer (unset: "
                                            "4000000000 bytes, 4 GB); it takes bytes in digits, where "
                                            "--record-limit takes units (4GB)"));
  CHECK(std::filesystem::is_empty(dir.path));
  out.clear();
  CHECK(run_cli("--record-limit 1gb info", out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("--record-limit without --record: nothing is recorded"));
  // `info` says the limit, and refuses a bad one as a recording run does (it had passed silently).
  out.clear();
  CHECK(run_cli("info", out, "METRALE_RECORD_LIMIT=123456") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("case files (--record) at most 123456 bytes a run"));
  out.clear();
  CHECK(run_cli("info", out, "METRALE_RECORD_LIMIT=4GB") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("METRALE_RECORD_LIMIT='4GB' is not a positive 64-bit integer"));
  // An emulator setting in error: the whole list first, the setting in the emulator's place, then
  // the error naming it, after the list however stdout is buffered (the fresh-user trial,
  // forty-seventh session: info had printed the error alone).
  for (const char* setting : {"METRALE_EMU_THREADS=abc", "METRALE_RECORD_LIMIT=abc"}) {
    INFO(setting);
    out.clear();
    CHECK(run_cli("info", out, setting) == 2);
    const std::string name = std::string(setting).substr(0, std::string(setting).find('='));
    const auto list = out.find("backends\n"), place = out.find("emulator\n  an error: " + name + "='abc'"),
               last = out.find("error (invalid_argument): info: " + name + " (above) is an error");
    CHECK(list != std::string::npos);
    CHECK(place != std::string::npos);
    CHECK(last != std::string::npos);
    CHECK((list < place && place < last));
  }
  // --record-limit wins there as in a recording run (info had shown the variable's)
  out.clear();
  CHECK(run_cli("--record-limit 100 info", out, "METRALE_RECORD_LIMIT=4GB") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("case files (--record) at most 100 bytes a run (--record-limit)"));
}

// Each was once silent: spdlog skips a level it does not know, `info` makes no emulator to record,
// and a recording emulator that ran nothing wrote nothing.
TEST_CASE("bad input: an unknown log level and a --record that records nothing are said", "[bad_input][cli]") {
  std::string out;
  CHECK(run_cli("info", out, "SPDLOG_LEVEL=bogus,metrale=nah") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("SPDLOG_LEVEL: unknown level 'bogus' ignored"));
  CHECK_THAT(out, Catch::Matchers::Contains("unknown level 'nah' ignored"));
  out.clear();
  CHECK(run_cli("info", out, "SPDLOG_LEVEL=WARN,metrale=off") == 0);  // spdlog takes any case
  CHECK_THAT(out, !Catch::Matchers::Contains("unknown level"));
  out.clear();  // a METRALE_BACKEND that every command without --backend would refuse
  CHECK(run_cli("info", out, "METRALE_BACKEND=bogus") == 2);  // after the whole list (it was 0)
  CHECK_THAT(
      out, Catch::Matchers::Contains("without --backend: an error: METRALE_BACKEND 'bogus' is not emu, cuda or auto"));
  out.clear();  // and a command that makes a backend names the variable
  CHECK(run_cli("case run " + std::string(METRALE_SOURCE_DIR) + "/cases/golden/dsv3_h16_t37.safetensors", out,
                "METRALE_BACKEND=EMU") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("unknown backend 'EMU' from METRALE_BACKEND (expected emu, cuda or auto)"));
  out.clear();  // a model case given to case run: pointed to replay
  CHECK(run_cli("case run --backend emu " + std::string(METRALE_SOURCE_DIR) + "/cases/golden/dsv3_h16_t37.safetensors",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("(a model case: run it with metrale replay)"));
  out.clear();  // given to conform as a case file: pointed to --golden (it said "run it with metrale replay")
  CHECK(run_cli("conform --backend emu --no-golden --only dsv3_h16 --cases " + std::string(METRALE_SOURCE_DIR) +
                    "/cases/golden",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("dsv3_h16_t37.safetensors: a model case, not a kernel case: conform "
                                            "replays those from --golden DIR"));
  out.clear();  // whatever --only picks (the fresh-user trial, forty-sixth session: it passed without a word)
  CHECK(run_cli("conform --backend emu --no-golden --only wgmma16 --cases " + std::string(METRALE_SOURCE_DIR) +
                    "/cases/golden",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("dsv3_h16_t37.safetensors: a model case, not a kernel case: conform "
                                            "replays those from --golden DIR"));
  out.clear();  // the golden folder's number-format tables, given to case run and to replay
  const std::string tables = test::golden("quant_codecs.safetensors").string();
  CHECK(run_cli("case run --backend emu " + tables, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("(the number-format tables, which the formats tests read)"));
  out.clear();
  CHECK(run_cli("replay --backend emu " + tables, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("is not a model case (no q_nope tensor or heads metadata): it holds the "
                                            "number-format tables, which the formats tests read"));
  out.clear();  // an empty METRALE_BACKEND is auto, and said to be empty, not unset
  CHECK(run_cli("info", out, "METRALE_BACKEND=") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("without --backend: auto (METRALE_BACKEND empty)"));
  out.clear();
  CHECK(run_cli("info", out, "METRALE_BACKEND=emu") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("without --backend: emu (METRALE_BACKEND)\n"));
  out.clear();  // a backend that cannot run here is said to (exit 0: the setting is not in error)
  CHECK(run_cli("info", out, "METRALE_BACKEND=cuda") == 0);
  const auto usable = test::backends();
  const bool cuda_runs = std::ranges::find(usable, "cuda") != usable.end();
  CHECK_THAT(out, Catch::Matchers::Contains(
                      cuda_runs ? "without --backend: cuda (METRALE_BACKEND)\n"
                                : "without --backend: cuda (METRALE_BACKEND); it cannot run here, so the commands "
                                  "that run kernels fail without --backend"));
  TempPath dir("_record");
  out.clear();  // METRALE_CUDA_FATBIN_DIR: not a folder; a folder with one module's image; one with none
  CHECK(run_cli("info", out, "METRALE_CUDA_FATBIN_DIR=/nonexistent") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains(
                      "cuda kernel images: an error: METRALE_CUDA_FATBIN_DIR '/nonexistent' is not a folder"));
  std::filesystem::create_directories(dir.path);
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_FATBIN_DIR=" + dir.path.string()) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda kernel images: built in (METRALE_CUDA_FATBIN_DIR '" +
                                            dir.path.string() + "' holds no <module>.fatbin)"));
  std::ofstream(dir.path / "mla_wgmma.fatbin") << "x";
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_FATBIN_DIR=" + dir.path.string()) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda kernel images: mla_wgmma from METRALE_CUDA_FATBIN_DIR '" +
                                            dir.path.string() + "', "));
  CHECK_THAT(out, !Catch::Matchers::Contains("not loaded"));
  // Before: a .fatbin named after no module (a typo) was passed over without a word.
  std::ofstream(dir.path / "mla_fats.fatbin") << "x";
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_FATBIN_DIR=" + dir.path.string()) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda kernel images: not loaded, named after no module ("));
  CHECK_THAT(out, Catch::Matchers::Contains("): mla_fats.fatbin"));
  std::filesystem::remove(dir.path / "mla_fats.fatbin");
  // Before: a folder named as a module's image was reported as that module's image, which the CUDA
  // backend refuses (not a regular file).
  std::filesystem::create_directories(dir.path / "mla_fast.fatbin");
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_FATBIN_DIR=" + dir.path.string()) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda kernel images: an error: " + (dir.path / "mla_fast.fatbin").string() +
                                            " is not a regular file"));
  CHECK_THAT(out, Catch::Matchers::Contains("error (invalid_argument): info: METRALE_CUDA_FATBIN_DIR (above) is an "
                                            "error: the commands that use it refuse it"));
  std::filesystem::remove_all(dir.path);
#ifdef METRALE_WITH_CUDA
  // METRALE_CUDA_CLUSTER_POLICY: unset and empty (balance), each name, and one it does not know,
  // which info reports as it does a bad METRALE_CUDA_FATBIN_DIR (the CUDA backend refuses it).
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_CLUSTER_POLICY=") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda cluster placement: balance (METRALE_CUDA_CLUSTER_POLICY empty)"));
  out.clear();
  CHECK(run_cli("info", out, "env -u METRALE_CUDA_CLUSTER_POLICY") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("cuda cluster placement: balance (METRALE_CUDA_CLUSTER_POLICY unset)"));
  for (const char* name : {"balance", "spread", "default"}) {
    out.clear();
    CHECK(run_cli("info", out, std::string("METRALE_CUDA_CLUSTER_POLICY=") + name) == 0);
    CHECK_THAT(
        out, Catch::Matchers::Contains(fmt::format("cuda cluster placement: {} (METRALE_CUDA_CLUSTER_POLICY)", name)));
  }
  out.clear();
  CHECK(run_cli("info", out, "METRALE_CUDA_CLUSTER_POLICY=Spread") == 2);
  const std::string refused =
      "backend cuda: METRALE_CUDA_CLUSTER_POLICY 'Spread' is not balance, spread or default "
      "(unset or empty: balance)";
  CHECK_THAT(out, Catch::Matchers::Contains("cuda cluster placement: an error: " + refused));
  // and a command that makes a CUDA backend fails on it, naming it, where a driver answers (else
  // on the driver, as before).
  out.clear();
  CHECK(run_cli("bench --backend cuda --only gemv", out, "METRALE_CUDA_CLUSTER_POLICY=Spread") == 2);
  CHECK_THAT(out, Catch::Matchers::Contains(
                      CudaBackend::available() ? refused : "backend cuda: " + CudaBackend::unavailable_reason()));
#endif
  out.clear();
  CHECK(run_cli("--record " + dir.path.string() + " info", out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("info launches no kernels, so nothing was recorded"));
  out.clear();  // a subcommand named whole (fresh-user trial, fiftieth session: it said "case")
  CHECK(run_cli("--record " + dir.path.string() + " case show " + METRALE_SOURCE_DIR +
                    "/cases/kernels/dsv3_h8_t300_fp8_0601_rope_pairs_bf16.safetensors",
                out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("case show launches no kernels, so nothing was recorded"));
  out.clear();  // a folder no case file can be written in, named before the run (it had failed the first case)
  CHECK(run_cli("--record /proc/self case run --backend emu " + std::string(METRALE_SOURCE_DIR) +
                    "/cases/kernels/dsv3_h8_t300_fp8_0601_rope_pairs_bf16.safetensors",
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("recorder: cannot write a case file in /proc/self ("));
  CHECK_THAT(out, !Catch::Matchers::Contains("rope_pairs_bf16 "));  // no row: nothing ran
  out.clear();  // a case the emulator cannot run (a GB10's shared memory) is skipped: no launch
  const std::string wgmma16 =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0606_mla_paged_decode_wgmma16_fp8.safetensors";
  CHECK(run_cli("--record " + dir.path.string() + " case run --backend emu " + wgmma16, out,
                "METRALE_EMU_SHARED_BYTES=101376") == 2);  // nothing checked: an error
  CHECK_THAT(out, Catch::Matchers::Contains("recorder: wrote no kernel case to " + dir.path.string()));
  // --record runs on the emulator: over METRALE_BACKEND=cuda with a note, never over --backend cuda.
  const std::string gemv =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0599_mla_batched_gemv.safetensors";
  out.clear();
  CHECK(run_cli("--record " + dir.path.string() + " case run " + gemv, out, "METRALE_BACKEND=cuda") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("the emulator, not METRALE_BACKEND's cuda"));
  CHECK_THAT(out, Catch::Matchers::Contains("recorder: wrote 1 kernel case"));
  out.clear();
  CHECK(run_cli("--record " + dir.path.string() + " case run --backend cuda " + gemv, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("needs the emulator, not backend cuda"));
  std::filesystem::remove_all(dir.path);
}

TEST_CASE("backend auto says when it runs on the emulator, and why", "[cli]") {
  std::string info;
  REQUIRE(run_cli("info", info) == 0);
  const bool cuda_runs = info.find("runs here: yes  NVIDIA") != std::string::npos ||
                         info.find("cuda   built: yes  runs here: yes") != std::string::npos;
  std::string out;
  const std::string file =
      std::string(METRALE_SOURCE_DIR) + "/cases/kernels/dsv3_h8_t300_fp8_0606_mla_paged_decode_wgmma16_fp8.safetensors";
  CHECK(run_cli("case run " + file, out, "METRALE_BACKEND=auto") == 0);
  if (cuda_runs) {
    CHECK_THAT(out, !Catch::Matchers::Contains("backend auto: the emulator"));
  } else {  // the reason is the one info gives for cuda
    const auto at = info.find("runs here: no   ");
    REQUIRE(at != std::string::npos);
    const auto from = at + std::string("runs here: no   ").size();
    const std::string why = info.substr(from, info.find('\n', from) - from);
    CHECK_THAT(out, Catch::Matchers::Contains("backend auto: the emulator (cuda: " + why + ")"));
  }
}

TEST_CASE("bad input: an unknown command or option is named, at the top and under a command", "[bad_input][cli]") {
  // Before: `metrale case bogus` said only "A subcommand is required", and `metrale replay --bogus`
  // (fresh-user trial, thirty-ninth session) "FILE is required".
  // An unknown command names the commands there (fresh-user trial, forty-third session: it said
  // only "The following argument was not expected: frobnicate").
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"bogus", "metrale: unknown command 'bogus'; the commands: replay, info, case, conform, bench"},
           {"case bogus", "metrale case: unknown command 'bogus'; the commands: run, show"},
           {"replay --bogus", "metrale replay: unknown option --bogus (metrale replay --help lists its options)"},
           {"case run --bogus", "metrale case run: unknown option --bogus"},
           // none given: CLI11's line and the commands
           {"", "A subcommand is required\nThe commands of metrale: replay, info, case, conform, bench"},
           {"case", "A subcommand is required\nThe commands of metrale case: run, show (metrale case COMMAND --help)"},
           {"--bogus", "metrale: unknown option --bogus (metrale --help lists its options)"},
           // An option's value is not the command, and the command after it is named too (carried
           // since the forty-third session: only the option was).
           {"--backend emu bogus",
            "(metrale replay --backend ...); the commands that take it: replay, case run, conform, bench\n"
            "metrale: unknown command 'bogus'; the commands: replay, "},
           {"--backend=emu case bogus", "\nmetrale case: unknown command 'bogus'; the commands: run, show"},
           {"--sweep bogus", "\nmetrale: unknown command 'bogus'"},
           // --json is replay's flag and bench's FILE: its value skipped (the diff review)
           {"--json out.json bogus", "\nmetrale: unknown command 'bogus'"},
           // The fresh-user trial, forty-sixth session: CLI11's "At Most 1 required but received 2",
           // "not expected: FILE -m" and "not expected: G".
           {"replay F --kv-cache fp8 --kv-cache nvfp4",
            "metrale replay: --kv-cache given 2 times ('fp8', 'nvfp4'); it takes one value"},
           {"--record a --record b info", "metrale info: --record given 2 times ('a', 'b'); it takes one value"},
           // The adversarial trial, forty-seventh session: the values as a transform made them
           // ('1000000000'), and "--backend=" with the next word taken as its value.
           {"--record-limit 1GB --record-limit=2GB --record d info",
            "metrale info: --record-limit given 2 times ('1GB', '2GB'); it takes one value"},
           {"case run --backend= F",
            "metrale: --backend= has no value after the '=' (give --backend=VALUE, or the "
            "value as the next word)"},
           {"conform --only=", "metrale: --only= has no value after the '='"},
           {"replay -m kimi-k3 F",
            "metrale replay: unknown option -m; did you mean --model? (metrale replay --help lists its options)"},
           {"replay F G", "metrale replay: 'G' is left over: FILE takes one value, given as 'F'"}}) {
    INFO(args);
    std::string out;
    CHECK(run_cli(args, out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains(want));
    CHECK_THAT(out, Catch::Matchers::EndsWith("Run with --help for more information.\n"));
  }
  std::string out;  // --help is no error: no list after it
  CHECK(run_cli("--help", out) == 0);
  CHECK_THAT(out, !Catch::Matchers::Contains("The commands of"));
  // An option's values are not a command: no unknown command in these (the diff review: 'out.json'
  // and '8' were named)
  for (const std::string args : {"--json out.json", "--batch 1 8 bogus", "--cases a b"}) {
    INFO(args);
    out.clear();
    CHECK(run_cli(args, out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains("goes after the command"));
    CHECK_THAT(out, !Catch::Matchers::Contains("unknown command"));
  }
}

TEST_CASE("info lists the mla_wgmma blocks a played device runs, and says once why none", "[cli]") {
  // Before (fresh-user trial, fortieth session): "none: sm_90a only, and this plays sm_121" after
  // each of the four rows, spliced into the wrapped lines.
  std::string out;
  REQUIRE(run_cli("info", out, "METRALE_EMU_COMPUTE_CAPABILITY=121") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("its 16-head blocks up to 16 heads: none\n"));
  CHECK_THAT(out, Catch::Matchers::Contains("over one latent pool FP8 only): none\n"));
  const std::string why = "(none: mla_wgmma is sm_90a only, and this plays sm_121)";
  REQUIRE(out.find(why) != std::string::npos);
  CHECK(out.find(why) == out.rfind(why));
  out.clear();
  REQUIRE(run_cli("info", out, "METRALE_EMU_COMPUTE_CAPABILITY=90") == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("its 16-head blocks up to 16 heads: fp8, nvfp4\n"));
  CHECK_THAT(out, !Catch::Matchers::Contains("(none:"));
}

TEST_CASE("each command's --help names the top's options it takes too", "[bad_input][cli]") {
  // Before (fresh-user trial, forty-second session): only `metrale --help` listed --record, which
  // `metrale replay FILE --record DIR` takes.
  for (const std::string cmd : {"replay", "case run", "conform", "bench"}) {
    INFO(cmd);
    std::string out;
    CHECK(run_cli(cmd + " --help", out) == 0);
    CHECK_THAT(out, Catch::Matchers::Contains("Also taken here, as before the command: --record DIR, --record-limit"));
  }
  // Not where no kernel runs (fresh-user trial, forty-fourth session): info, and the group case.
  for (const std::string cmd : {"info", "case"}) {
    INFO(cmd);
    std::string out;
    CHECK(run_cli(cmd + " --help", out) == 0);
    CHECK_THAT(out, !Catch::Matchers::Contains("Also taken here"));
  }
}

TEST_CASE("bad input: a command's option given before its command or to another command says where it goes",
          "[bad_input][cli]") {
  // Before (fresh-user trial, fortieth session): only CLI11's "not expected: cuda --backend".
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--backend cuda bench",
            "--backend goes after the command (metrale bench --backend ...); the commands "
            "that take it: replay, case run, conform, bench"},
           {"--backend=emu case run x", "--backend goes after the command (metrale case run --backend ...)"},
           {"--backend emu info", "metrale info does not take --backend; the commands that take it: replay, "},
           // Before (fresh-user trial, forty-second session): "goes after the command", where it did.
           {"info --backend emu", "metrale info does not take --backend; the commands that take it: replay, "},
           {"bench --report x", "metrale bench does not take --report; the commands that take it: conform"},
           {"case --backend emu", "--backend goes after the command (metrale case run --backend ...)"},
           // Given a value, a command that takes one: bench's --json FILE, not replay's flag --json
           // (the adversarial trial, forty-fourth session); without one, replay's flag.
           {"--json out.json", "--json goes after the command (metrale bench --json ...)"},
           {"--json=out.json", "--json goes after the command (metrale bench --json ...)"},
           {"--json", "--json goes after the command (metrale replay --json ...)"},
           {"--only wgmma conform",
            "--only goes after the command (metrale conform --only ...); the commands that "
            "take it: conform, bench"}}) {
    INFO(args);
    std::string out;
    CHECK(run_cli(args, out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains(want));
    // in place of CLI11's line, which named the words last first ("emu --backend")
    CHECK_THAT(out, !Catch::Matchers::Contains("not expected"));
  }
  std::string out;  // an option no command takes gets no such line
  CHECK(run_cli("--bogus info", out) > 100);
  CHECK_THAT(out, !Catch::Matchers::Contains("goes after the command"));
  // but is named, with the command's nearest option within two edits (fresh-user trial,
  // forty-fifth session: CLI11's "not expected: kimi-k3 --modle", last word first)
  CHECK_THAT(out, Catch::Matchers::Contains("metrale info: unknown option --bogus (metrale info --help lists"));
  CHECK_THAT(out, !Catch::Matchers::Contains("did you mean"));
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"replay x --modle kimi-k3", "metrale replay: unknown option --modle; did you mean --model?"},
           {"case run --backnd emu x", "metrale case run: unknown option --backnd; did you mean --backend?"},
           {"--recrod d info", "metrale info: unknown option --recrod; did you mean --record?"}}) {
    INFO(args);
    out.clear();
    CHECK(run_cli(args, out) > 100);
    CHECK_THAT(out, Catch::Matchers::Contains(want));
    CHECK_THAT(out, !Catch::Matchers::Contains("not expected"));
  }
  // A flag given a value, which took the command's argument's place: said so after CLI11's line
  // (the adversarial trial, forty-fifth session: only the file was named, as not expected)
  out.clear();
  CHECK(run_cli("replay --json out.json x.safetensors", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("not expected: x.safetensors\n--json is a flag and takes no value: "
                                            "'out.json' was read as the next argument"));
  // --record that took the command as its folder: said so beside the unknown command
  out.clear();
  CHECK(run_cli("--record replay x.safetensors", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("unknown command 'x.safetensors'"));
  CHECK_THAT(out,
             Catch::Matchers::Contains(
                 "--record took 'replay' as its folder: the folder comes first (metrale --record DIR replay ...)"));
  // Any other outcome stays what it was, the hint after an error's line (the diff review: --help
  // printed only the hint, and another option's error was dropped).
  out.clear();
  CHECK(run_cli("--backend emu replay --help", out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("Usage:"));
  CHECK_THAT(out, !Catch::Matchers::Contains("goes after the command"));
  out.clear();
  CHECK(run_cli("--backend emu replay --kv-cache bogus x", out) == 105);
  CHECK_THAT(out, Catch::Matchers::Contains("--kv-cache: 'bogus' is not one of fp8, nvfp4"));
  CHECK_THAT(out, Catch::Matchers::Contains("--backend goes after the command (metrale replay --backend ...)"));
}

TEST_CASE("bad input: a whole-number option says what is wrong with its value", "[bad_input][cli]") {
  // Before: CLI11's Range called "1e3" and "2.5" "not in range 1 to 1000".
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"bench --group 1e3", "--group: '1e3' is not a whole number (decimal digits)"},
           {"bench --group 2.5", "--group: '2.5' is not a whole number (decimal digits)"},
           {"bench --group 0", "--group: '0' is outside 1 to 1000"},
           {"bench --sweep --heads 16,1e2", "--heads: '1e2' is not a whole number"},
           {"replay x --block-size 99999999999999999999",
            "--block-size: '99999999999999999999' is outside 1 to 1048576"}}) {
    std::string out;
    INFO(args);
    CHECK(run_cli(args, out) > 100);  // CLI11's validation exit codes
    CHECK_THAT(out, Catch::Matchers::Contains(want));
  }
  // Before: CLI11 read a leading zero as octal ("010" ran as 8) and refused "08" with "Could not
  // convert". Now decimal, as the check reads it.
  TempPath dir("_octal");
  std::string out;
  REQUIRE(run_cli("conform --backend emu --no-golden --seed 010 --only rope_pairs --report " + dir.path.string(),
                  out) == 0);
  std::ifstream in(dir.path / "report.json");
  CHECK(nlohmann::json::parse(in).at("seed") == 10);
}

// The emulator's report said only "backend: emu", whichever device it played (the entries and
// plans that ran differ between sm_90 and sm_121).
TEST_CASE("conform's report says the device the emulator played", "[cli]") {
  for (const auto& [cc, sms, shared] : {std::tuple{90, 132, 232448}, std::tuple{121, 48, 101376}}) {
    INFO("compute capability " << cc);
    TempPath dir("_report_device");
    std::string out;
    REQUIRE(run_cli("conform --backend emu --no-golden --only rope_pairs --report " + dir.path.string(), out,
                    "METRALE_EMU_COMPUTE_CAPABILITY=" + std::to_string(cc)) == 0);
    std::ifstream in(dir.path / "report.json");
    const auto device = nlohmann::json::parse(in).at("device");
    CHECK(device.at("backend") == "emu");
    CHECK(device.at("compute_capability") == cc);
    CHECK(device.at("multiprocessors") == sms);
    CHECK(device.at("max_shared_bytes_per_block") == shared);
    std::ifstream md(dir.path / "report.md");
    const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
    CHECK_THAT(text, Catch::Matchers::Contains(fmt::format("- compute_capability: {}\n", cc)));
    // The columns explained in the file itself (fresh-user trial, forty-second session).
    CHECK_THAT(text, Catch::Matchers::Contains("the fraction of its tolerance it used (at most 1 passes)"));
  }
}

TEST_CASE("bad input: conform --seed past 2^64 - 1 is refused, and the report holds the seed", "[bad_input][cli]") {
  // Before: 18446744073709551616 ran as 2^64 - 1, and report.json did not say which seed ran.
  std::string out;
  CHECK(run_cli("conform --backend emu --no-golden --seed 18446744073709551616", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("'18446744073709551616' is larger than 2^64 - 1"));
  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --seed -3", out) > 100);
  CHECK_THAT(out, Catch::Matchers::Contains("'-3' is not an unsigned decimal"));

  TempPath dir("_seed_report");
  TempPath cases("_seed_cases");
  std::filesystem::create_directories(cases.path);
  recorded_decode_case().write(cases.path / "one.safetensors");
  out.clear();
  REQUIRE(run_cli("conform --backend emu --no-golden --seed 18446744073709551615 --only one.safetensors --cases " +
                      cases.path.string() + " --report " + dir.path.string(),
                  out) == 0);
  std::ifstream in(dir.path / "report.json");
  const auto report = nlohmann::json::parse(in);
  CHECK(report.at("seed").get<std::uint64_t>() == 18446744073709551615ull);
  // And what else the run was asked for (before: neither report said which folders ran, what
  // --only kept, or how many cases were skipped).
  CHECK(report.at("only") == "one.safetensors");
  CHECK(report.at("case_folders") == nlohmann::json::array({cases.path.string()}));
  CHECK(report.at("golden_folders") == nlohmann::json::array());
  CHECK(report.at("folders_not_found") == nlohmann::json::array());
  CHECK(report.at("cases_skipped") == 0);
  CHECK(report.at("cases_run") == 1);
  std::ifstream md_in(dir.path / "report.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  for (const std::string& line : std::vector<std::string>{
           "- seed: 18446744073709551615\n", "- only: cases whose kernel or name holds 'one.safetensors'\n",
           "- case folders: " + cases.path.string() + "\n", "- golden folders: none\n",
           "- cases: 1 run, 0 failed, 0 skipped (the device cannot run them), "})
    CHECK_THAT(md, Catch::Matchers::Contains(line));
  // The kernel's row names the check nearest its tolerance, its error beside that fraction (before:
  // the largest error of any check beside the largest fraction of any, possibly two outputs).
  const auto& check = report.at("cases").at(0).at("checks").at(0);
  CHECK_THAT(md, Catch::Matchers::Contains(
                     fmt::format("| file | mla_paged_decode_fp8 | 1 | 0 | {} | {:.3e} | {:.3g} | - | - | - |",
                                 check.at("output").get<std::string>(), check.at("max_abs").get<double>(),
                                 check.at("tolerance_used").get<double>())));
}

TEST_CASE("bad input: conform fails a named golden folder that holds no model case", "[bad_input][cli]") {
  // Before: a named --golden folder holding only a kernel case passed with no word of it; then
  // (adversarial trial, forty-fourth session) with only a note that its file was skipped.
  TempPath golden("_kernel_golden");
  std::filesystem::create_directories(golden.path);
  recorded_decode_case().write(golden.path / "zq_kernel.safetensors");
  const std::string dir = golden.path.string();
  std::string out;
  CHECK(run_cli("conform --backend emu --only zq --cases " + dir + " --golden " + dir, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("zq_kernel.safetensors is not a model case (no q_nope tensor or heads "
                                            "metadata), skipped"));
  CHECK_THAT(out, Catch::Matchers::Contains("conform --golden " + dir +
                                            " holds no model case: its one .safetensors file is not one"));
  CHECK_THAT(out, Catch::Matchers::Contains("1 failed"));
  out.clear();  // the same folder through METRALE_GOLDEN_DIR, named as such
  CHECK(run_cli("conform --backend emu --only zq --cases " + dir, out, "METRALE_GOLDEN_DIR=" + dir) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("METRALE_GOLDEN_DIR " + dir + " holds no model case"));
  // A folder of the number-format tables alone is named as such (fresh-user trial, forty-ninth
  // session: "kernel case files go to --cases"), and --only that picks neither the folder nor its
  // file runs without that row.
  TempPath tables("_tables_golden");
  std::filesystem::create_directories(tables.path);
  std::filesystem::copy_file(
      std::filesystem::path(METRALE_SOURCE_DIR) / "cases" / "golden" / "quant_codecs.safetensors",
      tables.path / "quant_codecs.safetensors");
  out.clear();
  CHECK(run_cli("conform --backend emu --only quant --golden " + tables.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("conform --golden " + tables.path.string() +
                                            " holds no model case: its one .safetensors file is the number-format "
                                            "tables (the formats tests read them)"));
  CHECK_THAT(out, !Catch::Matchers::Contains("go to --cases"));
  out.clear();
  CHECK(run_cli("conform --backend emu --only rope_pairs --golden " + tables.path.string(), out) == 0);
  CHECK_THAT(out, !Catch::Matchers::Contains("holds no model case"));
}

TEST_CASE("conform --only runs the cases whose kernel or name holds the text, and refuses one that matches none",
          "[bad_input][cli]") {
  TempPath cases("_only_cases"), dir("_only_report");
  std::filesystem::create_directories(cases.path);
  recorded_decode_case().write(cases.path / "zq_one.safetensors");
  recorded_decode_case().write(cases.path / "other.safetensors");
  std::string out;
  REQUIRE(run_cli("conform --backend emu --no-golden --only zq_ --cases " + cases.path.string() + " --report " +
                      dir.path.string(),
                  out) == 0);
  std::ifstream in(dir.path / "report.json");
  const auto report = nlohmann::json::parse(in);
  REQUIRE(report.at("cases").size() == 1);
  CHECK(report.at("cases")[0].at("name") == "zq_one.safetensors");

  // By kernel: the generated cases of the combine, and nothing else (the recorded files are
  // another entry).
  REQUIRE(run_cli("conform --backend emu --no-golden --only decode_combine --cases " + cases.path.string() +
                      " --report " + dir.path.string(),
                  out) == 0);
  std::ifstream in2(dir.path / "report.json");
  const auto report2 = nlohmann::json::parse(in2);
  CHECK(!report2.at("cases").empty());
  for (const auto& c : report2.at("cases")) {
    CHECK(c.at("group") == "sweep");
    CHECK(c.at("kernel") == "mla_paged_decode_combine");
  }

  out.clear();
  CHECK(run_cli("conform --backend emu --no-golden --only zzz_nothing --cases " + cases.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no case matches --only 'zzz_nothing'"));
}

TEST_CASE("bad input: bench --torch names a baseline row's missing key", "[bad_input][cli]") {
  // Before: a row without B (or best_us) was looked up past the end of its JSON object (undefined
  // behaviour; on the H200 the row's baseline silently went missing).
  TempPath json("_torch.json");
  for (
      const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
          {R"({"matmul_tflops": 700, "rows": [{"L": 1024}]})", "rows[0] has no unsigned integer B"},
          {R"({"matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}, {"B": 1, "L": 2, "H": 3}]})",
           "rows[1] has no best_us (a number or null)"},
          {R"({"matmul_tflops": "fast"})",
           "matmul_tflops (a json string) is not a matmul rate from 1 to 1000000 TFLOP/s"},
          {R"({"matmul_tflops": -2.5})", "matmul_tflops -2.5 is not a matmul rate"},
          {R"({"matmul_tflops": 1e308})", "matmul_tflops 1e+308 is not a matmul rate"},
          // Before: both were taken (a roofline 10^300 times too long; a rate given in FLOP/s).
          {R"({"matmul_tflops": 1e-300})", "matmul_tflops 1e-300 is not a matmul rate"},
          {R"({"matmul_tflops": 7.9e14})", "matmul_tflops 790000000000000.0 is not a matmul rate"},
          // Before: the last of two keys was taken without a word.
          {R"({"rows": [], "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}]})",
           "the file has key 'rows' twice in one object"},
          {R"({"rows": [{"B": 1, "L": 2, "B": 4, "H": 3, "best_us": 1.5}]})",
           "the file has key 'B' twice in one object"},
          {R"({"matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": -5}]})",
           "rows[0] best_us -5 is not a positive time"},
          {R"({"matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}, {"B": 1, "L": 2, "H": 3, "best_us": 0}]})",
           "rows[1] best_us 0 is not a positive time"},
          // No baseline, or bench's own output (fresh-user trial, forty-fourth session: both passed).
          {R"({})", "no matmul_tflops: not the JSON bench/torch_baseline.py writes"},
          // Rows alone, as bench/torch_rows_h200.json (fresh-user trial, forty-sixth session): for --rows-from.
          {R"({"rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}]})",
           "no matmul_tflops: baseline rows without the ceilings, as bench/torch_rows_h200.json is; "
           "bench/torch_baseline.py OUT.json --rows-from "},
          {R"({"matmul_tflops": 700})", "no rows: not the JSON bench/torch_baseline.py writes"},
          {R"({"matmul_tflops": 700, "rows": []})", "rows is empty: no baseline"},
          {R"({"backend": "cuda", "copy_gbps": 3000, "rows": [{"kernel": "x"}]})",
           "metrale bench's own --json output, not the baseline"},
          {R"({"backend": "cuda", "copy_gbps": 3000, "sweep": []})", "metrale bench's own --json output"},
          // Before: a SIGSEGV (the value dumped into the message recursed off the stack).
          {"{\"matmul_tflops\": " + std::string(100'000, '[') + std::string(100'000, ']') + "}",
           "the file nests deeper than 8 levels"},
          {R"({"matmul_tflops": 700, "rows": {}})", "rows is not an array"},
          // Counted in one pass before the parse (the adversarial trial, forty-eighth session: the
          // parser callback that had checked the file took 51 s over 240,000 keys).
          {"{\"rows\": [0" +
               [] {
                 std::string zeros;  // a million more values: ",0" a million times
                 for (int i = 0; i < 1'000'000; ++i) zeros += ",0";
                 return zeros;
               }() +
               "]}",
           "the file holds more than 1000000 json values (a baseline row holds 7)"},
          // Before: the first of two rows of one shape was taken without a word; a B past 2^64 − 1
          // was "no unsigned integer B" (35th session's helper).
          {R"({"matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}, {"B": 1, "L": 2, "H": 3, "best_us": 2}]})",
           "rows[1] repeats rows[0]'s B 1, L 2, H 3"},
          {R"({"matmul_tflops": 700, "rows": [{"B": 18446744073709551616, "L": 2, "H": 3, "best_us": 1.5}]})",
           "rows[0] B is 1.8446744073709552e+19, not an unsigned 64-bit integer"},
          {R"([1, 2])", "not a JSON object"},
          // Before: the parser stopped at the NUL, the rest unread (adversarial trial, forty-ninth session).
          {std::string(R"({"matmul_tflops": 700})") + std::string(1, '\0') + " garbage {{{",
           "the file holds a NUL byte at offset 22"},
          // Rows timed otherwise than this run (--timing lone, the default) would move its ratios by
          // the host's launch latency (a file without "timing" predates the setting: lone).
          {R"({"timing": 5})", R"(timing 5 is not "blocking", "flush" or "lone")"},
          {R"({"timing": "flush", "matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}]})",
           "its rows were timed flush, this run times lone (--timing)"},
          {R"({"timing": "blocking", "matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}]})",
           "its rows were timed blocking, this run times lone (--timing)"}}) {
    INFO(text);
    std::ofstream(json.path) << text;
    std::string out;
    CHECK(run_cli("bench --backend emu --sweep --torch " + json.path.string(), out) == 2);
    CHECK_THAT(out, Catch::Matchers::Contains("bench --torch " + json.path.string() + ": " + want));
  }
  // The same timing both ways (and a file without one, lone): the file passes, and the sweep is
  // refused for want of a GPU.
  for (const char* timing : {"blocking", "flush", "lone", ""}) {
    const std::string rest = R"("matmul_tflops": 700, "rows": [{"B": 1, "L": 2, "H": 3, "best_us": 1.5}])";
    std::ofstream(json.path) << (*timing != '\0' ? fmt::format(R"({{"timing": "{}", {}}})", timing, rest)
                                                 : "{" + rest + "}");
    std::string out;
    CHECK(run_cli(fmt::format("bench --backend emu --sweep --timing {} --torch {}", *timing != '\0' ? timing : "lone",
                              json.path.string()),
                  out) == 2);
    CHECK_THAT(out, !Catch::Matchers::Contains("bench --torch"));
    CHECK_THAT(out, Catch::Matchers::Contains("bench --sweep needs a device (backend emu"));
    // and why CUDA is not it (fresh-user trial, forty-third session: it did not say)
#ifdef METRALE_WITH_CUDA
    if (!CudaBackend::available())
      CHECK_THAT(out, Catch::Matchers::Contains("; cuda cannot run here: " + CudaBackend::unavailable_reason()));
#else
    CHECK_THAT(out, Catch::Matchers::Contains("; cuda cannot run here: "));
#endif
  }
  // A group under blocking queues all its launches behind the held stream: refused past 100, before
  // any backend is made.
  {
    std::string out;
    // a command-line mistake: CLI11's exit code (adversarial trial, forty-ninth session: it was 2)
    CHECK(run_cli("bench --backend emu --timing blocking --group 101", out) == 105);  // CLI11's ValidationError
    CHECK_THAT(out, Catch::Matchers::Contains("--group: 101 with --timing blocking: at most 100"));
    CHECK_THAT(out, !Catch::Matchers::Contains("device-to-device copy"));
  }
  // On the emulator --timing flush has nothing to flush, blocking no stream to hold: said, not passed over.
  for (const char* timing : {"blocking", "flush"}) {
    std::string out;
    CHECK(run_cli(fmt::format("bench --backend emu --timing {} --only 'batched_gemv (seed)'", timing), out) == 0);
    CHECK_THAT(out, Catch::Matchers::Contains(fmt::format(
                        "bench: --timing {} times runs on a device; the emulator's figures are wall clock", timing)));
  }
  // Before: a FIFO blocked the read for ever.
  std::filesystem::remove(json.path);
  REQUIRE(mkfifo(json.path.c_str(), 0600) == 0);
  std::string out;
  CHECK(run_cli("bench --backend emu --sweep --torch " + json.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("bench --torch " + json.path.string() + ": not a regular file"));
}

TEST_CASE("bench --only matches a row's kernel and shape as the table prints them", "[bad_input][cli]") {
  // Before: the K3 rows' names for --only lacked the dq and dv their printed shape has.
  std::string out;
  CHECK(run_cli("bench --backend emu --only 'dq=192 dv=128'", out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("heads=8 seq=256 dq=192 dv=128 "));
  CHECK_THAT(out, Catch::Matchers::Contains("k3_sdpa_gate (split)"));
  CHECK_THAT(out, !Catch::Matchers::Contains("batched_gemv"));
}

TEST_CASE("bad input: bench --json keeps an existing file when the run fails", "[bad_input][cli]") {
  // Before: the file was truncated when bench started, so a refused --only left it empty.
  TempPath json("_old.json");
  std::ofstream(json.path) << "{\"precious\": 1}\n";
  std::string out;
  CHECK(run_cli("bench --backend emu --only zzz --json " + json.path.string(), out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("no row matches --only 'zzz'; the rows on backend emu: "
                                            "paged_decode_fp8 (seed) B=1 L=256 H=16; "));
  CHECK_THAT(out, !Catch::Matchers::Contains("device-to-device copy"));  // refused before any timing
  std::ifstream in(json.path);
  CHECK(nlohmann::json::parse(in).at("precious") == 1);
  // A file in /proc, which exists but takes no new files beside it: said as the file system's
  // refusal, not as "No such file" (adversarial trial, fiftieth session).
  out.clear();
  CHECK(run_cli("bench --backend emu --only zzz --json /proc/self/status", out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains(
                      "cannot write /proc/self/status (its folder's file system makes no new files: No such file"));
}

// `case show` against the file's own header: each scalar as its metadata holds it, each tensor's
// dtype and shape; a file that is no case is an error line (exit 2), and the others still print.
TEST_CASE("case show prints the kernel and launch and scalars and tensors a case file holds", "[cli]") {
  TempPath dir("_show");
  std::filesystem::create_directories(dir.path);
  const SafeTensors f = recorded_decode_case();
  f.write(dir.path / "a.safetensors");
  write_bytes(dir.path / "b.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  std::string out;
  CHECK(run_cli("case show " + dir.path.string(), out) == 2);
  INFO(out);
  CHECK_THAT(out, Catch::Matchers::Contains("kernel    " + f.meta("module") + "." + f.meta("entry") + "\n"));
  const auto dims = [](std::string d) { return "[" + std::regex_replace(d, std::regex(","), ", ") + "]"; };
  CHECK_THAT(out, Catch::Matchers::Contains("launch    grid " + dims(f.meta("grid")) + ", block " +
                                            dims(f.meta("block")) + " (recorded"));
  for (const char* scalar : {"block_size", "cache_stride", "inv_sqrt_d", "k_scale", "num_q_heads", "sliding_window"})
    CHECK_THAT(out, Catch::Matchers::Matches("(.|\n)*\n  " + std::string(scalar) + " +" +
                                             std::regex_replace(f.meta(scalar), std::regex("\\."), "\\.") +
                                             " \\((u32|i32|f32|u64)\\)\n(.|\n)*"));
  for (const auto& [name, t] : f.tensors) {
    if (name.starts_with("tolerance.")) continue;
    const std::string shown = name.starts_with("expected.") ? name.substr(9) : name;
    CHECK_THAT(out, Catch::Matchers::Contains(fmt::format("  {:<22} {} [{}], {} bytes\n", shown, to_string(t.dtype),
                                                          fmt::join(t.shape, ", "), t.data.size())));
  }
  CHECK_THAT(out, Catch::Matchers::Contains("tolerance abs "));
  CHECK_THAT(out, Catch::Matchers::Contains("b.safetensors\nerror (invalid_argument): "));
  // A shape of many dims: its first eight and a count (adversarial trial, fiftieth session: 400,000
  // dims made a 1.2 MB line).
  SafeTensors wide = f;
  Tensor& q = wide.tensors.at("q");
  q.shape = std::vector<std::int64_t>{static_cast<std::int64_t>(f.at("q").numel())};
  q.shape.resize(40, 1);
  wide.write(dir.path / "a.safetensors");
  out.clear();
  CHECK(run_cli("case show " + (dir.path / "a.safetensors").string(), out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains(fmt::format(
                      "  q                      BF16 [{}, 1, 1, 1, 1, 1, 1, 1, ... (40 dims)]", f.at("q").numel())));
}

// A golden replay's notes reach conform's output and report (the diff review, forty-eighth session:
// conform had dropped them, so its FAIL read as a kernel's error).
TEST_CASE("conform prints a golden replay's notes and writes them to its report", "[bad_input][cli]") {
  TempPath cases("_note_cases"), golden("_note_golden"), report("_note_report");
  for (const auto* d : {&cases, &golden}) std::filesystem::create_directories(d->path);
  recorded_decode_case().write(cases.path / "k.safetensors");
  test::scaled_case(SafeTensors::read(test::golden("dsv3_h16_t37.safetensors")), 14)
      .write(golden.path / "zsmall.safetensors");
  std::string out;
  CHECK(run_cli("conform --backend emu --only \"zsmall nvfp4 block 16\" --cases " + cases.path.string() + " --golden " +
                    golden.path.string() + " --report " + report.path.string(),
                out) == 1);
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL golden zsmall nvfp4 block 16"));
  CHECK_THAT(out, Catch::Matchers::Contains("  note: the nvfp4 cache stores "));
  std::ifstream json_file(report.path / "report.json"), md_file(report.path / "report.md");
  REQUIRE(json_file);
  const auto json = nlohmann::json::parse(json_file);
  std::size_t golden_cases = 0;  // (two pools and one latent pool); the kernel case has no note
  for (const auto& c : json["cases"]) {
    INFO(c.dump());
    const bool replay = c["group"] == "golden";
    golden_cases += replay ? 1 : 0;
    REQUIRE(c["notes"].size() == (replay ? 1u : 0u));
    if (replay) CHECK_THAT(c["notes"][0].get<std::string>(), Catch::Matchers::Contains("nvfp4 cache stores"));
  }
  CHECK(golden_cases >= 1);
  const std::string md{std::istreambuf_iterator<char>(md_file), std::istreambuf_iterator<char>()};
  CHECK_THAT(md, Catch::Matchers::Contains("- note: the nvfp4 cache stores"));
}

TEST_CASE("bad input: conform refuses same-named golden files that differ", "[bad_input][cli]") {
  TempPath cases("_dup_cases"), first("_dup_golden_a"), second("_dup_golden_b");
  for (const auto* d : {&cases, &first, &second}) std::filesystem::create_directories(d->path);
  recorded_decode_case().write(cases.path / "k.safetensors");
  write_bytes(first.path / "zq_dup.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  write_bytes(second.path / "zq_dup.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  const std::string args = "conform --backend emu --only zq --cases " + cases.path.string() + " --golden " +
                           first.path.string() + " " + second.path.string();
  std::string out;
  CHECK(run_cli(args, out) == 2);  // (the file itself is no case: its one replay fails)
  CHECK_THAT(out,
             Catch::Matchers::Contains("note: conform: golden case " + (second.path / "zq_dup.safetensors").string() +
                                       " skipped: " + (first.path / "zq_dup.safetensors").string() +
                                       ", a copy of it, is the file taken under that name"));
  write_bytes(second.path / "zq_dup.safetensors", std::vector<std::byte>(4, std::byte{0x42}));
  out.clear();
  CHECK(run_cli(args, out) == 2);
  CHECK_THAT(out,
             Catch::Matchers::Contains("error (invalid_argument): conform: golden case " +
                                       (second.path / "zq_dup.safetensors").string() + " differs from " +
                                       (first.path / "zq_dup.safetensors").string() +
                                       ", the file taken under that name: rename one, or name one folder (--golden)"));
  CHECK_THAT(out, !Catch::Matchers::Contains("FAIL golden"));  // refused before anything runs
  // The same under an --only that picks replays by their kernel, not the file's name (before: no
  // check, and no note).
  out.clear();
  CHECK(run_cli("conform --backend emu --only deepseek --cases " + cases.path.string() + " --golden " +
                    first.path.string() + " " + second.path.string(),
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("golden case " + (second.path / "zq_dup.safetensors").string() +
                                            " differs from "));
  // One that cannot be read (here a link to nothing) is named as such (before: said to differ).
  std::filesystem::remove(second.path / "zq_dup.safetensors");
  std::filesystem::create_symlink(second.path / "nothing", second.path / "zq_dup.safetensors");
  out.clear();
  CHECK(run_cli(args, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("error (invalid_argument): conform: cannot read golden case " +
                                            (second.path / "zq_dup.safetensors").string() + " ("));
  CHECK_THAT(out, !Catch::Matchers::Contains("differs from"));
}

TEST_CASE("bad input: conform reports an unreadable golden file as a failed case and a name that is not UTF-8",
          "[bad_input][cli]") {
  // Before: the unreadable golden file ended the run with an error and no report; a case file whose
  // name is not UTF-8 made writing report.json throw after the run (exit 2, no report).
  TempPath cases("_utf8_cases"), golden("_bad_golden"), dir("_utf8_report");
  std::filesystem::create_directories(cases.path);
  std::filesystem::create_directories(golden.path);
  recorded_decode_case().write(cases.path / "x\xff_zq.safetensors");
  write_bytes(golden.path / "zq_broken.safetensors", std::vector<std::byte>(4, std::byte{0x41}));
  std::string out;
  CHECK(run_cli("conform --backend emu --only zq --cases " + cases.path.string() + " --golden " + golden.path.string() +
                    " --report " + dir.path.string(),
                out) == 2);  // a case that could not run is an error (was 1, as for a comparison out of tolerance)
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL golden zq_broken"));
  CHECK_THAT(out, Catch::Matchers::Contains("error (invalid_argument): "));
  std::ifstream in(dir.path / "report.json");
  const auto report = nlohmann::json::parse(in);
  CHECK(report.at("cases_failed") == 1);
  bool broken = false, renamed = false;
  for (const auto& c : report.at("cases")) {
    const auto name = c.at("name").get<std::string>();
    if (name == "zq_broken") broken = !c.at("pass").get<bool>() && c.at("kernel") == "model case file";
    if (name == "x\\xFF_zq.safetensors") renamed = c.at("pass").get<bool>();  // the 0xFF escaped by printable()
  }
  CHECK(broken);
  CHECK(renamed);
  // --only that picks one of the replays it would have had, not its file name: still a failed
  // case (before, forty-third session: left out without a word, the run passing).
  out.clear();
  CHECK(run_cli("conform --backend emu --only 'zq_broken nvfp4' --golden " + golden.path.string() + " --cases " +
                    cases.path.string(),
                out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("FAIL golden zq_broken"));
  // Where the run is, on the log (fresh-user trial: nothing came before the summary).
  CHECK_THAT(out, Catch::Matchers::Contains("conform: 1 case file to pick from on emu ("));
  CHECK_THAT(out, Catch::Matchers::Contains("conform: 1 golden file to pick from on emu ("));
  out.clear();  // and one that none of them match: not picked, and nothing said of it
  CHECK(run_cli("conform --backend emu --only x --golden " + golden.path.string() + " --cases " + cases.path.string(),
                out) == 0);
  CHECK_THAT(out, !Catch::Matchers::Contains("zq_broken"));
}

// A folder the recorder may write in but not list (mode 0333): named, where it had been the
// library's "internal" filesystem error (the adversarial trial, forty-fifth session). As root
// (CI), who lists any folder, the CLI runs as nobody (util-linux's setpriv).
TEST_CASE("bad input: the recorder names a folder it cannot list", "[bad_input][cli]") {
  TempPath dir("_rec_noread");
  std::filesystem::create_directories(dir.path);
  std::filesystem::permissions(dir.path, std::filesystem::perms::owner_write | std::filesystem::perms::owner_exec |
                                             std::filesystem::perms::group_write | std::filesystem::perms::group_exec |
                                             std::filesystem::perms::others_write |
                                             std::filesystem::perms::others_exec);
  // The CLI and its case file copied where nobody may reach them (the checkout may lie under a
  // folder only root may enter).
  TempPath reach("_reach");
  std::filesystem::create_directories(reach.path);
  std::filesystem::permissions(reach.path, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                               std::filesystem::perms::group_exec |
                                               std::filesystem::perms::others_read |
                                               std::filesystem::perms::others_exec);
  std::filesystem::copy_file(METRALE_CLI, reach.path / "metrale");
  const auto file = reach.path / "case.safetensors";
  recorded_decode_case().write(file);
  const std::string as = ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  std::string out;
  // Where nobody cannot run the copy at all (no setpriv or user 65534, a temporary folder under one
  // only root may enter, libraries it cannot reach), there is nothing to test: said, not failed.
  if (run_command(as + (reach.path / "metrale").string() + " --version", out) != 0) {
    WARN("not run: the CLI cannot run as nobody here: " << out);
    return;
  }
  out.clear();
  CHECK(run_command(as + (reach.path / "metrale").string() + " --record " + dir.path.string() +
                        " case run --backend emu " + file.string(),
                    out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("error (invalid_argument): recorder: cannot list " + dir.path.string() +
                                            " to number its cases (Permission denied)"));
  std::filesystem::permissions(dir.path, std::filesystem::perms::owner_all);  // (for the cleanup)
}

TEST_CASE("bad input: the recorder stops before a case number it could not read back", "[bad_input][cli]") {
  // Before: numbers past 18 digits were not read back, so a later run numbered from the same
  // place again and overwrote the earlier run's cases.
  TempPath dir("_rec");
  std::filesystem::create_directories(dir.path);
  const auto last = dir.path / "9999999999999999998_mla_paged_decode_fp8.safetensors";
  recorded_decode_case().write(last);
  std::string out;
  const std::string run = "--record " + dir.path.string() + " case run --backend emu " + last.string();
  CHECK(run_cli(run, out) == 0);  // number 9999999999999999999, the last
  const auto made = dir.path / "9999999999999999999_mla_paged_decode_fp8.safetensors";
  REQUIRE(std::filesystem::exists(made));
  const double kb = std::filesystem::file_size(made) / 1e3;  // the case is under a megabyte
  REQUIRE(kb < 1000);
  CHECK_THAT(out, Catch::Matchers::Contains(
                      fmt::format("recorder: wrote 1 kernel case ({:.1f} kB) to {}", kb, dir.path.string())));
  out.clear();
  CHECK(run_cli(run, out) == 2);
  CHECK_THAT(out, Catch::Matchers::Contains("holds case number 9999999999999999999; numbers stop at"));
  // The warning ahead of it says so too (it had said "new ones are numbered from 10000000000000000000").
  CHECK_THAT(out, Catch::Matchers::Contains("already holds 2 case files, one numbered 9999999999999999999: no number "
                                            "is left for a new one"));
  CHECK_THAT(out, !Catch::Matchers::Contains("numbered from"));
  // Nothing overwritten, no partial file.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator{}) == 2);
  // Numbers of 20 digits or more (the adversarial trial, forty-fourth session: not counted, so
  // numbering went on below them): leading zeros count for nothing, anything more is past the last.
  TempPath other("_rec20");
  std::filesystem::create_directories(other.path);
  recorded_decode_case().write(other.path / "0000000000000000000000041_mla_paged_decode_fp8.safetensors");
  const std::string again = "--record " + other.path.string() + " case run --backend emu " + last.string();
  out.clear();
  CHECK(run_cli(again, out) == 0);
  CHECK_THAT(out, Catch::Matchers::Contains("new ones are numbered from 0042"));
  CHECK(std::filesystem::exists(other.path / "0042_mla_paged_decode_fp8.safetensors"));
  recorded_decode_case().write(other.path / "12345678901234567890_mla_paged_decode_fp8.safetensors");
  out.clear();
  CHECK(run_cli(again, out) == 2);
  // The file's own number, not the last one a run may write (as it had said).
  CHECK_THAT(out, Catch::Matchers::Contains("one numbered 12345678901234567890: no number is left for a new one"));
  CHECK_THAT(out, Catch::Matchers::Contains("holds case number 12345678901234567890; numbers stop at "
                                            "9999999999999999999"));
  CHECK(std::distance(std::filesystem::directory_iterator(other.path), std::filesystem::directory_iterator{}) == 3);
}
