// step_trace: where the microseconds of a memory-bound decode step go. It runs the staged FP8
// 16-head block with the combine in its clusters (mla_paged_decode_wgmma16_rs_combine_fp8, the
// step `metrale bench --sweep` times at 16 heads over two pools from 6 tiles a block slot) alone
// on the GPU, over two random FP8 pools filled as that bench fills them (one 16 MiB draw
// repeated, 64-token blocks in shuffled order, q uniform in [-1, 1)), without the dispatcher.
// Built with -DMETRALE_STEP_TRACE (kernels/mla_wgmma.cu's step_mark) each block stamps the wall
// clock at its phases; each traced launch is queued behind a kernel that spins for 30 µs, so that
// the host's launch latency is not in its time, as `metrale bench --timing blocking` times. It
// prints, as medians over the traced launches:
// - the launch's event time, and the same for an empty kernel of the same grid, cluster and
//   shared memory (what launching and draining that grid costs with no work in it);
// - from the spinning kernel's end to the first block's start (the launch gap), the blocks' start
//   skew, and the event time past the last block's end (the drain);
// - each phase over the blocks (median and largest): the prologue (Q stored, the first tile
//   issued), the first K's arrival, the walk, the partial's stores, the cluster's first barrier
//   (waiting for the slowest chunk), the combine's sums, its last barrier;
// - how many blocks are still walking at fractions of the step.
// A diagnostic for kernel work (docs/performance.md, "What limits it"), not part of the product;
// the CMake target `step_trace` builds it (sm_90a, needs nvcc):
//   step_trace B L KEYS_PER_SPLIT [REPS [MODE]]       e.g. step_trace 32 4096 640
// KEYS_PER_SPLIT is the dispatcher's chunk (B = 32 × 4K: 640 keys, 7 splits on the H200), at most
// 8 splits (a portable cluster). MODE cluster (the default) runs the cluster entry; partial runs
// the split kernel alone (mla_paged_decode_wgmma16_rs_fp8, its partials to global memory, the
// combine not launched), any number of splits.
#include "mla_wgmma.cu"
#include "trace_util.cuh"

#include <cmath>

#ifndef METRALE_STEP_TRACE
#error "step_trace needs -DMETRALE_STEP_TRACE (the block's stamps)"
#endif

__device__ unsigned long long g_spin_end;

// Holds the stream for `ns` of wall clock, then stamps its end.
__global__ void step_trace_spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  g_spin_end = now;
}

// The decode kernel's grid, cluster and shared memory with no work: its start and end stamps.
__global__ void __launch_bounds__(128, 2) step_trace_empty() {
  step_mark(0);
  cooperative_groups::this_cluster().sync();
  step_mark(7);
}

namespace {

using trace_util::check;

constexpr uint32_t kBlock = 64, kHeads = 16;  // kDim: mla_wgmma.cu's 576
// core/mla_fast.cpp's wgmma_shared_bytes(fp8, 16, staged): alignment, Q, P, the raw K and V
// half-tiles, the unscale factors, the maxima and sums, two mbarriers.
constexpr uint32_t kShared =
    1024 + kHeads * kDim * 2 + kHeads * 64 * 2 + 2 * 64 * kDim + kHeads * 4 + 4 * kHeads * 4 + 2 * 8;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Phase {
  const char* name;
  uint32_t from, to;  // marks
};
constexpr Phase kPhases[] = {{"prologue (Q stored, first tile issued)", 0, 1},
                             {"first K landed", 1, 2},
                             {"walk (first K to last tile done)", 2, 3},
                             {"partial stored", 3, 4},
                             {"cluster barrier 1 (the slowest chunk)", 4, 5},
                             {"combine sums", 5, 6},
                             {"cluster barrier 2", 6, 7}};
constexpr size_t kPhaseCount = sizeof kPhases / sizeof kPhases[0];

// One traced launch's figures, in µs.
struct Run {
  double event = 0, gap = 0, skew = 0, span = 0, drain = 0, walk_per_tile = 0;
  double phase_median[kPhaseCount] = {}, phase_max[kPhaseCount] = {};
  double walking[4] = {};  // blocks walking at 25, 50, 75, 90% of the span
  uint32_t sms = 0, most_per_sm = 0;
};

// The stamps of `blocks` blocks after a launch, as one Run: the blocks' start (mark 0) to their
// end (mark `end`: 7, or 4 for the partial entry, which ends with its partial stored); `decode`:
// the phases too.
Run read_run(uint32_t blocks, uint32_t end, bool decode, double event_us, const std::vector<uint32_t>& tiles) {
  std::vector<unsigned long long> t(size_t{blocks} * (kStepMarks + 1));
  check(cudaMemcpyFromSymbol(t.data(), g_step_trace, t.size() * sizeof t[0]), "cudaMemcpyFromSymbol");
  unsigned long long spin_end = 0;
  check(cudaMemcpyFromSymbol(&spin_end, g_spin_end, sizeof spin_end), "cudaMemcpyFromSymbol");
  const auto at = [&](uint32_t b, uint32_t k) { return t[size_t{b} * (kStepMarks + 1) + k]; };
  // µs from mark `from` to mark `to` of block b (signed: a mark a block did not reach would
  // otherwise show as 2^64 ns)
  const auto between = [&](uint32_t b, uint32_t from, uint32_t to) {
    return (static_cast<double>(at(b, to)) - static_cast<double>(at(b, from))) * 1e-3;
  };
  unsigned long long first = ~0ull, last_start = 0, last_end = 0;
  std::vector<uint32_t> per_sm(1024);
  for (uint32_t b = 0; b < blocks; ++b) {
    first = std::min(first, at(b, 0)), last_start = std::max(last_start, at(b, 0));
    last_end = std::max(last_end, at(b, end));
    ++per_sm[std::min<unsigned long long>(at(b, kStepMarks), 1023)];
  }
  Run r;
  r.event = event_us;
  r.gap = (static_cast<double>(first) - static_cast<double>(spin_end)) * 1e-3;
  r.skew = static_cast<double>(last_start - first) * 1e-3;
  r.span = static_cast<double>(last_end - first) * 1e-3;
  r.drain = event_us - (static_cast<double>(last_end) - static_cast<double>(spin_end)) * 1e-3;
  for (const uint32_t n : per_sm) r.sms += n != 0, r.most_per_sm = std::max(r.most_per_sm, n);
  if (!decode) return r;
  std::vector<double> per_tile;
  for (size_t p = 0; p < kPhaseCount && kPhases[p].to <= end; ++p) {
    std::vector<double> d;
    for (uint32_t b = 0; b < blocks; ++b) d.push_back(between(b, kPhases[p].from, kPhases[p].to));
    r.phase_median[p] = median(d);
    r.phase_max[p] = *std::max_element(d.begin(), d.end());
  }
  for (uint32_t b = 0; b < blocks; ++b)
    if (tiles[b] > 1) per_tile.push_back(between(b, 2, 3) / (tiles[b] - 1));
  r.walk_per_tile = median(per_tile);
  const double fractions[4] = {0.25, 0.5, 0.75, 0.9};
  for (int f = 0; f < 4; ++f) {
    const auto when = first + static_cast<unsigned long long>(fractions[f] * static_cast<double>(last_end - first));
    for (uint32_t b = 0; b < blocks; ++b) r.walking[f] += at(b, 2) <= when && when < at(b, 3);
  }
  return r;
}

// The median of each figure over `runs`.
Run medians(const std::vector<Run>& runs) {
  Run m;
  const auto of = [&](auto field) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(field(r));
    return median(v);
  };
  m.event = of([](const Run& r) { return r.event; });
  m.gap = of([](const Run& r) { return r.gap; });
  m.skew = of([](const Run& r) { return r.skew; });
  m.span = of([](const Run& r) { return r.span; });
  m.drain = of([](const Run& r) { return r.drain; });
  m.walk_per_tile = of([](const Run& r) { return r.walk_per_tile; });
  for (size_t p = 0; p < kPhaseCount; ++p) {
    m.phase_median[p] = of([&](const Run& r) { return r.phase_median[p]; });
    m.phase_max[p] = of([&](const Run& r) { return r.phase_max[p]; });
  }
  for (int f = 0; f < 4; ++f) m.walking[f] = of([&](const Run& r) { return r.walking[f]; });
  m.sms = runs.front().sms, m.most_per_sm = runs.front().most_per_sm;
  return m;
}

// `reps` traced launches of `launch`, each behind a 30 µs spin, their figures' medians.
template <class Launch>
Run traced(const Launch& launch, uint32_t blocks, uint32_t end, bool decode, uint32_t reps,
           const std::vector<uint32_t>& tiles) {
  cudaEvent_t t0, t1;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  check(cudaEventCreate(&t1), "cudaEventCreate");
  std::vector<Run> runs;
  for (uint32_t i = 0; i < reps; ++i) {
    step_trace_spin<<<1, 1>>>(30'000);
    check(cudaEventRecord(t0), "cudaEventRecord");
    launch();
    check(cudaEventRecord(t1), "cudaEventRecord");
    check(cudaDeviceSynchronize(), "traced launch");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
    runs.push_back(read_run(blocks, end, decode, 1e3 * ms, tiles));
  }
  check(cudaEventDestroy(t0), "cudaEventDestroy");
  check(cudaEventDestroy(t1), "cudaEventDestroy");
  return medians(runs);
}

void print_run(const char* what, const Run& r, double back_to_back) {
  std::printf(
      "%s: event %.2f us (back to back %.2f), launch gap %.2f, start skew %.2f, span %.2f, drain %.2f; "
      "%u SMs, at most %u blocks an SM\n",
      what, r.event, back_to_back, r.gap, r.skew, r.span, r.drain, r.sms, r.most_per_sm);
}

}  // namespace

int main(int argc, char** argv) {
  const char* program = std::strrchr(argv[0], '/') != nullptr ? std::strrchr(argv[0], '/') + 1 : argv[0];
  trace_util::g_program = program;
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr,
                 "usage: %s B L KEYS_PER_SPLIT [REPS [cluster|partial]] (L and KEYS_PER_SPLIT multiples of 64; "
                 "cluster: at most 8 splits)\n",
                 program);
    return 2;
  }
  using trace_util::argument;
  const uint32_t B = argument("B", argv[1], 1, 65535), L = argument("L", argv[2], 64, 1 << 20, 64);
  const uint32_t kps = argument("KEYS_PER_SPLIT", argv[3], 64, L, 64);
  const uint32_t reps = argc >= 5 ? argument("REPS", argv[4], 1, 1000) : 20;
  const char* const mode = argc == 6 ? argv[5] : "cluster";
  const bool in_clusters = std::strcmp(mode, "cluster") == 0;
  if (!in_clusters && std::strcmp(mode, "partial") != 0) {
    std::fprintf(stderr, "%s: MODE %s is not cluster or partial\n", program, mode);
    return 2;
  }
  const uint32_t splits = (L + kps - 1) / kps, blocks = splits * B;
  if ((in_clusters && splits > kMaxClusterSplits) || blocks > kStepTraceBlocks ||
      uint64_t{B} * L * kDim > (uint64_t{16} << 30)) {
    std::fprintf(stderr, "%s: %u splits, %u blocks in all (at most 8 in clusters and %u), or a pool above 16 GiB\n",
                 program, splits, blocks, kStepTraceBlocks);
    return 2;
  }
  trace_util::require_sm90();
  std::mt19937_64 rng(1);
  const size_t keys = size_t{B} * L;
  const uint8_t* k_pool = trace_util::upload(trace_util::random_fp8(keys * kDim, true, rng));
  const uint8_t* v_pool = trace_util::upload(trace_util::random_fp8(keys * kDim, true, rng));
  const auto* q = reinterpret_cast<const __nv_bfloat16*>(
      trace_util::upload(trace_util::random_bf16(size_t{B} * kHeads * kDim, 1.0f, rng)));
  const int32_t* table = trace_util::upload(trace_util::shuffled_table(B, L / kBlock, rng));
  const int32_t* lens = trace_util::upload(std::vector<int32_t>(B, static_cast<int32_t>(L)));
  __nv_bfloat16* o = nullptr;
  float *o_partial = nullptr, *ml_partial = nullptr;
  check(cudaMalloc(&o, size_t{B} * kHeads * kDim * 2), "cudaMalloc");
  check(cudaMalloc(&o_partial, size_t{blocks} * kHeads * kDim * 4), "cudaMalloc");
  check(cudaMalloc(&ml_partial, size_t{blocks} * kHeads * 8), "cudaMalloc");
  const float logit_scale = 0.01f / std::sqrt(192.0f);  // metrale bench's
  std::vector<uint32_t> tiles(blocks);
  for (uint32_t b = 0; b < blocks; ++b) tiles[b] = (std::min(L, (b % splits + 1) * kps) - b % splits * kps) / 64;

  for (const void* entry : {reinterpret_cast<const void*>(mla_paged_decode_wgmma16_rs_combine_fp8),
                            reinterpret_cast<const void*>(mla_paged_decode_wgmma16_rs_fp8),
                            reinterpret_cast<const void*>(step_trace_empty)})
    check(cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared), "cudaFuncSetAttribute");
  const dim3 grid(splits, 1, B);
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = in_clusters ? splits : 1, cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  const cudaLaunchConfig_t config{grid, 128, kShared, nullptr, &cluster, in_clusters ? 1u : 0u};
  int at_once = 0;
  if (in_clusters)
    check(cudaOccupancyMaxActiveClusters(&at_once, mla_paged_decode_wgmma16_rs_combine_fp8, &config),
          "cudaOccupancyMaxActiveClusters");
  const auto decode = [&] {
    if (in_clusters) {
      check(
          cudaLaunchKernelEx(&config, mla_paged_decode_wgmma16_rs_combine_fp8, q, k_pool, v_pool,
                             static_cast<const float*>(nullptr), o, table, lens, L / kBlock, kHeads, kDim, kDim, kBlock,
                             logit_scale, uint64_t{kDim}, 0u, static_cast<const uint8_t*>(nullptr), 0u, kps, 1.0f),
          "cudaLaunchKernelEx");
    } else {
      check(cudaLaunchKernelEx(&config, mla_paged_decode_wgmma16_rs_fp8, q, k_pool, v_pool, o_partial, ml_partial,
                               table, lens, L / kBlock, kHeads, kDim, kDim, kBlock, logit_scale, uint64_t{kDim}, 0u,
                               static_cast<const uint8_t*>(nullptr), 0u, kps),
            "cudaLaunchKernelEx");
    }
  };
  const auto empty = [&] { check(cudaLaunchKernelEx(&config, step_trace_empty), "cudaLaunchKernelEx"); };
  decode(), empty();
  check(cudaDeviceSynchronize(), "warm-up launches");

  const double bytes = static_cast<double>(keys) * 2 * kDim + 2.0 * B * kHeads * kDim * 2;
  if (in_clusters) {
    std::printf(
        "B=%u L=%u H=%u keys_per_split=%u: %u splits, grid %u blocks in clusters of %u (%d clusters at once), "
        "%.1f MB a step\n",
        B, L, kHeads, kps, splits, blocks, splits, at_once, bytes * 1e-6);
  } else {
    std::printf(
        "B=%u L=%u H=%u keys_per_split=%u: %u splits, grid %u blocks, partials to global memory (no combine), "
        "%.1f MB a step\n",
        B, L, kHeads, kps, splits, blocks, bytes * 1e-6);
  }
  const uint32_t end = in_clusters ? 7 : 4;
  const Run e = traced(empty, blocks, 7, false, reps, tiles);
  print_run("empty kernel", e, trace_util::mean_us(empty));
  const Run d = traced(decode, blocks, end, true, reps, tiles);
  const double back_to_back = trace_util::mean_us(decode);
  print_run(in_clusters ? "decode step " : "split kernel", d, back_to_back);
  std::printf("  bytes over the span: %.0f GB/s; over the event time: %.0f GB/s\n", bytes / d.span * 1e-3,
              bytes / d.event * 1e-3);
  for (size_t p = 0; p < kPhaseCount && kPhases[p].to <= end; ++p)
    std::printf("  %-40s median %7.2f us, largest %7.2f\n", kPhases[p].name, d.phase_median[p], d.phase_max[p]);
  std::printf("  walk per tile after the first: median %.2f us\n", d.walk_per_tile);
  std::printf("  blocks walking at 25/50/75/90%% of the span: %.0f / %.0f / %.0f / %.0f of %u\n", d.walking[0],
              d.walking[1], d.walking[2], d.walking[3], blocks);
  return 0;
}
