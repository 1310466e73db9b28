// What the kernel diagnostics of bench/ (hm_trace.cu, step_trace.cu) share: exiting on a CUDA
// error, uploading a host vector, reading an integer argument, timing launches back to back, and
// the random FP8 pool, BF16 q and shuffled block table that `metrale bench --sweep` times over.
// Diagnostics, not part of the product.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>
#include <vector>

namespace trace_util {

// The program's name for messages (set by main).
inline const char* g_program = "trace";

inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s: %s\n", g_program, what, cudaGetErrorString(e));
  std::exit(1);
}

template <class T>
T* upload(const std::vector<T>& host) {
  T* device = nullptr;
  check(cudaMalloc(&device, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return device;
}

// Argument `what` as an integer in [least, most] and a multiple of `step`, or exit 2 with a
// message naming it.
inline uint32_t argument(const char* what, const char* text, uint64_t least, uint64_t most, uint64_t step = 1) {
  uint64_t value = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc{} || ptr != end || value < least || value > most || value % step != 0) {
    std::fprintf(stderr, "%s: %s '%s' is not an integer from %llu to %llu%s\n", g_program, what, text,
                 static_cast<unsigned long long>(least), static_cast<unsigned long long>(most),
                 step > 1 ? ", a multiple of 64" : "");
    std::exit(2);
  }
  return static_cast<uint32_t>(value);
}

// Exit 1 unless device 0 is sm_90 (the diagnostics' SASS is sm_90a's alone; without a driver the
// runtime reports only that the driver is older than it).
inline void require_sm90() {
  int devices = 0, major = 0, minor = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no usable CUDA device (cudaGetDeviceCount: %s); it needs an sm_90 GPU\n", g_program,
                 e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    std::exit(1);
  }
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0) {
    std::fprintf(stderr, "%s: device 0 is sm_%d%d; the block is built for sm_90a alone\n", g_program, major, minor);
    std::exit(1);
  }
}

// The mean time of 20 launches back to back, in µs (after the caller's warm-up launch).
template <class Launch>
double mean_us(const Launch& launch) {
  constexpr int kReps = 20;
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  check(cudaEventRecord(t0), "cudaEventRecord");
  for (int r = 0; r < kReps; ++r) launch();
  check(cudaEventRecord(t1), "cudaEventRecord");
  check(cudaDeviceSynchronize(), "timed launches");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  check(cudaEventDestroy(t0), "cudaEventDestroy");
  check(cudaEventDestroy(t1), "cudaEventDestroy");
  return 1e3 * ms / kReps;
}

// `n` random FP8 bytes with the top exponent bit clear (finite E4M3 codes of magnitude < 2^0,
// mask 0xB7); with `as_bench`, one 16 MiB draw repeated, as `metrale bench` fills its pools.
inline std::vector<uint8_t> random_fp8(size_t n, bool as_bench, std::mt19937_64& rng) {
  std::vector<uint8_t> pool(n);
  const size_t drawn = as_bench ? std::min<size_t>(n, size_t{16} << 20) : n;
  for (size_t i = 0; i < drawn; ++i) pool[i] = static_cast<uint8_t>(rng()) & 0xB7;
  for (size_t i = drawn; i < n; ++i) pool[i] = pool[i % drawn];
  return pool;
}

// `n` BF16 values (truncated) uniform in [-range, range).
inline std::vector<uint16_t> random_bf16(size_t n, float range, std::mt19937_64& rng) {
  std::vector<uint16_t> q(n);
  std::uniform_real_distribution<float> uniform(-range, range);
  for (auto& x : q) {
    const float f = uniform(rng);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return q;
}

// A block table of B sequences × blocks_per_seq blocks: every block of the pool once, shuffled.
inline std::vector<int32_t> shuffled_table(uint32_t B, uint32_t blocks_per_seq, std::mt19937_64& rng) {
  std::vector<int32_t> table(size_t{B} * blocks_per_seq);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
  return table;
}

}  // namespace trace_util
