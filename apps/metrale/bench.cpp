// metrale bench: time the paged decode (both formats), the batched GEMV and the K3 SDPA on a
// backend. On CUDA each launch is timed with events (median of many after warm-up) and set
// against a device-to-device copy measured in the same run; on the emulator, wall clock on
// small shapes shows the emulator's own speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends.hpp"
#include "commands.hpp"
#include "metrale/buffer.hpp"
#include "metrale/formats.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/paged_cache.hpp"
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::cli {

namespace {

struct Row {
  std::string kernel, shape;
  double us = 0, bytes = 0, flops = 0;
};

class Bench {
 public:
  Bench(GpuBackend& gpu, int iters) : gpu_(gpu), iters_(iters) {
#ifdef METRALE_WITH_CUDA
    cuda_ = dynamic_cast<CudaBackend*>(&gpu);
#endif
  }
  bool on_device() const { return cuda_ != nullptr; }

  /// Median microseconds of `launch` (which may rotate its inputs) after warm-up.
  double median_us(const std::function<void()>& launch) {
    for (int i = 0; i < 3; ++i) launch();
    gpu_.synchronize(0);
    std::vector<double> us;
    for (int i = 0; i < iters_; ++i) us.push_back(time_one(launch));
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
    const double us = median_us([&] { gpu_.copy_d2d(a.ptr(), b.ptr(), bytes); });
    return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
  }

 private:
  double time_one(const std::function<void()>& launch) {
#ifdef METRALE_WITH_CUDA
    if (cuda_ != nullptr) return cuda_->time_ms(launch) * 1e3;
#endif
    const auto t0 = std::chrono::steady_clock::now();
    launch();
    gpu_.synchronize(0);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }

  GpuBackend& gpu_;
  int iters_;
#ifdef METRALE_WITH_CUDA
  CudaBackend* cuda_ = nullptr;  // the backend, when it is CUDA: events time it
#else
  void* cuda_ = nullptr;
#endif
};

// The seed paged decode over B sequences of L tokens, H heads, DeepSeek rows (576 wide).
Row bench_paged(Bench& bench, GpuBackend& gpu, KvFormat f, std::uint32_t B, std::uint32_t L, std::uint32_t H) {
  const std::uint32_t dim = 576, bs = 64, blocks_per_seq = (L + bs - 1) / bs, num_blocks = B * blocks_per_seq;
  const std::uint64_t data_section = std::uint64_t{bs} * dim / 2,
                      block_stride = data_section + std::uint64_t{bs} * dim / 16;
  const std::uint64_t pool =
      f == KvFormat::fp8 ? std::uint64_t{num_blocks} * bs * dim : std::uint64_t{num_blocks} * block_stride;
  // E4M3 codes with the top exponent bit clear: random, finite, never NaN (also valid NVFP4 scales).
  const DeviceBuffer k = bench.random_buffer(pool, 2, 0xB7), v = bench.random_buffer(pool, 3, 0xB7);
  std::vector<std::int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(4));  // permuted physical blocks
  const auto tables = DeviceBuffer::from_host<std::int32_t>(gpu, table);
  const auto lens =
      DeviceBuffer::from_host<std::int32_t>(gpu, std::vector<std::int32_t>(B, static_cast<std::int32_t>(L)));
  const DeviceBuffer q = bench.random_bf16(std::size_t{B} * H * dim, 5), o(gpu, std::size_t{B} * H * dim * 2);
  const auto kernels = MlaAbsorbedKernels::resolve(gpu);
  const PagedDecodeCommon c{q.ptr(),
                            k.ptr(),
                            v.ptr(),
                            o.ptr(),
                            tables.ptr(),
                            lens.ptr(),
                            blocks_per_seq,
                            H,
                            1,
                            dim,
                            dim,
                            bs,
                            1.0f / std::sqrt(192.0f),
                            B};
  const double us = bench.median_us([&] {
    if (f == KvFormat::fp8)
      mla_paged_decode_fp8(gpu, kernels.paged_decode_fp8, {c, 0.01f, 0.01f, dim, 0, {}, {}, 0});
    else
      mla_paged_decode_nvfp4(gpu, kernels.paged_decode_nvfp4, {c, block_stride, data_section});
  });
  const double keys = static_cast<double>(B) * L;
  const double row_bytes = f == KvFormat::fp8 ? dim : dim / 2.0 + dim / 16.0;
  const double bytes =
      2.0 * keys * row_bytes + 2.0 * 2 * static_cast<double>(B) * H * dim;  // K and V rows once; q and o
  const double flops = 2.0 * (dim + dim) * keys * H;
  return {fmt::format("paged_decode_{} (seed)", to_string(f)), fmt::format("B={} L={} H={}", B, L, H), us, bytes,
          flops};
}

// All heads' GEMV in one launch, rotating over enough weight copies to defeat the L2.
Row bench_gemv(Bench& bench, GpuBackend& gpu, std::uint32_t H, std::uint32_t n_out, std::uint32_t k) {
  const std::size_t w_bytes = std::size_t{H} * n_out * k * 2;
  const std::size_t copies = bench.on_device() ? std::max<std::size_t>(1, (256u << 20) / w_bytes) : 1;
  std::vector<DeviceBuffer> w;
  for (std::size_t i = 0; i < copies; ++i) w.push_back(bench.random_bf16(std::size_t{H} * n_out * k, 10 + i));
  const DeviceBuffer x = bench.random_bf16(std::size_t{H} * k, 6), y(gpu, std::size_t{H} * n_out * 2);
  const auto kernel = gpu.kernel(kMlaAbsorbedModule, "mla_batched_gemv");
  std::size_t next = 0;
  const double us = bench.median_us([&] {
    mla_batched_gemv(gpu, kernel, {x.ptr(), w[next++ % copies].ptr(), y.ptr(), n_out, k, H, k, n_out});
  });
  const double bytes = static_cast<double>(w_bytes) + 2.0 * H * (k + n_out);
  return {"batched_gemv", fmt::format("H={} n_out={} k={}", H, n_out, k), us, bytes, 2.0 * H * n_out * k};
}

// The K3 SDPA with gate over a resident history of `seq` tokens.
Row bench_k3_sdpa(Bench& bench, GpuBackend& gpu, std::uint32_t heads, std::uint32_t seq, std::uint32_t dq,
                  std::uint32_t dv) {
  const std::size_t kb = std::size_t{seq} * heads * dq * 4, vb = std::size_t{seq} * heads * dv * 4;
  const DeviceBuffer k = bench.random_buffer(kb, 7, 0x3F), v = bench.random_buffer(vb, 8, 0x3F);  // small finite floats
  const DeviceBuffer q = bench.random_buffer(std::size_t{heads} * dq * 4, 9, 0x3F);
  const DeviceBuffer g = bench.random_buffer(std::size_t{heads} * dv * 4, 10, 0x3F),
                     out(gpu, std::size_t{heads} * dv * 4);
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  const double us = bench.median_us([&] {
    k3_mla_sdpa_gate_f32(gpu, kernels.sdpa, {q.ptr(), k.ptr(), v.ptr(), g.ptr(), out.ptr(), seq, heads, dq, dv, true});
  });
  const double bytes = static_cast<double>(kb + vb) + 4.0 * heads * (dq + 2.0 * dv);
  return {"k3_sdpa_gate", fmt::format("heads={} seq={} dq={} dv={}", heads, seq, dq, dv), us, bytes,
          2.0 * (dq + dv) * static_cast<double>(seq) * heads};
}

}  // namespace

void add_bench(CLI::App& app) {
  struct Opts {
    std::string backend, json;
    int iters = 20;
  };
  auto opts = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "time the decode kernels against the device's copy bandwidth");
  cmd->add_option("--backend", opts->backend, "emu, cuda or auto (default: METRALE_BACKEND, else auto)");
  cmd->add_option("--iters", opts->iters, "timed launches per row (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--json", opts->json, "also write the rows to this JSON file");
  cmd->callback([opts] {
    auto gpu = make_backend(opts->backend);
    Bench bench(*gpu, opts->iters);
    const double copy_bw = bench.copy_bandwidth();
    std::vector<Row> rows;
    if (bench.on_device()) {
      for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4})
        for (std::uint32_t B : {1u, 8u, 32u})
          for (std::uint32_t L : {1024u, 4096u})
            for (std::uint32_t H : {16u, 128u}) rows.push_back(bench_paged(bench, *gpu, f, B, L, H));
      rows.push_back(bench_gemv(bench, *gpu, 128, 512, 128));
      rows.push_back(bench_gemv(bench, *gpu, 128, 128, 512));
      for (std::uint32_t seq : {1024u, 4096u, 16384u}) rows.push_back(bench_k3_sdpa(bench, *gpu, 64, seq, 192, 128));
    } else {  // the emulator: small shapes, its own speed
      for (KvFormat f : {KvFormat::fp8, KvFormat::nvfp4}) rows.push_back(bench_paged(bench, *gpu, f, 1, 256, 16));
      rows.push_back(bench_gemv(bench, *gpu, 16, 512, 128));
      rows.push_back(bench_k3_sdpa(bench, *gpu, 8, 256, 192, 128));
    }
    fmt::print("backend {}; device-to-device copy {:.1f} GB/s (read + write)\n\n", gpu->name(), copy_bw / 1e9);
    fmt::print("{:<26} {:<32} {:>12} {:>10} {:>8} {:>10}\n", "kernel", "shape", "us/launch", "GB/s", "% copy",
               "TFLOP/s");
    nlohmann::ordered_json j{{"backend", gpu->name()}, {"copy_gbps", copy_bw / 1e9}, {"rows", nlohmann::json::array()}};
    for (const auto& r : rows) {
      const double gbps = r.bytes / (r.us * 1e-6) / 1e9;
      fmt::print("{:<26} {:<32} {:>12.1f} {:>10.1f} {:>7.1f}% {:>10.2f}\n", r.kernel, r.shape, r.us, gbps,
                 100.0 * gbps * 1e9 / copy_bw, r.flops / (r.us * 1e-6) / 1e12);
      j["rows"].push_back({{"kernel", r.kernel},
                           {"shape", r.shape},
                           {"us", r.us},
                           {"bytes", r.bytes},
                           {"flops", r.flops},
                           {"gbps", gbps},
                           {"copy_fraction", gbps * 1e9 / copy_bw}});
    }
    if (!opts->json.empty()) std::ofstream(opts->json) << j.dump(2) << '\n';
  });
}

}  // namespace metrale::cli
