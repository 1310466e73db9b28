// metrale bench: time the paged decode (both formats, seed and split paths), the batched GEMV
// and the K3 SDPA (seed and split paths) on a backend. On CUDA each launch is timed with events (median after warm-up)
// and set against a device-to-device copy measured in the same run; `--sweep` times the decode
// over batch × context × heads against the roofline (docs/performance.md) and, with `--torch`,
// against the PyTorch baseline of bench/torch_baseline.py. On the emulator, wall clock on small
// shapes shows the emulator's own speed.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "commands.hpp"
#include "metrale/buffer.hpp"
#include "metrale/error.hpp"
#include "metrale/files.hpp"
#include "metrale/formats.hpp"
#include "metrale/json_checks.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"
#include "metrale/paged_cache.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::cli {

namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

struct Row {
  std::string kernel, shape;
  double us = 0, bytes = 0, flops = 0;
};

class Bench {
 public:
  explicit Bench(GpuBackend& gpu) : gpu_(gpu) {
#ifdef METRALE_WITH_CUDA
    cuda_ = dynamic_cast<CudaBackend*>(&gpu);
#endif
  }
  bool on_device() const { return cuda_ != nullptr; }
  /// How the CUDA backend places a cluster's blocks (CudaBackend::cluster_policy); "" elsewhere.
  std::string cluster_policy() const {
#ifdef METRALE_WITH_CUDA
    if (cuda_ != nullptr) return cuda_->cluster_policy();
#endif
    return "";
  }
  /// Time every launch as a group of `n` back to back (0: as median_us says, by its length).
  void set_group(int n) { group_ = n; }
  /// How a timed run starts on a device (`bench --timing`; docs/performance.md, thirty-seventh and
  /// thirty-eighth sessions):
  /// - lone (the default): its start event on an idle stream, so the host's ~5 µs to launch on it
  ///   is in the time;
  /// - flush: queued behind a kFlushBytes memset on its stream, as triton.testing.do_bench runs
  ///   one (FlashMLA's benchmark times with it): the start event fires when the memset ends, with
  ///   the run's launches queued, so that latency is not in the time; but the memset leaves the
  ///   L2 full of dirty lines, whose write-back then shares the DRAM with the run;
  /// - blocking: the stream held (CudaBackend::time_ms `held`) while the run's launches queue, as
  ///   nvbench's blocking kernel holds it: that latency out of the time, and no memory traffic.
  enum class Timing { lone, flush, blocking };
  /// The timing `name` names (`bench --timing`, bench/torch_baseline.py's "timing"), if any.
  static std::optional<Timing> timing_named(std::string_view name) {
    if (name == "lone") return Timing::lone;
    if (name == "flush") return Timing::flush;
    if (name == "blocking") return Timing::blocking;
    return std::nullopt;
  }
  void set_timing(Timing t) { timing_ = t; }
  static constexpr std::size_t kFlushBytes = std::size_t{256} << 20;  // do_bench's cache flush

  /// Median microseconds of `launch` after a warm-up: as many runs as fit in about 0.2 s,
  /// at least 3 and at most `max_iters`; a single run when it takes over a second. Unless timed
  /// `blocking`, a launch shorter than 100 µs is timed as a group of back-to-back launches (up
  /// to 50) divided by their count, as a decode step follows the one before it in a stream (the
  /// ~5 µs a lone launch pays before its kernel starts would otherwise dominate). A group holds
  /// at least `min_group` launches (up to 50). `set_group` fixes the group's size.
  double median_us(const std::function<void()>& launch, int max_iters = 30, int min_group = 1) {
    launch();
    gpu_.synchronize(0);
    const double first = time_one(launch, 1);
    if (first > 1e6) return first;  // a second per run: one run says enough
    const int by_length =
        timing_ == Timing::blocking ? min_group : std::max(min_group, static_cast<int>(100.0 / std::max(first, 1.0)));
    const int group = group_ > 0 ? group_ : std::clamp(by_length, 1, 50);
    const int iters = std::clamp(static_cast<int>(2e5 / std::max(first * group, 1.0)), 3, max_iters);
    std::vector<double> us;
    for (int i = 0; i < iters; ++i) us.push_back(time_one(launch, group) / group);
    std::nth_element(us.begin(), us.begin() + static_cast<std::ptrdiff_t>(us.size() / 2), us.end());
    return us[us.size() / 2];
  }

  /// A buffer of `bytes` random bytes: 16 MiB drawn on the host, replicated on the device.
  DeviceBuffer random_buffer(std::size_t bytes, std::uint64_t seed, std::uint8_t mask = 0xFF) {
    DeviceBuffer b(gpu_, bytes);
    const std::size_t chunk = std::min<std::size_t>(bytes, 16u << 20);
    std::vector<std::uint8_t> host(chunk);
    std::mt19937_64 rng(seed);
    for (auto& x : host) x = static_cast<std::uint8_t>(rng()) & mask;
    upload<std::uint8_t>(gpu_, host, b.ptr());
    for (std::size_t off = chunk; off < bytes; off += chunk)
      gpu_.copy_d2d(b.ptr(), b.ptr() + off, std::min(chunk, bytes - off));
    return b;
  }

  /// BF16 values uniform in [-1, 1).
  DeviceBuffer random_bf16(std::size_t n, std::uint64_t seed) {
    std::vector<Bf16> host(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1, 1);
    for (auto& x : host) x = Bf16::from_float(uni(rng));
    return DeviceBuffer::from_host<Bf16>(gpu_, host);
  }

  /// Device-to-device copy bandwidth, bytes read plus written per second.
  double copy_bandwidth() {
    const std::size_t bytes = on_device() ? (std::size_t{1} << 30) : (std::size_t{64} << 20);
    const DeviceBuffer a = random_buffer(bytes, 1), b(gpu_, bytes);
    const int group = std::exchange(group_, 0);  // a 1 GiB copy: alone, whatever --group says
    const double us = median_us([&] { gpu_.copy_d2d(a.ptr(), b.ptr(), bytes); });
    group_ = group;
    return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
  }

 private:
  /// Microseconds of `count` launches in a row.
  double time_one(const std::function<void()>& launch, int count) {
    const auto run = [&] {
      for (int i = 0; i < count; ++i) launch();
    };
#ifdef METRALE_WITH_CUDA
    if (cuda_ != nullptr) {
      if (timing_ == Timing::flush) {
        if (flush_buffer_.empty()) flush_buffer_ = DeviceBuffer(gpu_, kFlushBytes);
        cuda_->memset(flush_buffer_.ptr(), 0, kFlushBytes);  // queued on the stream the run is timed on
      }
      return cuda_->time_ms(run, 0, timing_ == Timing::blocking) * 1e3;
    }
#endif
    const auto t0 = std::chrono::steady_clock::now();
    run();
    gpu_.synchronize(0);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }

  GpuBackend& gpu_;
  int group_ = 0;
  Timing timing_ = Timing::lone;
  DeviceBuffer flush_buffer_;  // kFlushBytes, made at the first timed run timed flush
#ifdef METRALE_WITH_CUDA
  CudaBackend* cuda_ = nullptr;  // the backend, when it is CUDA: events time it
#else
  void* cuda_ = nullptr;
#endif
};

// B sequences of L tokens of DeepSeek rows (576 wide) in a paged pool with permuted blocks: a K
// pool and a V pool (the seed ABI's layout, mla_cache_assemble's), or one latent pool passed as
// both (`latent`: V = K, FlashMLA's layout and the PyTorch baseline's).
class PagedProblem {
 public:
  static constexpr std::uint32_t kDim = 576, kBlock = 64;

  PagedProblem(Bench& bench, GpuBackend& gpu, KvFormat f, std::uint32_t B, std::uint32_t L, bool latent = false)
      : gpu_(gpu), f_(f), B_(B), L_(L), blocks_per_seq_((L + kBlock - 1) / kBlock), latent_(latent) {
    const std::uint32_t num_blocks = B * blocks_per_seq_;
    data_section_ = std::uint64_t{kBlock} * kDim / 2;
    block_stride_ = data_section_ + std::uint64_t{kBlock} * kDim / 16;
    const std::uint64_t pool =
        f == KvFormat::fp8 ? std::uint64_t{num_blocks} * kBlock * kDim : std::uint64_t{num_blocks} * block_stride_;
    // E4M3 codes with the top exponent bit clear: random, finite, never NaN (also valid NVFP4 scales).
    k_ = bench.random_buffer(pool, 2, 0xB7);
    if (!latent) v_ = bench.random_buffer(pool, 3, 0xB7);
    std::vector<std::int32_t> table(num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937_64(4));
    tables_ = DeviceBuffer::from_host<std::int32_t>(gpu, table);
    lens_ = DeviceBuffer::from_host<std::int32_t>(gpu, std::vector<std::int32_t>(B, static_cast<std::int32_t>(L)));
  }

  /// One decode launch over H heads on the seed kernel or the split path (`mma_only`: without
  /// the wgmma entries, as on a device other than sm_90).
  std::function<void()> launch(std::uint32_t H, bool split, DevicePtr q, DevicePtr o, bool mma_only = false) {
    const PagedDecodeCommon c{q,
                              k_.ptr(),
                              latent_ ? k_.ptr() : v_.ptr(),
                              o,
                              tables_.ptr(),
                              lens_.ptr(),
                              blocks_per_seq_,
                              H,
                              1,
                              kDim,
                              kDim,
                              kBlock,
                              1.0f / std::sqrt(192.0f),
                              B_};
    MlaFastKernels fast = fast_;
    if (mma_only)
      fast.wgmma_fp8 = fast.wgmma_nvfp4 = fast.wgmma16_fp8 = fast.wgmma16_nvfp4 = fast.wgmma16_rs_fp8 =
          fast.wgmma16_rs_nvfp4 = fast.wgmma16_rs_combine_fp8 = fast.wgmma_combine_fp8 = fast.wgmma_latent_fp8 =
              fast.wgmma_latent_combine_fp8 = fast.wgmma_latent_nvfp4 = fast.wgmma_latent_combine_nvfp4 =
                  KernelHandle{};
    return [this, c, split, fast] {
      if (f_ == KvFormat::fp8) {
        const PagedDecodeFp8Args a{c, 0.01f, 0.01f, kDim, 0, {}, {}, 0};
        if (!split) return mla_paged_decode_fp8(gpu_, seed_.paged_decode_fp8, a);
        if (paged_decode_fp8(gpu_, seed_, fast, a, ws_) != DecodePath::split) no_split();
      } else {
        const PagedDecodeNvfp4Args a{c, block_stride_, data_section_};
        if (!split) return mla_paged_decode_nvfp4(gpu_, seed_.paged_decode_nvfp4, a);
        if (paged_decode_nvfp4(gpu_, seed_, fast, a, ws_) != DecodePath::split) no_split();
      }
    };
  }

  /// Whether the split path of H heads runs on the wgmma entries.
  bool wgmma(std::uint32_t H) const {
    PagedDecodeCommon c;
    c.num_q_heads = H, c.q_head_dim = c.kv_cache_dim = kDim;
    return (f_ == KvFormat::fp8 ? fast_.wgmma_fp8 : fast_.wgmma_nvfp4).id != 0 &&
           wgmma_applies(c, f_, gpu_.max_shared_bytes_per_block(), 0, gpu_.multiprocessor_count());
  }

  [[noreturn]] void no_split() const {
    fail(Errc::unsupported, "bench: the split path does not fit the {} bytes of shared memory per block of backend {}",
         gpu_.max_shared_bytes_per_block(), gpu_.name());
  }

  /// What the step must move: q, each attended K and V row once (latent: one row a key), o.
  double bytes(std::uint32_t H) const {
    const double row = f_ == KvFormat::fp8 ? kDim : kDim / 2.0 + kDim / 16.0;
    return (latent_ ? 1.0 : 2.0) * static_cast<double>(B_) * L_ * row + 2.0 * 2 * static_cast<double>(B_) * H * kDim;
  }
  /// 2·(q_head_dim + kv_cache_dim)·keys per head.
  double flops(std::uint32_t H) const { return 2.0 * (kDim + kDim) * static_cast<double>(B_) * L_ * H; }

 private:
  GpuBackend& gpu_;
  KvFormat f_;
  std::uint32_t B_, L_, blocks_per_seq_;
  std::uint64_t data_section_ = 0, block_stride_ = 0;
  bool latent_;
  DeviceBuffer k_, v_, tables_, lens_;  // v_: none when latent
  MlaAbsorbedKernels seed_ = MlaAbsorbedKernels::resolve(gpu_);
  MlaFastKernels fast_ = MlaFastKernels::resolve(gpu_);
  DecodeWorkspace ws_;
};

Row bench_paged(Bench& bench, GpuBackend& gpu, KvFormat f, std::uint32_t B, std::uint32_t L, std::uint32_t H,
                bool split) {
  PagedProblem p(bench, gpu, f, B, L);
  const DeviceBuffer q = bench.random_bf16(std::size_t{B} * H * PagedProblem::kDim, 5);
  const DeviceBuffer o(gpu, std::size_t{B} * H * PagedProblem::kDim * 2);
  const double us = bench.median_us(p.launch(H, split, q.ptr(), o.ptr()));
  return {fmt::format("paged_decode_{} ({})", to_string(f), split ? "split" : "seed"),
          fmt::format("B={} L={} H={}", B, L, H), us, p.bytes(H), p.flops(H)};
}

// The GEMV kernels: the seed's, the wide one, and the wide one started early (its weights
// streaming in while the launch ahead of it finishes: GemvStart::early).
enum class GemvKernel { seed, wide, wide_early };

std::string to_string(GemvKernel g) {
  return g == GemvKernel::seed ? "seed" : g == GemvKernel::wide ? "wide" : "wide, early start";
}

// All heads' GEMV in one launch, rotating over enough weight copies to defeat the L2, timed as
// groups of 50 back to back: a lone launch takes about 11 µs of a back-to-back one's 5, so the
// group's first launch would add a microsecond to each of a 100 µs group's nine.
Row bench_gemv(Bench& bench, GpuBackend& gpu, std::uint32_t H, std::uint32_t n_out, std::uint32_t k, GemvKernel g) {
  const std::size_t w_bytes = std::size_t{H} * n_out * k * 2;
  const std::size_t copies = bench.on_device() ? std::max<std::size_t>(1, (256u << 20) / w_bytes) : 1;
  std::vector<DeviceBuffer> w;
  for (std::size_t i = 0; i < copies; ++i) w.push_back(bench.random_bf16(std::size_t{H} * n_out * k, 10 + i));
  const DeviceBuffer x = bench.random_bf16(std::size_t{H} * k, 6), y(gpu, std::size_t{H} * n_out * 2);
  const auto seed = MlaAbsorbedKernels::resolve(gpu);
  const auto fast = MlaFastKernels::resolve(gpu);
  std::size_t next = 0;
  const double us = bench.median_us(
      [&] {
        const BatchedGemvArgs a{x.ptr(), w[next++ % copies].ptr(), y.ptr(), n_out, k, H, k, n_out};
        if (g == GemvKernel::seed) return mla_batched_gemv(gpu, seed.batched_gemv, a);
        mla_batched_gemv_wide(gpu, fast.gemv_wide, a, 0,
                              g == GemvKernel::wide_early ? GemvStart::early : GemvStart::after);
      },
      30, 50);
  const double bytes = static_cast<double>(w_bytes) + 2.0 * H * (k + n_out);
  return {fmt::format("batched_gemv ({})", to_string(g)), fmt::format("H={} n_out={} k={}", H, n_out, k), us, bytes,
          2.0 * H * n_out * k};
}

// The K3 SDPA with gate over a resident history of `seq` tokens: the seed kernel, or the split
// path (k3_sdpa's split and combine).
Row bench_k3_sdpa(Bench& bench, GpuBackend& gpu, std::uint32_t heads, std::uint32_t seq, std::uint32_t dq,
                  std::uint32_t dv, bool split) {
  const std::size_t kb = std::size_t{seq} * heads * dq * 4, vb = std::size_t{seq} * heads * dv * 4;
  const DeviceBuffer k = bench.random_buffer(kb, 7, 0x3F), v = bench.random_buffer(vb, 8, 0x3F);  // small floats
  const DeviceBuffer q = bench.random_buffer(std::size_t{heads} * dq * 4, 9, 0x3F);
  const DeviceBuffer g = bench.random_buffer(std::size_t{heads} * dv * 4, 10, 0x3F);
  const DeviceBuffer out(gpu, std::size_t{heads} * dv * 4);
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  DecodeWorkspace ws;
  const double us = bench.median_us([&] {
    const K3SdpaArgs a{q.ptr(), k.ptr(), v.ptr(), g.ptr(), out.ptr(), seq, heads, dq, dv, true};
    if (!split) return k3_mla_sdpa_gate_f32(gpu, kernels.sdpa, a);
    if (k3_sdpa(gpu, kernels, a, ws) != DecodePath::split)
      fail(Errc::unsupported, "bench: the K3 split path does not take dq {} dv {}", dq, dv);
  });
  const double bytes = static_cast<double>(kb + vb) + 4.0 * heads * (dq + 2.0 * dv);
  return {fmt::format("k3_sdpa_gate ({})", split ? "split" : "seed"),
          fmt::format("heads={} seq={} dq={} dv={}", heads, seq, dq, dv), us, bytes,
          2.0 * (dq + dv) * static_cast<double>(seq) * heads};
}

void print_rows(const std::vector<Row>& rows, double copy_bw, ordered_json& j) {
  fmt::print("{:<33} {:<32} {:>12} {:>10} {:>8} {:>10}\n", "kernel", "shape", "us/launch", "GB/s", "% copy", "TFLOP/s");
  for (const auto& r : rows) {
    const double gbps = r.bytes / (r.us * 1e-6) / 1e9;
    fmt::print("{:<33} {:<32} {:>12.1f} {:>10.1f} {:>7.1f}% {:>10.2f}\n", r.kernel, r.shape, r.us, gbps,
               100.0 * gbps * 1e9 / copy_bw, r.flops / (r.us * 1e-6) / 1e12);
    j["rows"].push_back({{"kernel", r.kernel},
                         {"shape", r.shape},
                         {"us", r.us},
                         {"bytes", r.bytes},
                         {"flops", r.flops},
                         {"gbps", gbps},
                         {"copy_fraction", gbps * 1e9 / copy_bw}});
  }
}

// The largest group (--group) that --timing blocking queues behind its held stream: a decode step
// is two or three launches.
constexpr int kMaxBlockingGroup = 100;

// bench/torch_baseline.py's JSON nests three levels (the rows' objects) and holds about 320
// values in some KB (45 rows); a file far past either is not its.
constexpr int kMaxTorchJsonDepth = 8;
constexpr std::uint64_t kMaxTorchJsonValues = 1'000'000;
constexpr std::uintmax_t kMaxTorchJsonBytes = 64u << 20;

// The dense matmul rates a --torch file may give, in TFLOP/s: a GPU's, not a value in other units
// (FLOP/s would be 10^12 times it) or a typing slip.
constexpr double kLeastTflops = 1, kMostTflops = 1e6;

// bench/torch_baseline.py's output as the sweep reads it: an object (not bench's own --json);
// matmul_tflops a number from kLeastTflops to kMostTflops; rows a non-empty array of objects with
// unsigned B, L and H, each shape once, and best_us a positive number or null; timing, when there,
// a --timing name. Errors: `invalid_argument` naming the file, the row and the key.
void check_torch_json(const nlohmann::json& torch, const std::string& path) {
  if (!torch.is_object()) fail(Errc::invalid_argument, "bench --torch {}: not a JSON object", path);
  if (const auto it = torch.find("timing");
      it != torch.end() && !(it->is_string() && Bench::timing_named(it->get<std::string>())))
    fail(Errc::invalid_argument, "bench --torch {}: timing {} is not \"blocking\", \"flush\" or \"lone\"", path,
         it->dump(-1, ' ', false, ordered_json::error_handler_t::replace));
  if (const auto it = torch.find("matmul_tflops");
      it != torch.end() && !(it->is_number() && it->get<double>() >= kLeastTflops && it->get<double>() <= kMostTflops))
    fail(Errc::invalid_argument, "bench --torch {}: matmul_tflops {} is not a matmul rate from {} to {} TFLOP/s", path,
         it->is_number() ? it->dump() : fmt::format("(a json {})", it->type_name()), kLeastTflops,
         kMostTflops);  // a number shown
  // A file with no baseline would have the sweep run without one, unsaid (fresh-user trial,
  // forty-fourth session: {} passed; bench's own --json was "rows[0] has no unsigned integer B").
  if (torch.contains("sweep") || (torch.contains("backend") && torch.contains("copy_gbps")))
    fail(Errc::invalid_argument,
         "bench --torch {}: metrale bench's own --json output, not the baseline bench/torch_baseline.py writes", path);
  // Rows without the rates (bench/torch_rows_h200.json): what torch_baseline.py --rows-from reuses
  // (the fresh-user trial, forty-sixth session: the README had it read by --torch).
  if (torch.contains("rows") && !torch.contains("matmul_tflops"))
    fail(Errc::invalid_argument,
         "bench --torch {}: no matmul_tflops: baseline rows without the ceilings, as bench/torch_rows_h200.json is; "
         "bench/torch_baseline.py OUT.json --rows-from {} measures the ceilings and writes the file --torch reads",
         path, path);
  for (const char* key : {"matmul_tflops", "rows"})
    if (!torch.contains(key))
      fail(Errc::invalid_argument, "bench --torch {}: no {}: not the JSON bench/torch_baseline.py writes", path, key);
  if (!torch["rows"].is_array()) fail(Errc::invalid_argument, "bench --torch {}: rows is not an array", path);
  if (torch["rows"].empty()) fail(Errc::invalid_argument, "bench --torch {}: rows is empty: no baseline", path);
  std::size_t i = 0;
  std::map<std::array<std::uint64_t, 3>, std::size_t> seen;  // (B, L, H) -> its row
  for (const auto& r : torch["rows"]) {
    if (!r.is_object()) fail(Errc::invalid_argument, "bench --torch {}: rows[{}] is not an object", path, i);
    for (const char* key : {"B", "L", "H"}) {
      if (!r.contains(key))
        fail(Errc::invalid_argument, "bench --torch {}: rows[{}] has no unsigned integer {}", path, i, key);
      if (!r[key].is_number_unsigned())
        fail(Errc::invalid_argument, "bench --torch {}: rows[{}] {} is {}, not an unsigned 64-bit integer", path, i,
             key, r[key].dump());
    }
    if (!r.contains("best_us") || !(r["best_us"].is_number() || r["best_us"].is_null()))
      fail(Errc::invalid_argument, "bench --torch {}: rows[{}] has no best_us (a number or null)", path, i);
    if (r["best_us"].is_number() && !(r["best_us"].get<double>() > 0))
      fail(Errc::invalid_argument, "bench --torch {}: rows[{}] best_us {} is not a positive time", path, i,
           r["best_us"].dump());
    const std::array<std::uint64_t, 3> shape{r["B"].get<std::uint64_t>(), r["L"].get<std::uint64_t>(),
                                             r["H"].get<std::uint64_t>()};
    if (const auto [at, fresh] = seen.emplace(shape, i); !fresh)
      fail(Errc::invalid_argument, "bench --torch {}: rows[{}] repeats rows[{}]'s B {}, L {}, H {}", path, i,
           at->second, shape[0], shape[1], shape[2]);
    ++i;
  }
}

// The issue-6 sweep: split path (and the seed where it finishes in reasonable time) against the
// roofline max(bytes / copy bandwidth, FLOPs / BF16 matrix rate) and the PyTorch baseline.
/// The sweep's axes; each defaults to the full range.
struct SweepAxes {
  std::vector<std::string> caches{"fp8", "nvfp4"};
  std::vector<std::string> layouts{"separate"};
  std::vector<std::uint32_t> batch{1, 8, 32, 128}, context{1024, 4096, 16384, 65536}, heads{16, 64, 128};
};

void sweep(Bench& bench, GpuBackend& gpu, double copy_bw, const nlohmann::json& torch, const SweepAxes& axes,
           ordered_json& j) {
  const double mm = torch.contains("matmul_tflops") ? torch["matmul_tflops"].get<double>() * 1e12 : 0.0;
  auto torch_us = [&](std::uint32_t B, std::uint32_t L, std::uint32_t H) -> std::optional<double> {
    if (!torch.contains("rows")) return std::nullopt;
    for (const auto& r : torch["rows"])
      if (r["B"] == B && r["L"] == L && r["H"] == H && !r["best_us"].is_null()) return r["best_us"].get<double>();
    return std::nullopt;
  };
  // Without a matmul rate (no --torch, or one without matmul_tflops) the roofline counts the bytes
  // alone, so no fraction of it is printed (bench/sweep_table.py likewise).
  if (mm == 0)
    fmt::print(
        "no matmul rate (a --torch FILE with matmul_tflops gives it): the roofline counts the bytes alone, no % of "
        "it\n");
  fmt::print("{:<6} {:<8} {:>4} {:>6} {:>4} {:>11} {:>9} {:>8} {:>11} {:>7} {:>11} {:>7} {:>11} {:>7} {:>11} {:>7}\n",
             "cache", "layout", "B", "L", "H", "split us", "TFLOP/s", "GB/s", "roofline us", "% roof", "seed us",
             "x seed", "torch us", "x torch", "mma us", "x mma");
  for (const std::string& cache : axes.caches)
    for (const std::string& layout : axes.layouts)
      for (std::uint32_t B : axes.batch)
        for (std::uint32_t L : axes.context) {
          const KvFormat f = cache == "fp8" ? KvFormat::fp8 : KvFormat::nvfp4;
          PagedProblem p(bench, gpu, f, B, L, layout == "latent");
          for (std::uint32_t H : axes.heads) {
            const DeviceBuffer q = bench.random_bf16(std::size_t{B} * H * PagedProblem::kDim, 5);
            const DeviceBuffer o(gpu, std::size_t{B} * H * PagedProblem::kDim * 2);
            const double split_us = bench.median_us(p.launch(H, true, q.ptr(), o.ptr()));
            // The seed kernel: only where it takes well under a second (about 1.4 TFLOP/s at best).
            const bool seed_ok = p.flops(H) < 2e11;
            const double seed_us = seed_ok ? bench.median_us(p.launch(H, false, q.ptr(), o.ptr()), 5) : 0.0;
            const double roof_us = std::max(p.bytes(H) / copy_bw, mm > 0 ? p.flops(H) / mm : 0.0) * 1e6;
            const auto t_us = torch_us(B, L, H);
            // Where the split path runs on the wgmma entries, the mma.sync entries on the same step.
            const bool wgmma = p.wgmma(H);
            const double mma_us = wgmma ? bench.median_us(p.launch(H, true, q.ptr(), o.ptr(), true)) : 0.0;
            fmt::print(
                "{:<6} {:<8} {:>4} {:>6} {:>4} {:>11.1f} {:>9.1f} {:>8.0f} {:>11.1f} {:>7} {:>11} {:>7} {:>11} "
                "{:>7} {:>11} {:>7}\n",
                to_string(f), layout, B, L, H, split_us, p.flops(H) / split_us * 1e-6, p.bytes(H) / split_us * 1e-3,
                roof_us, mm > 0 ? fmt::format("{:.1f}%", 100.0 * roof_us / split_us) : "-",
                seed_ok ? fmt::format("{:.1f}", seed_us) : "-",
                seed_ok ? fmt::format("{:.1f}", seed_us / split_us) : "-", t_us ? fmt::format("{:.1f}", *t_us) : "-",
                t_us ? fmt::format("{:.2f}", *t_us / split_us) : "-", wgmma ? fmt::format("{:.1f}", mma_us) : "-",
                wgmma ? fmt::format("{:.2f}", mma_us / split_us) : "-");
            j["sweep"].push_back({{"cache", to_string(f)},
                                  {"layout", layout},
                                  {"B", B},
                                  {"L", L},
                                  {"H", H},
                                  {"split_us", split_us},
                                  {"wgmma", wgmma},
                                  {"mma_us", wgmma ? ordered_json(mma_us) : ordered_json()},  // none of its own
                                  {"seed_us", seed_ok ? ordered_json(seed_us) : ordered_json()},
                                  {"roofline_us", roof_us},
                                  {"bytes", p.bytes(H)},
                                  {"flops", p.flops(H)},
                                  {"torch_us", t_us ? ordered_json(*t_us) : ordered_json()}});
          }
        }
}

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    std::string backend, json, torch, only, timing = "lone";
    bool sweep = false;
    int group = 0;
    SweepAxes axes;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "time the decode kernels against the device's copy bandwidth");
  cmd->add_option("--backend", opts->backend, "emu, cuda or auto (default: METRALE_BACKEND, else auto)")
      ->check(backend_name());
  cmd->add_option("--json", opts->json, "also write the rows to this JSON file")
      ->option_text("FILE")
      ->check(non_empty_path());
  auto* sweep_flag = cmd->add_flag(
      "--sweep", opts->sweep,
      "the decode sweep against the roofline (needs a GPU): --cache x --layout x --batch x --context x --heads");
  // A sweep axis: a comma-separated list, each value checked, only with --sweep.
  auto axis = [&](const char* name, auto& values, const char* what, const CLI::Validator& check) {
    cmd->add_option(name, values, fmt::format("sweep: {}", what))
        ->transform(check)  // (integer_in rewrites "010" as 10)
        ->delimiter(',')
        ->capture_default_str()
        ->needs(sweep_flag);
  };
  axis("--cache", opts->axes.caches, "KV cache formats", one_of({"fp8", "nvfp4"}));
  axis("--layout", opts->axes.layouts,
       "cache layouts: separate (a K pool and a V pool, the seed ABI's) or latent (one pool as both: V = K)",
       one_of({"separate", "latent"}));
  axis("--batch", opts->axes.batch, "batch sizes", integer_in(1, 1024));
  axis("--context", opts->axes.context, "context lengths in tokens", integer_in(1, 1u << 20));
  axis("--heads", opts->axes.heads, "query head counts", integer_in(1, 1024));
  cmd->add_option("--only", opts->only, "run only the rows whose name contains this text (case-sensitive)")
      ->check(non_empty_filter());
  cmd->add_option("--group", opts->group,
                  fmt::format("time each launch as a group of this many back to back (default: as many as take 100 "
                              "us, at most 50, or 1 under --timing blocking; the GEMV rows 50, as the DeepSeek step "
                              "runs them; at most {} under --timing blocking)",
                              kMaxBlockingGroup))
      ->transform(integer_in(1, 1000))
      ->type_name("UINT");  // as the other counts (its int showed "INT:INT")
  cmd->add_option("--timing", opts->timing,
                  "how a timed run starts on a device: lone (its start event on an idle stream, the host's launch "
                  "latency in the time), flush (behind a 256 MiB memset, as triton.testing.do_bench: that latency "
                  "hidden, the memset's dirty L2 lines written back during the run) or blocking (its stream held "
                  "while its launches queue, as nvbench's blocking kernel: that latency hidden, no memory traffic; "
                  "no grouping by length)")
      ->capture_default_str()
      ->check(one_of({"blocking", "flush", "lone"}));
  cmd->add_option("--torch", opts->torch,
                  "the ceilings and PyTorch baseline rows that bench/torch_baseline.py wrote (JSON), set beside "
                  "the sweep's")
      ->option_text("FILE (with --sweep)")
      ->check(non_empty_path())
      ->needs(sweep_flag);
  cmd->callback([opts] {
    // Under blocking a group's launches queue behind the held stream: a few per step, well inside
    // the stream's queue (past it the backend's watchdog would fail the run after 2 s).
    // A command-line mistake: CLI11's exit code, as the options' own checks give.
    if (opts->timing == "blocking" && opts->group > kMaxBlockingGroup)
      throw CLI::ValidationError(
          "--group", fmt::format("{} with --timing blocking: at most {} (a group's launches all queue behind the held "
                                 "stream)",
                                 opts->group, kMaxBlockingGroup));
    auto gpu = make_backend(opts->backend);
    if (recorder_made())  // --record DIR: the emulator, writing a case file a launch
      spdlog::warn("bench: --record times the emulator writing every launch as a case file, not a device");
    Bench bench(*gpu);
    bench.set_group(opts->group);
    bench.set_timing(*Bench::timing_named(opts->timing));  // (--timing checked it)
    if (!bench.on_device() && opts->timing != "lone")
      spdlog::warn("bench: --timing {} times runs on a device; the emulator's figures are wall clock", opts->timing);
    // Every refusal before anything runs or a --json file is truncated (a bad --torch file first,
    // so that it is found without a device too).
    nlohmann::json torch = nlohmann::json::object();
    if (!opts->torch.empty()) {
      std::error_code ec;
      const auto type = fs::status(opts->torch, ec).type();
      if (type == fs::file_type::not_found) fail(Errc::not_found, "bench --torch {}: no such file", opts->torch);
      if (type != fs::file_type::regular)  // a FIFO would block the read for ever
        fail(Errc::invalid_argument, "bench --torch {}: not a regular file", opts->torch);
      // Read whole (a baseline is some KB) but no further than the bound, its shape checked in
      // one pass before it is parsed: nlohmann's parser callback, which had checked it, took 51 s
      // over 240,000 keys (the adversarial trial, forty-eighth session).
      std::string text;
      try {
        std::ifstream in(opts->torch, std::ios::binary);
        if (!in) fail(Errc::not_found, "bench --torch {}: cannot open the file", opts->torch);
        std::array<char, 1 << 16> chunk{};
        while (text.size() <= kMaxTorchJsonBytes &&
               (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0))
          text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
        if (in.bad()) fail(Errc::not_found, "bench --torch {}: cannot read the file", opts->torch);
      } catch (const std::ios_base::failure& e) {  // (libstdc++'s filebuf throws on a read error)
        fail(Errc::not_found, "bench --torch {}: cannot read the file ({})", opts->torch, e.what());
      }
      if (text.size() > kMaxTorchJsonBytes)
        fail(Errc::invalid_argument, "bench --torch {}: more than {} bytes, past a baseline's some KB", opts->torch,
             kMaxTorchJsonBytes);
      // The file's JSON is a few levels deep, and an object with a key twice is refused (the
      // parser would keep the last silently).
      check_json_shape(text, {fmt::format("bench --torch {}: the file", opts->torch), kMaxTorchJsonDepth,
                              kMaxTorchJsonValues, " (a baseline row holds 7)"});
      torch = nlohmann::json::parse(text);
      check_torch_json(torch, opts->torch);
      // Rows timed one way set against rows timed the other would move the ratios by the host's
      // launch latency (a file without "timing" predates the setting: lone).
      if (const std::string t = torch.value("timing", "lone"); t != opts->timing)
        fail(Errc::invalid_argument, "bench --torch {}: its rows were timed {}{}, this run times {} (--timing)",
             opts->torch, t, torch.contains("timing") ? "" : " (no \"timing\" key: a file from before the setting)",
             opts->timing);
    }
    if (opts->sweep && !bench.on_device()) {  // why the emulator: what CUDA lacks here, or the choice
      const std::string cuda = cuda_unusable_reason();
      fail(Errc::unsupported, "bench --sweep needs a device (backend {}; {})", gpu->name(),
           recorder_made() ? "--record runs every command on the emulator"
           : cuda.empty()  ? "--backend cuda runs it on this machine's GPU"
                           : "cuda cannot run here: " + cuda);
    }
    // An unwritable path fails before anything runs; an existing file stays until the end.
    if (!opts->json.empty()) with_context("bench --json", [&] { check_writable(opts->json); });
    // The rows, named before anything runs, so that --only can pick one (for a profiler, say) and
    // a --only that matches none is refused before the copy is measured.
    std::vector<std::pair<std::string, std::function<Row()>>> plan;
    // Rows the device cannot run (the split path's block past its shared memory: an emulator
    // playing a small device), with why: said, and the other rows run (fresh-user trial,
    // forty-fourth session: the first such row failed the whole run, its rows unprinted).
    std::vector<std::pair<std::string, std::string>> cannot_run;
    if (!opts->sweep) {
      auto paged = [&](KvFormat f, std::uint32_t B, std::uint32_t L, std::uint32_t H, bool split) {
        std::string name =
            fmt::format("paged_decode_{} ({}) B={} L={} H={}", to_string(f), split ? "split" : "seed", B, L, H);
        if (const std::uint32_t limit = gpu->max_shared_bytes_per_block();
            split && !split_fits(limit, PagedProblem::kDim))
          cannot_run.emplace_back(std::move(name),
                                  fmt::format("its smallest split block needs {} bytes of shared memory, the device "
                                              "allows {}",
                                              split_least_shared_bytes(PagedProblem::kDim), limit));
        else
          plan.emplace_back(std::move(name),
                            [&bench, &gpu, f, B, L, H, split] { return bench_paged(bench, *gpu, f, B, L, H, split); });
      };
      auto gemv = [&](std::uint32_t H, std::uint32_t n, std::uint32_t k, GemvKernel g) {
        plan.emplace_back(fmt::format("batched_gemv ({}) H={} n_out={} k={}", to_string(g), H, n, k),
                          [&bench, &gpu, H, n, k, g] { return bench_gemv(bench, *gpu, H, n, k, g); });
      };
      constexpr GemvKernel kGemvKernels[] = {GemvKernel::seed, GemvKernel::wide, GemvKernel::wide_early};
      auto sdpa = [&](std::uint32_t heads, std::uint32_t seq, bool split) {
        constexpr std::uint32_t dq = 192, dv = 128;  // K3: nope 128 + rope 64, v 128
        plan.emplace_back(
            fmt::format("k3_sdpa_gate ({}) heads={} seq={} dq={} dv={}", split ? "split" : "seed", heads, seq, dq, dv),
            [&bench, &gpu, heads, seq, split] { return bench_k3_sdpa(bench, *gpu, heads, seq, dq, dv, split); });
      };
      if (bench.on_device()) {
        for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4})
          for (std::uint32_t B : {1u, 8u, 32u})
            for (std::uint32_t L : {1024u, 4096u})
              for (std::uint32_t H : {16u, 128u})
                for (bool split : {false, true}) paged(f, B, L, H, split);
        for (GemvKernel g : kGemvKernels) gemv(128, 512, 128, g), gemv(128, 128, 512, g);
        // K3 (nope 128 + rope 64, v 128, FP32): the seed kernel where it takes under ~0.1 s.
        for (std::uint32_t heads : {16u, 64u})
          for (std::uint32_t seq : {1024u, 4096u, 16384u, 65536u}) {
            if (seq <= 16384) sdpa(heads, seq, false);
            sdpa(heads, seq, true);
          }
      } else {
        for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4})
          for (bool split : {false, true}) paged(f, 1, 256, 16, split);
        for (GemvKernel g : kGemvKernels) gemv(16, 512, 128, g);
        sdpa(8, 256, false), sdpa(8, 256, true);
      }
      std::vector<std::string> names;  // for a --only that matches none: what this backend has
      for (const auto& row : plan) names.push_back(row.first);
      const auto unwanted = [&](const auto& row) {
        return !opts->only.empty() && row.first.find(opts->only) == std::string::npos;
      };
      std::erase_if(plan, unwanted);
      std::erase_if(cannot_run, unwanted);
      for (const auto& [name, why] : cannot_run) spdlog::warn("bench: {} skipped: {}", name, why);
      if (plan.empty() && !cannot_run.empty())
        fail(Errc::unsupported, "bench: backend {} can run none of the rows selected", gpu->name());
      if (plan.empty())
        fail(Errc::not_found, "bench: no row matches --only '{}'; the rows on backend {}: {}", opts->only, gpu->name(),
             fmt::join(names, "; "));
    }
    const double copy_bw = bench.copy_bandwidth();
    fmt::print("backend {}; device-to-device copy {:.1f} GB/s (read + write){}\n\n", gpu->name(), copy_bw / 1e9,
               bench.on_device() ? fmt::format("; timing {}", opts->timing) : " — emulator wall clock, small shapes");
    ordered_json j{{"backend", gpu->name()}, {"copy_gbps", copy_bw / 1e9}, {"rows", ordered_json::array()}};
    if (bench.on_device()) j["timing"] = opts->timing;
    if (torch.contains("matmul_tflops")) j["matmul_tflops"] = torch["matmul_tflops"];
    // Where the baseline's rows came from, as bench/torch_baseline.py records it (not checked).
    for (const char* key : {"torch_version", "device", "rows_torch_version", "rows_device"})
      if (const auto it = torch.find(key); it != torch.end() && it->is_string()) j["torch"][key] = *it;
    if (opts->sweep) {
      // The clusters the plans count on (plan_split_decode): of each clustered entry's blocks, 1 to
      // 8 a cluster, as many as the device runs at once (none without the wgmma entries).
      const MlaFastKernels fast = MlaFastKernels::resolve(*gpu);
      const std::string policy = bench.cluster_policy();
      if (fast.wgmma16_rs_combine_fp8.id != 0) {
        const std::pair<const char*, const std::array<std::uint32_t, 9>*> entries[] = {
            {"wgmma16_rs_combine_fp8", &fast.fused_clusters},
            {"wgmma_combine_fp8", &fast.fused_clusters64},
            {"wgmma_latent_combine_fp8", &fast.fused_clusters_latent},
            {"wgmma_latent_combine_nvfp4", &fast.fused_clusters_latent_nvfp4}};
        fmt::print("clusters of 1..8 blocks at once{}:\n",
                   policy.empty() ? "" : " (cluster placement: " + policy + ")");
        ordered_json at_once;
        for (const auto& [entry, counts] : entries) {
          const std::vector<std::uint32_t> n(counts->begin() + 1, counts->end());
          fmt::print("  {:<28} {}\n", entry, fmt::join(n, " "));
          at_once[entry] = n;
        }
        fmt::print("\n");
        j["clusters_at_once"] = at_once;
      }
      if (!policy.empty()) j["cluster_policy"] = policy;
      sweep(bench, *gpu, copy_bw, torch, opts->axes, j);
    } else {
      std::vector<Row> rows;
      for (const auto& row : plan) rows.push_back(row.second());
      print_rows(rows, copy_bw, j);
    }
    if (!opts->json.empty())
      with_context("bench --json", [&] {
        StagedFile(opts->json, j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + '\n').commit();
      });
  });
}

}  // namespace metrale::cli
