// hm_trace: the heads-in-M block (mla_paged_decode_wgmma_latent_fp8) alone on the GPU, over a
// random latent FP8 pool as `metrale bench --sweep --layout latent` builds it (64-token blocks
// in shuffled order, E4M3 codes with the top exponent bit clear), without the dispatcher or the
// combine. It prints the block's time and FLOP rate; built with -DMETRALE_HM_TRACE it also prints
// where each warpgroup's cycles go per tile, between the kernel's trace points (HmTrace in
// kernels/mla_wgmma.cu). A diagnostic for kernel work (docs/performance.md, "What limits it"),
// not part of the product; the CMake target `hm_trace` builds both (sm_90a, needs nvcc):
//   hm_trace B L H KEYS_PER_SPLIT [MODE]       e.g. hm_trace_cycles 32 16384 128 8192
// MODE: partial (the default: mla_paged_decode_wgmma_latent_fp8, partials to global memory),
// cluster (mla_paged_decode_wgmma_latent_combine_fp8 in clusters of the splits, as the dispatcher
// launches it), fused (the same entry launched without a cluster: one split only), fp8
// (mla_paged_decode_wgmma_latent_fp8 timed beside mla_paged_decode_wgmma_fp8, the register-operand
// block, on the same pool, and their partials compared) or nvfp4 (the same for
// mla_paged_decode_wgmma_latent_nvfp4 and mla_paged_decode_wgmma_nvfp4 over a random NVFP4 latent
// pool).
// With HM_TRACE_AS_BENCH=1 the data are `metrale bench`'s instead: one 16 MiB draw repeated over
// the pool, q uniform in [-1, 1) and its logit scale (1/sqrt(192) x 0.01).
#include "mla_wgmma.cu"
#include "trace_util.cuh"

#include <cmath>

namespace {

using trace_util::argument;
using trace_util::check;
using trace_util::mean_us;
using trace_util::upload;

// core/mla_fast.cpp's wgmma_latent_shared_bytes(): the heads-in-M block's dynamic shared memory.
constexpr uint32_t kLatentShared = 1024 + 64 * 576 * 2 + 2 * 64 * 576 * 2 + 64 * 64 * 2 + 3 * 64 * 4 + 4 * 8;

// Both blocks of one format over one pool, each timed over 20 launches, then the largest
// difference of their partials (o against the largest |o|, m and l relative); 0 where they agree.
// entries[k], shared[k]: block k's entry and dynamic shared memory (0 the heads-in-M block, 1 the
// register-operand block); launch(entry, grid, shared, o_partial, ml_partial) launches one.
template <class Entry, class Launch>
int compare_blocks(const char* format, uint32_t B, uint32_t L, uint32_t H, uint32_t kps, const char* const (&names)[2],
                   const Entry (&entries)[2], const uint32_t (&shared)[2], const Launch& launch) {
  constexpr uint32_t kDim = 576;
  const uint32_t splits = (L + kps - 1) / kps;
  const dim3 grid(splits, (H + 63) / 64, B);
  for (int k = 0; k < 2; ++k)
    check(cudaFuncSetAttribute(entries[k], cudaFuncAttributeMaxDynamicSharedMemorySize, shared[k]),
          "cudaFuncSetAttribute");
  const size_t partials = size_t{B} * H * splits;
  float* o_partial[2] = {};
  float* ml_partial[2] = {};
  for (int k = 0; k < 2; ++k) {
    check(cudaMalloc(&o_partial[k], partials * kDim * 4), "cudaMalloc");
    check(cudaMalloc(&ml_partial[k], partials * 8), "cudaMalloc");
  }
  const double flop = 2.0 * (kDim + kDim) * static_cast<double>(L) * H * B;
  for (int k = 0; k < 2; ++k) {
    const auto one = [&] { launch(entries[k], grid, shared[k], o_partial[k], ml_partial[k]); };
    one();
    check(cudaDeviceSynchronize(), "warm-up launch");
    const double us = mean_us(one);
    std::printf("B=%u L=%u H=%u keys_per_split=%u grid %ux%ux%u %s %s: %.1f us, %.0f TFLOP/s\n", B, L, H, kps, grid.x,
                grid.y, grid.z, format, names[k], us, flop / us * 1e-6);
  }
  std::vector<float> o[2], ml[2];
  for (int k = 0; k < 2; ++k) {
    o[k].resize(partials * kDim), ml[k].resize(partials * 2);
    check(cudaMemcpy(o[k].data(), o_partial[k], o[k].size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(ml[k].data(), ml_partial[k], ml[k].size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  double o_max = 0, o_diff = 0, m_diff = 0, l_diff = 0;
  for (size_t i = 0; i < o[1].size(); ++i) {
    o_max = std::max(o_max, static_cast<double>(std::fabs(o[1][i])));
    o_diff = std::max(o_diff, static_cast<double>(std::fabs(o[0][i] - o[1][i])));
  }
  for (size_t i = 0; i < partials; ++i) {
    m_diff = std::max(m_diff, static_cast<double>(std::fabs(ml[0][2 * i] - ml[1][2 * i])));
    l_diff = std::max(
        l_diff, std::fabs(ml[0][2 * i + 1] - ml[1][2 * i + 1]) / std::max(1e-30, std::fabs(double{ml[1][2 * i + 1]})));
  }
  const bool same = std::isfinite(o_diff) && o_diff <= 0x1p-8 * o_max && m_diff <= 1e-3 && l_diff <= 1e-2;
  std::printf("partials: max |o| %.4g, max |o diff| %.3g (%.2g of it), max |m diff| %.3g, max l rel diff %.3g: %s\n",
              o_max, o_diff, o_diff / o_max, m_diff, l_diff, same ? "agree" : "DIFFER");
  return same ? 0 : 1;
}

// MODE nvfp4: both NVFP4 blocks over one random latent pool (64-token blocks in shuffled order,
// random E2M1 codes, scales E4M3 codes 0x30..0x3F: 0.5 to 1.875).
int run_nvfp4(uint32_t B, uint32_t L, uint32_t H, uint32_t kps, const std::vector<uint16_t>& q, float logit_scale,
              std::mt19937_64& rng) {
  constexpr uint32_t kDim = 576, kBlock = 64, kData = kBlock * kDim / 2, kStride = kData + kBlock * kDim / 16;
  const uint32_t blocks_per_seq = L / kBlock;
  std::vector<uint8_t> pool(size_t{B} * blocks_per_seq * kStride);
  for (size_t b = 0; b < size_t{B} * blocks_per_seq; ++b) {
    for (uint32_t i = 0; i < kData; ++i) pool[b * kStride + i] = static_cast<uint8_t>(rng());
    for (uint32_t i = kData; i < kStride; ++i) pool[b * kStride + i] = static_cast<uint8_t>(0x30 | (rng() & 0x0F));
  }
  const std::vector<int32_t> table = trace_util::shuffled_table(B, blocks_per_seq, rng),
                             lens(B, static_cast<int32_t>(L));
  const auto* d_q = reinterpret_cast<const __nv_bfloat16*>(upload(q));
  const uint8_t* d_pool = upload(pool);
  const int32_t *d_table = upload(table), *d_lens = upload(lens);
  // kLatentShared and core/mla_fast.cpp's wgmma_shared_bytes(nvfp4, 64)
  const uint32_t shared[2] = {kLatentShared, 1024 + 64 * kDim * 2 + 64 * 64 * 2 + 4 * 64 * (kDim / 2 + kDim / 16) +
                                                 64 * 4 + 2 * 4 * 32 * 4 + 2 * 4 * 4 + 3 * 2 * 8};
  decltype(&mla_paged_decode_wgmma_nvfp4)
      const entries[2] = {mla_paged_decode_wgmma_latent_nvfp4, mla_paged_decode_wgmma_nvfp4};
  return compare_blocks(
      "nvfp4", B, L, H, kps,
      {"heads in M (mla_paged_decode_wgmma_latent_nvfp4)", "register operands (mla_paged_decode_wgmma_nvfp4)"}, entries,
      shared, [&](auto entry, dim3 grid, uint32_t bytes, float* o_partial, float* ml_partial) {
        entry<<<grid, 256, bytes>>>(d_q, d_pool, d_pool, o_partial, ml_partial, d_table, d_lens, blocks_per_seq, H,
                                    kDim, kDim, kBlock, logit_scale, kStride, kData, kps);
      });
}

// MODE fp8: both FP8 blocks over main's pool, as MODE nvfp4 (the partial entries, no cluster).
int run_fp8(uint32_t B, uint32_t L, uint32_t H, uint32_t kps, const uint8_t* d_pool, const __nv_bfloat16* d_q,
            const int32_t* d_table, const int32_t* d_lens, float logit_scale) {
  constexpr uint32_t kDim = 576, kBlock = 64;
  // kLatentShared and core/mla_fast.cpp's wgmma_shared_bytes(fp8, 64)
  const uint32_t shared[2] = {kLatentShared, 1024 + 64 * kDim * 2 + 64 * 64 * 2 + 4 * 64 * kDim + 64 * 4 +
                                                 2 * 4 * 32 * 4 + 2 * 4 * 4 + 3 * 2 * 8};
  decltype(&mla_paged_decode_wgmma_fp8)
      const entries[2] = {mla_paged_decode_wgmma_latent_fp8, mla_paged_decode_wgmma_fp8};
  return compare_blocks(
      "fp8", B, L, H, kps,
      {"heads in M (mla_paged_decode_wgmma_latent_fp8)", "register operands (mla_paged_decode_wgmma_fp8)"}, entries,
      shared, [&](auto entry, dim3 grid, uint32_t bytes, float* o_partial, float* ml_partial) {
        entry<<<grid, 256, bytes>>>(d_q, d_pool, d_pool, o_partial, ml_partial, d_table, d_lens, L / kBlock, H, kDim,
                                    kDim, kBlock, logit_scale, kDim, 0, nullptr, 0, kps);
      });
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = std::strrchr(argv[0], '/') != nullptr ? std::strrchr(argv[0], '/') + 1 : argv[0];
  trace_util::g_program = program;
  if (argc != 5 && argc != 6) {
    std::fprintf(
        stderr,
        "usage: %s B L H KEYS_PER_SPLIT [partial|cluster|fused|fp8|nvfp4] (L and KEYS_PER_SPLIT multiples of 64)\n",
        program);
    return 2;
  }
  const char* const mode = argc == 6 ? argv[5] : "partial";
  const bool partial = std::strcmp(mode, "partial") == 0, cluster = std::strcmp(mode, "cluster") == 0;
  const bool nvfp4 = std::strcmp(mode, "nvfp4") == 0, fp8 = std::strcmp(mode, "fp8") == 0;
  if (!partial && !cluster && !nvfp4 && !fp8 && std::strcmp(mode, "fused") != 0) {
    std::fprintf(stderr, "%s: MODE %s is not partial, cluster, fused, fp8 or nvfp4\n", program, mode);
    return 2;
  }
  const uint32_t B = argument("B", argv[1], 1, 65535), L = argument("L", argv[2], 64, 1 << 20, 64);
  const uint32_t H = argument("H", argv[3], 1, 1024), kps = argument("KEYS_PER_SPLIT", argv[4], 64, L, 64);
  if (uint64_t{B} * L * 576 > (uint64_t{64} << 30)) {
    std::fprintf(stderr, "%s: a pool of B x L x 576 bytes = %llu is above 64 GiB\n", program,
                 static_cast<unsigned long long>(uint64_t{B} * L * 576));
    return 2;
  }
  trace_util::require_sm90();
  constexpr uint32_t kDim = 576, kBlock = 64;
  const uint32_t blocks_per_seq = L / kBlock, splits = (L + kps - 1) / kps;
  if (!partial && !nvfp4 && !fp8 && splits > (cluster ? 8u : 1u)) {
    std::fprintf(stderr, "%s: %u splits; MODE %s takes at most %u\n", program, splits, mode, cluster ? 8 : 1);
    return 2;
  }
  const char* const as_bench_env = std::getenv("HM_TRACE_AS_BENCH");
  const bool as_bench = as_bench_env != nullptr && std::strcmp(as_bench_env, "1") == 0;
  const float logit_scale = as_bench ? 0.01f / std::sqrt(192.0f) : 0.07f;
  std::mt19937_64 rng(1);
  const std::vector<uint8_t> pool =
      trace_util::random_fp8(nvfp4 ? 0 : size_t{B} * L * kDim, as_bench, rng);  // MODE nvfp4 builds its own
  // BF16 (truncated) of uniform values in [-2, 2) ([-1, 1) as bench)
  const std::vector<uint16_t> q = trace_util::random_bf16(size_t{B} * H * kDim, as_bench ? 1.0f : 2.0f, rng);
  if (nvfp4) return run_nvfp4(B, L, H, kps, q, 0.02f, rng);
  const std::vector<int32_t> table = trace_util::shuffled_table(B, blocks_per_seq, rng),
                             lens(B, static_cast<int32_t>(L));
  const auto* d_q = reinterpret_cast<const __nv_bfloat16*>(upload(q));
  const uint8_t* d_pool = upload(pool);
  const int32_t *d_table = upload(table), *d_lens = upload(lens);
  if (fp8) return run_fp8(B, L, H, kps, d_pool, d_q, d_table, d_lens, logit_scale);
  float *o_partial = nullptr, *ml_partial = nullptr;
  __nv_bfloat16* o = nullptr;
  check(cudaMalloc(&o_partial, size_t{B} * H * splits * kDim * 4), "cudaMalloc");
  check(cudaMalloc(&ml_partial, size_t{B} * H * splits * 8), "cudaMalloc");
  check(cudaMalloc(&o, size_t{B} * H * kDim * 2), "cudaMalloc");
  const uint32_t shared = kLatentShared;
  for (const void* entry : {reinterpret_cast<const void*>(mla_paged_decode_wgmma_latent_fp8),
                             reinterpret_cast<const void*>(mla_paged_decode_wgmma_latent_combine_fp8)})
    check(cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize, shared), "cudaFuncSetAttribute");
  const dim3 grid(splits, (H + 63) / 64, B);
  cudaLaunchAttribute clusters{};
  clusters.id = cudaLaunchAttributeClusterDimension;
  clusters.val.clusterDim.x = splits, clusters.val.clusterDim.y = clusters.val.clusterDim.z = 1;
  const cudaLaunchConfig_t config{grid, 256, shared, nullptr, &clusters, cluster ? 1u : 0u};
  auto launch = [&] {
    if (partial) {
      mla_paged_decode_wgmma_latent_fp8<<<grid, 256, shared>>>(d_q, d_pool, d_pool, o_partial, ml_partial, d_table,
                                                               d_lens, blocks_per_seq, H, kDim, kDim, kBlock,
                                                               logit_scale, kDim, 0, nullptr, 0, kps);
    } else {
      check(cudaLaunchKernelEx(&config, mla_paged_decode_wgmma_latent_combine_fp8, d_q, d_pool, d_pool,
                               static_cast<const float*>(nullptr), o, d_table, d_lens, blocks_per_seq, H, kDim, kDim,
                               kBlock, logit_scale, uint64_t{kDim}, 0u, static_cast<const uint8_t*>(nullptr), 0u, kps,
                               1.0f),
            "cudaLaunchKernelEx");
    }
  };
  launch();
  check(cudaDeviceSynchronize(), "warm-up launch");
#ifdef METRALE_HM_TRACE
  const unsigned long long zero[2][10] = {};
  check(cudaMemcpyToSymbol(g_hm_trace, zero, sizeof zero), "cudaMemcpyToSymbol");
#endif
  const double us = mean_us(launch), flop = 2.0 * (kDim + kDim) * static_cast<double>(L) * H * B;
  std::printf("B=%u L=%u H=%u keys_per_split=%u grid %ux%ux%u %s%s: %.1f us, %.0f TFLOP/s\n", B, L, H, kps, grid.x,
              grid.y, grid.z, mode, as_bench ? " (bench data)" : "", us, flop / us * 1e-6);
#ifdef METRALE_HM_TRACE
  unsigned long long cycles[2][10] = {};
  check(cudaMemcpyFromSymbol(cycles, g_hm_trace, sizeof cycles), "cudaMemcpyFromSymbol");
  // The trace points' names: the interval that ends at each (kernels/mla_wgmma.cu, wgmma_hm_decode).
  const char* const names[2][9] = {
      {"softmax", "PFree wait", "P store", "BarP wait", "rescale+P·V issue", "BarPv wait", "S issue", "P·V wait",
       "S wait"},
      {"Read wait", "convert", "BarP wait", "rescale+P·V issue", "loads issue", "P·V wait", "", "", ""}};
  for (int wg = 0; wg < 2; ++wg) {
    if (cycles[wg][9] == 0) continue;
    double total = 0;
    std::printf("warpgroup %d, cycles a tile:", wg);
    for (int k = 0; k < 9; ++k) {
      if (names[wg][k][0] == '\0') continue;
      const double c = static_cast<double>(cycles[wg][k]) / static_cast<double>(cycles[wg][9]);
      total += c;
      std::printf(" %s %.0f,", names[wg][k], c);
    }
    std::printf(" total %.0f\n", total);
  }
#endif
  return 0;
}
