// Launchers, plan and dispatchers of module `mla_fast`.
#include "metrale/mla_fast.hpp"

#include <algorithm>

#include "metrale/launch.hpp"
#include "validate.hpp"

namespace metrale {

using detail::validate_entry;
using detail::Validator;

namespace {

constexpr std::uint32_t kTileKeys = 32, kGroupRows = 16, kMaxDim = 576, kPad = 8;
constexpr std::uint32_t kWgmmaRows = 64, kWgmma16Rows = 16, kWgmmaTileKeys = 64, kWgmmaDim = 576;  // mla_wgmma's blocks
// Tiles per block slot from which 16-head rows run on the staged one-warpgroup entries
// (mla_paged_decode_wgmma16_rs_*). Measured on the H200 (docs/performance.md) against the
// specialised entries, 264 slots: FP8 1.17–1.42× as fast from 15.5 tiles a slot, 1.14× at 7.8
// (B = 32 × 4K keys, with its Q rows loaded together; 0.97–1.05× before), 0.74–0.80× at 3.9 and
// below; NVFP4 (sixteenth session) 1.20–1.57× from 7.8, 0.95× at 3.9 (B = 1 × 64K), 0.73–1.0× below.
// Over one latent pool the specialised entry converts each tile once (thirty-eighth session, on an
// H100, B = 1–128 × 1K–64K): NVFP4 0.75–0.98× the staged entry's time at every size, so NVFP4
// takes it there at any size; FP8 0.88–0.98× below 6 tiles a slot but 1.06–1.36× from 7.8, so
// FP8 keeps this threshold.
constexpr std::uint64_t kStagedTiles16 = 6;
// DeepSeek rows of more than 32 heads take 16-head blocks when these would walk at most this many
// 64-key tiles per SM in all (num_seqs × ⌈heads / 16⌉ × tiles): measured on the H200
// (docs/performance.md, fifteenth session; one-tile splits) 0.32–0.78× the 64-head blocks' time up
// to 4 tiles an SM (B = 1 to 4K keys, B = 8 × 1K × 64 heads), 0.96–1.12× at 8, 1.11–1.47× at 16.
constexpr std::uint64_t kSmallTiles16PerSm = 4;
// The staged FP8 16-head entry with the combine in its clusters, and its most splits (the
// portable cluster size): docs/performance.md.
constexpr const char* kFusedEntry = "mla_paged_decode_wgmma16_rs_combine_fp8";
constexpr const char* kFusedEntry64 = "mla_paged_decode_wgmma_combine_fp8";  // the 64-head blocks
constexpr const char* kLatentEntry = "mla_paged_decode_wgmma_latent_fp8";    // heads in M, one latent pool
constexpr const char* kFusedLatentEntry = "mla_paged_decode_wgmma_latent_combine_fp8";  // and in clusters
constexpr const char* kLatentNvfp4Entry = "mla_paged_decode_wgmma_latent_nvfp4";        // heads in M, NVFP4
constexpr const char* kFusedLatentNvfp4Entry = "mla_paged_decode_wgmma_latent_combine_nvfp4";  // and in clusters
// The heads-in-M entry takes latent 64-head steps whose table holds at least this many keys.
// Measured on the H200 (docs/performance.md, twenty-third session): from 4K keys it takes
// 0.77–0.96× the time of the register-operand block (fused in clusters where the plan says); at
// 1K keys up to 1.28× (batch 32 and 128), where the clusters' combine pays most.
constexpr std::uint64_t kLatentMinKeys = 4096;
constexpr std::uint32_t kMaxClusterSplits = 8;
// The combine's launch after the split kernel, in the plan's tiles (4.1 µs a tile per block at
// two blocks per SM; the combine 9.5 µs at B = 32 × 4K): kept low, so that a tie goes to clusters.
constexpr std::uint64_t kCombineTiles = 2;
// A 64-head block's partial (64 rows × 512 FP32 values and their m, l: 128 KiB, written, then read
// back by the combine) beside its tiles, in the plan's tiles, where its chunks are not combined in
// clusters. Measured on the H100 (docs/performance.md, thirty-first session): B = 128 × 64K × 128
// heads over one latent pool took 5749 µs as 18 chunks of 57 tiles and a combine launch, 4863 µs
// as one chunk in clusters of one, where the plan without it had counted 2030 tiles against 2050.
constexpr std::uint64_t kPartialTiles64 = 1;
constexpr std::uint32_t kGemvSteps = 2;  // rows in flight per warp step of the wide GEMV

// One latent pool passed as both caches (V = K row for row); not a plan asked without buffers.
bool one_latent_pool(const PagedDecodeCommon& a) { return a.k_cache && a.k_cache == a.v_cache; }

// Why the split kernels cannot take these dimensions and addresses, or nothing.
std::optional<std::string> split_shape_problem(std::uint32_t num_kv_heads, std::uint32_t q_head_dim,
                                               std::uint32_t kv_cache_dim,
                                               std::initializer_list<std::pair<const char*, std::uint64_t>> aligned) {
  if (num_kv_heads != 1) return fmt::format("num_kv_heads {} (the split path serves one KV head)", num_kv_heads);
  if (q_head_dim == 0 || q_head_dim % 32 != 0) return fmt::format("q_head_dim {} is not a multiple of 32", q_head_dim);
  if (auto why = split_dim_problem(kv_cache_dim)) return why;
  if (q_head_dim > kv_cache_dim) return fmt::format("q_head_dim {} > kv_cache_dim {}", q_head_dim, kv_cache_dim);
  for (const auto& [name, value] : aligned)
    if (value % 16 != 0) return fmt::format("{} {:#x} is not 16-byte aligned", name, value);
  return std::nullopt;
}

// `partials`: the kernel writes o_partial and ml_partial (the entry that combines in its clusters
// does not read them).
void validate_split(const Validator& v, const SplitDecodeArgs& a, std::uint64_t comp_keys, bool partials = true) {
  v.non_null({{"q", a.q},
              {"k_cache", a.k_cache},
              {"v_cache", a.v_cache},
              {"block_tables", a.block_tables},
              {"seq_lens", a.seq_lens}});
  if (partials) v.non_null({{"o_partial", a.o_partial}, {"ml_partial", a.ml_partial}});
  v.positive({{"num_seqs", a.num_seqs},
              {"num_q_heads", a.num_q_heads},
              {"num_splits", a.num_splits},
              {"block_size", a.block_size},
              {"max_blocks_per_seq", a.max_blocks_per_seq}});
  v.at_most("num_seqs", a.num_seqs, detail::kMaxGridYZ);
  v.at_most("num_splits", a.num_splits, detail::kMaxGridX);
  if (const auto why = split_rows_problem(a.rows_per_block)) v.check(false, "{}", *why);
  v.check(a.keys_per_split > 0 && a.keys_per_split % kTileKeys == 0,
          "keys_per_split {} is not a positive multiple of 32", a.keys_per_split);
  v.logit_scale("logit_scale", a.logit_scale);
  v.check((std::uint64_t{a.num_q_heads} + a.rows_per_block - 1) / a.rows_per_block <= detail::kMaxGridYZ,
          "num_q_heads {} needs more than {} blocks of rows_per_block {} (the grid's y)", a.num_q_heads,
          detail::kMaxGridYZ, a.rows_per_block);
  // Key indices are 32-bit in the kernels; the chunks must cover every key the table can hold.
  const std::uint64_t capacity = std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp_keys;
  v.check(capacity <= detail::kMaxKeys, "max_blocks_per_seq {} x block_size {} (+ {} compressed) keys exceed 2^31 - 1",
          a.max_blocks_per_seq, a.block_size, comp_keys);
  v.check(std::uint64_t{a.num_splits} * a.keys_per_split >= capacity,
          "num_splits {} x keys_per_split {} covers fewer keys than the table holds ({}): keys would be dropped",
          a.num_splits, a.keys_per_split, capacity);
  // Their 4-byte elements (a misaligned one is a device fault on the CUDA backend).
  v.aligned(4, {{"block_tables", a.block_tables}, {"seq_lens", a.seq_lens}});
  if (partials) v.aligned(4, {{"o_partial", a.o_partial}, {"ml_partial", a.ml_partial}});
}

// The wgmma entries' extra rules: their block shapes, DeepSeek's rows, and the entry of the block
// (`entry64` for 64 heads; for 16, `entry16` or `entry16_staged`, null where the format has none).
// `handle`: the entry split_launcher_name found the kernel to be (that of rows_per_block when it
// is none of them).
void validate_wgmma_shape(const Validator& v, const SplitDecodeArgs& a) {
  v.aligned(8, {{"o_partial", a.o_partial}});
  v.check(a.rows_per_block == kWgmmaRows || a.rows_per_block == kWgmma16Rows,
          "rows_per_block {} is not 64 or 16 (the wgmma blocks)", a.rows_per_block);
  v.check(a.keys_per_split % kWgmmaTileKeys == 0, "keys_per_split {} is not a multiple of 64 (the wgmma tile)",
          a.keys_per_split);
  v.check(a.q_head_dim == kWgmmaDim && a.kv_cache_dim == kWgmmaDim,
          "q_head_dim {} and kv_cache_dim {} are not both 576 (the wgmma entries' rows)", a.q_head_dim, a.kv_cache_dim);
}
void validate_wgmma(const Validator& v, const GpuBackend& gpu, KernelHandle kernel, const SplitDecodeArgs& a,
                    std::string_view handle, const char* entry64, const char* entry16, const char* entry16_staged) {
  validate_wgmma_shape(v, a);
  // Each entry serves one block size: a handle of this launcher's other size is named as such.
  const bool handle16 = handle == entry16 || (entry16_staged != nullptr && handle == entry16_staged);
  v.check(!(a.rows_per_block == kWgmmaRows && handle16) && !(a.rows_per_block == kWgmma16Rows && handle == entry64),
          "rows_per_block {} does not fit kernel {}.{}, whose blocks serve {} heads", a.rows_per_block, kMlaWgmmaModule,
          handle, handle16 ? kWgmma16Rows : kWgmmaRows);
  if (a.rows_per_block == kWgmmaRows) {
    validate_entry(v, gpu, kernel, {entry64});
  } else if (entry16_staged != nullptr) {
    validate_entry(v, gpu, kernel, {entry16, entry16_staged});
  } else {
    validate_entry(v, gpu, kernel, {entry16});
  }
}

// `out` apart from what the split blocks read: q (unless `with_q` is false: the caller checks it),
// the tables and each pool (and comp_pool) from its first row's data at least (a pool's extent
// follows its table). Checked last, after the rules that name a bad shape, so that those come first.
void validate_apart_from_reads(const Validator& v, const SplitDecodeArgs& a, const Validator::Extent& out,
                               DevicePtr comp_pool, bool with_q = true) {
  if (with_q) v.disjoint(out, {{"q", a.q, detail::saturating_product({a.num_seqs, a.num_q_heads, a.q_head_dim, 2})}});
  // NVFP4's packed row; FP8's is twice that
  detail::validate_apart_from_pools_and_tables(v, out, a, a.kv_cache_dim / 2, comp_pool);
}
// The partials apart from what the split blocks read, and from each other.
void validate_partials_apart(const Validator& v, const SplitDecodeArgs& a, DevicePtr comp_pool = {}) {
  using detail::saturating_product;
  const std::uint64_t slots = saturating_product({a.num_seqs, a.num_q_heads, a.num_splits});
  const Validator::Extent o{"o_partial", a.o_partial, saturating_product({slots, a.kv_cache_dim, 4})};
  const Validator::Extent ml{"ml_partial", a.ml_partial, saturating_product({slots, 2, 4})};
  for (const Validator::Extent& out : {o, ml}) validate_apart_from_reads(v, a, out, comp_pool);
  v.disjoint(ml, {o});
}

// Grid, block, shared memory and the common arguments of a launch of split entry `entry` (module
// mla_fast's, or mla_wgmma's: its block is wgmma_block(entry)); `outputs` the pointers in
// o_partial's and ml_partial's places (the entries that combine in their clusters take sinks and o
// there).
KernelLaunch& split_args(KernelLaunch& l, const SplitDecodeArgs& a, KvFormat format, std::string_view entry,
                         std::optional<std::pair<DevicePtr, DevicePtr>> outputs = {}) {
  const std::uint32_t raw = a.staged ? split_raw_pitch(format, a.kv_cache_dim) : 0;
  const WgmmaBlock b = entry.starts_with("mla_paged_decode_wgmma")
                           ? wgmma_block(entry)
                           : WgmmaBlock{a.rows_per_block, 8 * a.rows_per_block,
                                        split_shared_bytes(a.rows_per_block, a.kv_cache_dim, raw)};
  return l.grid({a.num_splits, (a.num_q_heads + a.rows_per_block - 1) / a.rows_per_block, a.num_seqs})
      .block({b.threads, 1, 1})
      .shared_bytes(b.shared_bytes)
      .early_start()  // the kernel waits for the one ahead before it touches memory
      .arg_ptr(a.q)
      .arg_ptr(a.k_cache)
      .arg_ptr(a.v_cache)
      .arg_ptr(outputs ? outputs->first : a.o_partial)
      .arg_ptr(outputs ? outputs->second : a.ml_partial)
      .arg_ptr(a.block_tables)
      .arg_ptr(a.seq_lens)
      .arg_u32(a.max_blocks_per_seq)
      .arg_u32(a.num_q_heads)
      .arg_u32(a.q_head_dim)
      .arg_u32(a.kv_cache_dim)
      .arg_u32(a.block_size)
      .arg_f32(a.logit_scale);
}

SplitDecodeArgs split_from(const PagedDecodeCommon& a, const SplitPlan& p, DevicePtr ws, float logit_scale) {
  return {a.q,
          a.k_cache,
          a.v_cache,
          ws,
          ws + p.ml_offset,
          a.block_tables,
          a.seq_lens,
          a.max_blocks_per_seq,
          a.num_q_heads,
          a.q_head_dim,
          a.kv_cache_dim,
          a.block_size,
          logit_scale,
          p.keys_per_split,
          a.num_seqs,
          p.num_splits,
          p.rows_per_block,
          p.staged};
}

}  // namespace

bool module_runs_on(const GpuBackend& gpu, std::string_view module) {
  return module != kMlaWgmmaModule || gpu.compute_capability() == 90;
}

std::optional<std::string> entry_unavailable(const GpuBackend& gpu, std::string_view module, std::string_view entry) {
  if (!module_runs_on(gpu, module))
    return fmt::format("module {} is not built for compute capability {}", module, gpu.compute_capability());
  if (module != kMlaWgmmaModule) return std::nullopt;
  const std::uint32_t bytes = wgmma_block(entry).shared_bytes;
  if (bytes <= gpu.max_shared_bytes_per_block()) return std::nullopt;
  return fmt::format("{} needs {} bytes of shared memory per block, the device allows {}", entry, bytes,
                     gpu.max_shared_bytes_per_block());
}

MlaFastKernels MlaFastKernels::resolve(GpuBackend& gpu) {
  auto k = [&](const char* entry) { return gpu.kernel(kMlaFastModule, entry); };
  MlaFastKernels r{k("mla_paged_decode_split_fp8"),
                   k("mla_paged_decode_split_nvfp4"),
                   k("mla_paged_decode_combine"),
                   k("mla_batched_gemv_wide"),
                   k("mla_paged_decode_split16_fp8"),
                   k("mla_paged_decode_split16_nvfp4"),
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {}};
  if (module_runs_on(gpu, kMlaWgmmaModule)) {
    r.wgmma_fp8 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma_fp8");
    r.wgmma_nvfp4 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma_nvfp4");
    r.wgmma16_fp8 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma16_fp8");
    r.wgmma16_nvfp4 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma16_nvfp4");
    r.wgmma16_rs_fp8 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma16_rs_fp8");
    r.wgmma16_rs_nvfp4 = gpu.kernel(kMlaWgmmaModule, "mla_paged_decode_wgmma16_rs_nvfp4");
    r.wgmma16_rs_combine_fp8 = gpu.kernel(kMlaWgmmaModule, kFusedEntry);
    r.wgmma_combine_fp8 = gpu.kernel(kMlaWgmmaModule, kFusedEntry64);
    r.wgmma_latent_fp8 = gpu.kernel(kMlaWgmmaModule, kLatentEntry);
    r.wgmma_latent_combine_fp8 = gpu.kernel(kMlaWgmmaModule, kFusedLatentEntry);
    r.wgmma_latent_nvfp4 = gpu.kernel(kMlaWgmmaModule, kLatentNvfp4Entry);
    r.wgmma_latent_combine_nvfp4 = gpu.kernel(kMlaWgmmaModule, kFusedLatentNvfp4Entry);
    auto clusters = [&](KernelHandle kernel, const char* entry, std::uint32_t n) {
      const WgmmaBlock b = wgmma_block(entry);
      return gpu.max_active_clusters(kernel, {b.threads, 1, 1}, b.shared_bytes, n);
    };
    for (std::uint32_t n = 1; n <= kMaxClusterSplits; ++n) {
      r.fused_clusters[n] = clusters(r.wgmma16_rs_combine_fp8, kFusedEntry, n);
      r.fused_clusters64[n] = clusters(r.wgmma_combine_fp8, kFusedEntry64, n);
      r.fused_clusters_latent[n] = clusters(r.wgmma_latent_combine_fp8, kFusedLatentEntry, n);
      r.fused_clusters_latent_nvfp4[n] = clusters(r.wgmma_latent_combine_nvfp4, kFusedLatentNvfp4Entry, n);
    }
  }
  return r;
}

std::uint32_t wgmma_shared_bytes(KvFormat format, std::uint32_t rows_per_block, bool staged) {
  // A staged row's raw bytes (unpadded): FP8's codes, or NVFP4's data and scales.
  const std::uint32_t raw_row = format == KvFormat::fp8 ? kWgmmaDim : kWgmmaDim / 2 + kWgmmaDim / 16;
  if (rows_per_block == kWgmma16Rows && staged)
    return 1024                                 // alignment of the swizzled tiles
           + kWgmma16Rows * kWgmmaDim * 2       // Q (FP16)
           + kWgmma16Rows * kWgmmaTileKeys * 2  // P (FP16)
           + 2 * kWgmmaTileKeys * raw_row       // the raw K and V half-tiles
           + kWgmma16Rows * 4                   // the Q rows' unscale factors
           + 4 * kWgmma16Rows * 4               // the per-warp maxima and sums
           + 2 * 8;                             // the two slots' mbarriers
  if (rows_per_block == kWgmma16Rows)
    return 1024                                                   // alignment of the swizzled tiles
           + (kWgmma16Rows + 2 * kWgmmaTileKeys) * kWgmmaDim * 2  // Q, the K tile and the V tile (FP16)
           + kWgmma16Rows * kWgmmaTileKeys * 2                    // P (FP16)
           + kWgmma16Rows * 4                                     // the Q rows' unscale factors
           + 4 * kWgmma16Rows * 4;                                // the consumer's per-warp maxima and sums
  return 1024                                                     // alignment of the swizzled tiles
         + kWgmmaRows * kWgmmaDim * 2                             // Q (FP16)
         + kWgmmaRows * kWgmmaTileKeys * 2                        // Pᵀ (FP16), each warpgroup's 32 heads
         + 2 * 2 * kWgmmaTileKeys * raw_row                       // two slots of the raw K and V tiles
         + kWgmmaRows * 4                                         // the Q rows' unscale factors
         + 2 * 4 * 32 * 4                                         // the per-warp maxima and sums
         + 2 * 4 * 4                                              // the warps' rescale votes
         + 3 * 2 * 8;                                             // the slots' fill and release mbarriers
}

std::uint32_t wgmma_latent_shared_bytes() {
  return 1024                                  // alignment of the swizzled tiles
         + kWgmmaRows * kWgmmaDim * 2          // Q (FP16)
         + 2 * kWgmmaTileKeys * kWgmmaDim * 2  // two tiles (FP16): this one and the next
         + kWgmmaRows * kWgmmaTileKeys * 2     // P (FP16)
         + 3 * kWgmmaRows * 4                  // the Q rows' unscale, two tiles' rescale factors
         + 4 * 8;                              // the rescale factors' full and empty mbarriers
}

std::uint32_t wgmma_threads(std::uint32_t rows_per_block, bool staged) {
  return rows_per_block != kWgmma16Rows ? 256 : staged ? 128 : 384;
}

WgmmaBlock wgmma_block(std::string_view entry) {
  const std::uint32_t rows = entry.starts_with("mla_paged_decode_wgmma16") ? kWgmma16Rows : kWgmmaRows;
  const bool staged = entry.starts_with("mla_paged_decode_wgmma16_rs");
  const KvFormat format = entry.ends_with("nvfp4") ? KvFormat::nvfp4 : KvFormat::fp8;
  return {rows, wgmma_threads(rows, staged),
          entry.starts_with("mla_paged_decode_wgmma_latent") ? wgmma_latent_shared_bytes()
                                                             : wgmma_shared_bytes(format, rows, staged)};
}

std::uint32_t wgmma_rows(const PagedDecodeCommon& a, std::uint32_t comp_block_count, std::uint32_t multiprocessors) {
  if (a.q_head_dim != kWgmmaDim || a.kv_cache_dim != kWgmmaDim) return 0;
  if (a.num_q_heads <= kWgmma16Rows) return kWgmma16Rows;
  if (a.num_q_heads <= 2 * kGroupRows) return 0;
  const std::uint64_t keys = std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp_block_count;
  const std::uint64_t work16 = std::uint64_t{a.num_seqs} * ((a.num_q_heads + kWgmma16Rows - 1) / kWgmma16Rows) *
                               ((keys + kWgmmaTileKeys - 1) / kWgmmaTileKeys);
  return work16 <= kSmallTiles16PerSm * std::max(1u, multiprocessors) ? kWgmma16Rows : kWgmmaRows;
}

bool wgmma_applies(const PagedDecodeCommon& a, KvFormat format, std::uint32_t max_shared_bytes,
                   std::uint32_t comp_block_count, std::uint32_t multiprocessors) {
  const std::uint32_t rows = wgmma_rows(a, comp_block_count, multiprocessors);
  return rows != 0 &&
         (wgmma_shared_bytes(format, rows) <= max_shared_bytes ||
          (format == KvFormat::fp8 && rows == kWgmmaRows && latent_applies(a, comp_block_count, max_shared_bytes)));
}

bool latent_applies(const PagedDecodeCommon& a, std::uint32_t comp_block_count, std::uint32_t max_shared_bytes) {
  return one_latent_pool(a) && comp_block_count == 0 &&
         std::uint64_t{a.max_blocks_per_seq} * a.block_size >= kLatentMinKeys &&
         wgmma_latent_shared_bytes() <= max_shared_bytes;
}

std::uint32_t split_raw_pitch(KvFormat format, std::uint32_t dim) {
  return format == KvFormat::fp8 ? 2 * dim : (dim + dim / 8 + 15) / 16 * 16;
}

std::optional<std::string> split_rows_problem(std::uint32_t rows_per_block) {
  if (rows_per_block % kGroupRows == 0 && rows_per_block >= kGroupRows && rows_per_block <= 4 * kGroupRows)
    return std::nullopt;
  return fmt::format("rows_per_block {} is not 16, 32, 48 or 64", rows_per_block);
}

std::optional<std::string> split_dim_problem(std::uint32_t kv_cache_dim) {
  if (kv_cache_dim % 64 == 0 && kv_cache_dim <= kMaxDim) return std::nullopt;
  return fmt::format("kv_cache_dim {} is not a multiple of 64 up to {}", kv_cache_dim, kMaxDim);
}

std::uint32_t split_shared_bytes(std::uint32_t rows, std::uint32_t dim, std::uint32_t raw_pitch) {
  const std::uint32_t pitch = dim + kPad;
  return (rows * pitch + kTileKeys * pitch + rows * (kTileKeys + kPad)) * 2  // q, kv, p (bf16)
         + 2 * rows * 4 * 4                                                  // red_max, red_sum
         + 2 * kTileKeys * 4 * 8                                             // row pointers, two tiles
         + kTileKeys * raw_pitch;                                            // a raw tile
}

std::uint32_t gemv_wide_rows_per_block(std::uint32_t k) {
  std::uint32_t segment = 1;  // lanes per row: the largest power of two ≤ min(32, k/16), at least 1
  while (segment < 32 && 2 * segment <= k / 16) segment *= 2;
  return 8 * kGemvSteps * (32 / segment);
}

std::uint32_t combine_dim_blocks(const CombineArgs& a, std::uint32_t multiprocessors) {
  // At least one (sequence, head) and one SM: the launcher refuses zero counts, a caller may not.
  const std::uint64_t heads = std::max<std::uint64_t>(1, std::uint64_t{a.num_q_heads} * a.num_seqs);
  const std::uint64_t slots = 8ull * std::max(1u, multiprocessors);
  const std::uint32_t tiles = (a.kv_cache_dim + 63) / 64;  // 64-dim tiles
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>((slots + heads - 1) / heads, 1, std::max(1u, tiles)));
}

std::uint32_t split_least_shared_bytes(std::uint32_t kv_cache_dim) {
  return split_shared_bytes(kGroupRows, kv_cache_dim, 0);
}

bool split_fits(std::uint32_t max_shared_bytes, std::uint32_t kv_cache_dim) {
  return split_least_shared_bytes(kv_cache_dim) <= max_shared_bytes;
}

SplitPlan plan_split_decode(const PagedDecodeCommon& a, KvFormat format, std::uint32_t comp_block_count,
                            std::uint32_t multiprocessors, std::uint32_t max_shared_bytes, bool wgmma,
                            std::span<const std::uint32_t> fused_clusters) {
  if (!split_fits(max_shared_bytes, a.kv_cache_dim))
    fail(Errc::unsupported, "split decode: a 16-head block needs {} bytes of shared memory, the device allows {}",
         split_least_shared_bytes(a.kv_cache_dim), max_shared_bytes);
  SplitPlan p;
  p.wgmma = wgmma && wgmma_applies(a, format, max_shared_bytes, comp_block_count, multiprocessors);
  std::uint32_t R = std::clamp((a.num_q_heads + kGroupRows - 1) / kGroupRows, 1u, 4u);
  while (R > 1 && split_shared_bytes(kGroupRows * R, a.kv_cache_dim, 0) > max_shared_bytes) --R;
  p.rows_per_block = kGroupRows * R;
  p.threads = 8 * p.rows_per_block;
  p.head_groups = (a.num_q_heads + p.rows_per_block - 1) / p.rows_per_block;
  // Staged where it fits and keeps the blocks an SM holds: by shared memory (an SM has about
  // 1 KiB more than a block may take, and reserves 1 KiB per block) and by registers (64K per
  // SM; at most 128 per thread, 168 on the 16-head entries). Measured on the H200
  // (docs/performance.md): two unstaged 32-head blocks per SM beat one staged; the one 64-head
  // block an SM holds either way gains from staging. 16-head blocks run on the 16-head entries,
  // which hold the next half-tile in registers and do not stage.
  const std::uint32_t direct_bytes = split_shared_bytes(p.rows_per_block, a.kv_cache_dim, 0);
  const std::uint32_t staged_bytes =
      split_shared_bytes(p.rows_per_block, a.kv_cache_dim, split_raw_pitch(format, a.kv_cache_dim));
  const std::uint32_t registers = p.rows_per_block == kGroupRows ? 168 : 128;
  const auto per_sm = [&](std::uint32_t bytes) {
    return std::min((max_shared_bytes + 1024) / (bytes + 1024), 65536 / (p.threads * registers));
  };
  p.staged =
      p.rows_per_block > kGroupRows && staged_bytes <= max_shared_bytes && per_sm(staged_bytes) == per_sm(direct_bytes);
  p.shared_bytes = p.staged ? staged_bytes : direct_bytes;
  std::uint32_t tile_keys = kTileKeys, blocks_per_sm = per_sm(p.shared_bytes);
  const std::uint64_t max_keys = std::uint64_t{a.max_blocks_per_seq} * a.block_size + comp_block_count;
  if (p.wgmma) {  // 64-key tiles; 64 heads on two warpgroups, staged, one block per SM; 16 heads
                  // on three (their producers' registers the staging), one per SM, or where each
                  // of two block slots per SM has at least kStagedTiles16 tiles to walk, staged
                  // on one warpgroup (wgmma16_rs), two per SM
    p.rows_per_block = wgmma_rows(a, comp_block_count, multiprocessors);
    p.head_groups = (a.num_q_heads + p.rows_per_block - 1) / p.rows_per_block;
    const std::uint64_t work = std::uint64_t{a.num_seqs} * p.head_groups * ((max_keys + 63) / 64);
    const std::uint64_t slots16 = 2ull * std::max(1u, multiprocessors);
    // NVFP4 over one latent pool: the specialised entry, which converts each tile once (the staged
    // one loads and converts a key's row twice), at any size (kStagedTiles16's note).
    const bool nvfp4_latent = format == KvFormat::nvfp4 && one_latent_pool(a);
    p.staged = p.rows_per_block == kWgmmaRows ||
               (!nvfp4_latent && work >= kStagedTiles16 * slots16 &&
                2 * (wgmma_shared_bytes(format, kWgmma16Rows, true) + 1024) <= max_shared_bytes + 1024);
    p.threads = wgmma_threads(p.rows_per_block, p.staged);
    p.shared_bytes = wgmma_shared_bytes(format, p.rows_per_block, p.staged);
    tile_keys = kWgmmaTileKeys, blocks_per_sm = p.rows_per_block == kWgmma16Rows && p.staged ? 2 : 1;
  }
  // The number of splits: the least work on the busiest block slot, ⌈blocks / slots⌉ rounds of
  // ⌈tiles / splits⌉ tiles plus one tile's worth for each block's fixed cost (its Q rows,
  // pipeline start, partial and share of the combine; kPartialTiles64 more on the 64-head wgmma
  // blocks); ties go to fewer splits. At least four 32-key tiles a split on the mma.sync entries:
  // at one sequence of 4096 keys, 128 one-tile splits took 111 µs on the H200 (the old combine's
  // loop over them), 32 four-tile splits 58.
  // The 16-head wgmma blocks' 64-key tiles go down to one a split — at B = 1 to 32 up to 4K keys
  // 0.54–1.01× the time of four; not the 64-head blocks', whose fixed cost is larger (FP8, B = 1 ×
  // 16K × 64: 128 two-tile splits 1.13× the time of 64 of four; NVFP4's block, FP8's design since
  // the sixteenth session, with one-tile splits 1.06–1.12× its old block's time there). Measured
  // on the H200, docs/performance.md.
  const bool one_tile = p.wgmma && p.rows_per_block == kWgmma16Rows;
  const std::uint64_t base = std::uint64_t{a.num_seqs} * p.head_groups;
  // (A table of no keys still gets one split; a device reported with no SMs counts as one.)
  const std::uint64_t slots = std::uint64_t{std::max(1u, multiprocessors)} * std::max(1u, blocks_per_sm);
  const std::uint64_t tiles = std::max<std::uint64_t>(1, (max_keys + tile_keys - 1) / tile_keys);
  const std::uint64_t min_tiles = one_tile ? 1 : 4;
  const std::uint64_t max_splits = std::clamp<std::uint64_t>((tiles + min_tiles - 1) / min_tiles, 1, 4 * slots);
  const std::uint64_t fixed = p.wgmma && p.rows_per_block == kWgmmaRows ? 1 + kPartialTiles64 : 1;
  std::uint64_t per = tiles, best = ~std::uint64_t{0};
  for (std::uint64_t n = 1; n <= max_splits; ++n) {
    const std::uint64_t tiles_each = (tiles + n - 1) / n, splits = (tiles + tiles_each - 1) / tiles_each;
    const std::uint64_t cost = (base * splits + slots - 1) / slots * (tiles_each + fixed);
    if (cost < best) best = cost, per = tiles_each;
  }
  // Staged 16-head and 64-head blocks may instead combine in clusters of their n ≤ 8 splits (no combine
  // launch, taken as kCombineTiles tiles' worth), ⌈clusters / fused_clusters[n]⌉ rounds: where
  // that costs no more, with the n that costs least (ties to fewer).
  if (!fused_clusters.empty() && fused_clusters.size() != kMaxClusterSplits + 1)
    fail(Errc::invalid_argument, "split plan: fused_clusters has {} entries, not {} (index n = 0..{})",
         fused_clusters.size(), kMaxClusterSplits + 1, kMaxClusterSplits);
  if (p.wgmma && p.staged && !fused_clusters.empty() &&
      per <= 0x7FFF'FFC0 / tile_keys) {  // (longer chunks are clamped below: more than 8 of them)
    std::uint64_t fused_best = ~std::uint64_t{0}, fused_per = 0;
    for (std::uint64_t n = 1; n <= std::min<std::uint64_t>(kMaxClusterSplits, tiles); ++n) {
      const std::uint64_t tiles_each = (tiles + n - 1) / n, splits = (tiles + tiles_each - 1) / tiles_each;
      const std::uint64_t at_once = fused_clusters[splits];
      if (at_once == 0) continue;
      const std::uint64_t cost = (base + at_once - 1) / at_once * (tiles_each + 1);
      if (cost < fused_best) fused_best = cost, fused_per = tiles_each;
    }
    if (fused_per != 0 && fused_per <= 0x7FFF'FFC0 / tile_keys && fused_best <= best + kCombineTiles)
      p.fused = true, per = fused_per;
  }
  p.keys_per_split = static_cast<std::uint32_t>(std::min<std::uint64_t>(per, 0x7FFF'FFC0 / tile_keys) * tile_keys);
  p.num_splits =
      static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (max_keys + p.keys_per_split - 1) / p.keys_per_split));
  if (p.fused) return p;  // no partials: no workspace
  const std::uint64_t partials = std::uint64_t{a.num_seqs} * a.num_q_heads * p.num_splits;
  p.ml_offset = partials * a.kv_cache_dim * 4;
  p.workspace_bytes = p.ml_offset + partials * 2 * 4;
  return p;
}

std::optional<std::string> split_unsupported(const PagedDecodeFp8Args& a) {
  return split_shape_problem(a.num_kv_heads, a.q_head_dim, a.kv_cache_dim,
                             {{"k_cache", a.k_cache.addr},
                              {"v_cache", a.v_cache.addr},
                              {"comp_pool", a.comp_pool.addr},
                              {"cache_stride", a.cache_stride},
                              {"q", a.q.addr}});
}

std::optional<std::string> split_unsupported(const PagedDecodeNvfp4Args& a) {
  return split_shape_problem(a.num_kv_heads, a.q_head_dim, a.kv_cache_dim,
                             {{"k_cache", a.k_cache.addr},
                              {"v_cache", a.v_cache.addr},
                              {"block_stride_bytes", a.block_stride_bytes},
                              {"data_section_bytes", a.data_section_bytes},
                              {"q", a.q.addr}});
}

namespace {

// The name a split launcher's errors start with: the split entry's (the 16-head one's when
// `kernel` is that entry), or the wgmma entry's that `kernel` is (when it is none of them, the
// unstaged one of rows_per_block; so the staged entry's name means the handle is that entry).
const char* split_launcher_name(const GpuBackend& gpu, KernelHandle kernel, const SplitDecodeArgs& a, bool wgmma,
                                const char* split, const char* split16, const char* wgmma64, const char* wgmma16,
                                const char* wgmma16_staged = nullptr) {
  const std::string name = gpu.kernel_name(kernel);
  if (!wgmma) return name.ends_with(std::string(".") + split16) ? split16 : split;
  for (const char* entry : {wgmma16, wgmma64, wgmma16_staged})
    if (entry != nullptr && name.ends_with(std::string(".") + entry)) return entry;
  return a.rows_per_block == kWgmma16Rows ? wgmma16 : wgmma64;
}

// The FP8 split launchers' rules on `a`, but for the entry (`partials` as validate_split's).
void validate_split_fp8(const Validator& v, const SplitDecodeFp8Args& a, bool partials) {
  validate_split(v, a, a.comp_pool ? a.comp_block_count : 0, partials);
  if (auto why = split_shape_problem(1, a.q_head_dim, a.kv_cache_dim,
                                     {{"k_cache", a.k_cache.addr},
                                      {"v_cache", a.v_cache.addr},
                                      {"comp_pool", a.comp_pool.addr},
                                      {"cache_stride", a.cache_stride},
                                      {"q", a.q.addr}}))
    v.check(false, "{}", *why);
  v.check(a.cache_stride >= a.kv_cache_dim, "cache_stride {} < kv_cache_dim {}", a.cache_stride, a.kv_cache_dim);
  detail::validate_row_offsets(v, a.block_size, a.cache_stride, "cache_stride");
  if (a.comp_pool) detail::validate_comp_offsets(v, a.num_seqs, a.comp_block_count, a.cache_stride);
}

// The NVFP4 split launchers' rules on `a`, but for the entry (`partials` as validate_split's).
void validate_split_nvfp4(const Validator& v, const SplitDecodeNvfp4Args& a, bool partials) {
  validate_split(v, a, 0, partials);
  if (auto why = split_shape_problem(1, a.q_head_dim, a.kv_cache_dim,
                                     {{"k_cache", a.k_cache.addr},
                                      {"v_cache", a.v_cache.addr},
                                      {"block_stride_bytes", a.block_stride_bytes},
                                      {"data_section_bytes", a.data_section_bytes},
                                      {"q", a.q.addr}}))
    v.check(false, "{}", *why);
  detail::validate_block_offsets(v, a.block_stride_bytes);
  v.check(a.data_section_bytes >= std::uint64_t{a.block_size} * a.kv_cache_dim / 2 &&
              a.block_stride_bytes - std::min(a.block_stride_bytes, a.data_section_bytes) >=
                  std::uint64_t{a.block_size} * a.kv_cache_dim / 16,
          "NVFP4 sections (data {} bytes, block stride {} bytes) do not hold block_size {} rows of {} values",
          a.data_section_bytes, a.block_stride_bytes, a.block_size, a.kv_cache_dim);
}

// The heads-in-M entries' rule: V is read from the K rows (`comp_block_count`: the FP8 compressed
// entries, 0 without a comp_pool).
void validate_latent(const Validator& v, const SplitDecodeArgs& a, std::uint32_t comp_block_count = 0) {
  v.check(a.v_cache == a.k_cache, "v_cache {:#x} is not k_cache {:#x} (the entry reads V from the one latent pool)",
          a.v_cache.addr, a.k_cache.addr);
  v.check(comp_block_count == 0,
          "comp_block_count {} with a comp_pool: compressed entries' V rows are not their K rows", comp_block_count);
}

void launch_split_fp8(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeFp8Args& a, Stream stream, bool wgmma) {
  const bool latent = wgmma && gpu.kernel_name(kernel).ends_with(std::string(".") + kLatentEntry);
  const std::string_view name =
      latent ? kLatentEntry
             : split_launcher_name(gpu, kernel, a, wgmma, "mla_paged_decode_split_fp8", "mla_paged_decode_split16_fp8",
                                   "mla_paged_decode_wgmma_fp8", "mla_paged_decode_wgmma16_fp8",
                                   "mla_paged_decode_wgmma16_rs_fp8");
  const Validator v{name};
  validate_split_fp8(v, a, true);
  if (wgmma) {
    validate_wgmma(v, gpu, kernel, a, name, latent ? kLatentEntry : "mla_paged_decode_wgmma_fp8",
                   "mla_paged_decode_wgmma16_fp8", "mla_paged_decode_wgmma16_rs_fp8");
  } else {
    validate_entry(v, gpu, kernel, {"mla_paged_decode_split_fp8", "mla_paged_decode_split16_fp8"});
  }
  if (latent) validate_latent(v, a, a.comp_pool ? a.comp_block_count : 0);
  validate_partials_apart(v, a, a.comp_pool);
  KernelLaunch l(gpu, kernel);
  split_args(l, a, KvFormat::fp8, name)  // the handle's entry
      .arg_u64(a.cache_stride)
      .arg_u32(a.sliding_window)
      .arg_ptr(a.comp_pool)
      .arg_u32(a.comp_block_count)
      .arg_u32(a.keys_per_split)
      .launch(stream);
}

void launch_split_nvfp4(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeNvfp4Args& a, Stream stream,
                        bool wgmma) {
  const bool latent = wgmma && gpu.kernel_name(kernel).ends_with(std::string(".") + kLatentNvfp4Entry);
  const std::string_view name =
      latent ? kLatentNvfp4Entry
             : split_launcher_name(gpu, kernel, a, wgmma, "mla_paged_decode_split_nvfp4",
                                   "mla_paged_decode_split16_nvfp4", "mla_paged_decode_wgmma_nvfp4",
                                   "mla_paged_decode_wgmma16_nvfp4", "mla_paged_decode_wgmma16_rs_nvfp4");
  const Validator v{name};
  validate_split_nvfp4(v, a, true);
  if (wgmma) {
    validate_wgmma(v, gpu, kernel, a, name, latent ? kLatentNvfp4Entry : "mla_paged_decode_wgmma_nvfp4",
                   "mla_paged_decode_wgmma16_nvfp4", "mla_paged_decode_wgmma16_rs_nvfp4");
  } else {
    validate_entry(v, gpu, kernel, {"mla_paged_decode_split_nvfp4", "mla_paged_decode_split16_nvfp4"});
  }
  if (latent) validate_latent(v, a);
  validate_partials_apart(v, a);
  KernelLaunch l(gpu, kernel);
  split_args(l, a, KvFormat::nvfp4, name)  // the handle's entry
      .arg_u64(a.block_stride_bytes)
      .arg_u64(a.data_section_bytes)
      .arg_u32(a.keys_per_split)
      .launch(stream);
}

}  // namespace

void mla_paged_decode_split_fp8(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeFp8Args& a, Stream stream) {
  launch_split_fp8(gpu, kernel, a, stream, false);
}
void mla_paged_decode_split_nvfp4(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeNvfp4Args& a, Stream stream) {
  launch_split_nvfp4(gpu, kernel, a, stream, false);
}
void mla_paged_decode_wgmma_fp8(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeFp8Args& a, Stream stream) {
  launch_split_fp8(gpu, kernel, a, stream, true);
}
void mla_paged_decode_wgmma_nvfp4(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeNvfp4Args& a, Stream stream) {
  launch_split_nvfp4(gpu, kernel, a, stream, true);
}

// Whether o [rows, 576] bf16 and q [rows, q_head_dim] bf16 share a byte.
bool o_overlaps_q(DevicePtr o, DevicePtr q, std::uint64_t rows, std::uint32_t q_head_dim) {
  return o.addr < q.addr + rows * q_head_dim * 2 && q.addr < o.addr + rows * kWgmmaDim * 2;
}

namespace {

// The cluster entries' launcher: `entry` (the 16-head, 64-head or heads-in-M one) of `rows` heads
// a block.
// The cluster entries' rules on their blocks and `o` (`s` as split_args takes it): the entry's
// rows, at most 8 splits, o 8-byte aligned and apart from q.
void validate_fused_shape(const Validator& v, const SplitDecodeArgs& s, DevicePtr o, std::uint32_t rows) {
  validate_wgmma_shape(v, s);
  v.check(s.rows_per_block == rows, "rows_per_block {} is not {} (the entry's blocks)", s.rows_per_block, rows);
  v.at_most("num_splits", s.num_splits, kMaxClusterSplits);
  v.non_null({{"o", o}});
  v.aligned(8, {{"o", o}});
  const std::uint64_t o_rows = std::uint64_t{s.num_seqs} * s.num_q_heads;
  v.check(!o_overlaps_q(o, s.q, o_rows, s.q_head_dim),
          "o spans [{:#x}, {:#x}), which overlaps q's [{:#x}, {:#x}) (num_seqs {} x num_q_heads {} rows of {} and {} "
          "bf16): a cluster's blocks read q while others write o",
          o.addr, o.addr + o_rows * kWgmmaDim * 2, s.q.addr, s.q.addr + o_rows * s.q_head_dim * 2, s.num_seqs,
          s.num_q_heads, kWgmmaDim, s.q_head_dim);
}
// Then the handle, the latent pool (`latent`: the heads-in-M entries, `comp_block_count` the FP8
// compressed entries) and o apart from what the blocks read and from sinks.
void validate_fused_entry(const Validator& v, const GpuBackend& gpu, KernelHandle kernel, const SplitDecodeArgs& s,
                          DevicePtr sinks, DevicePtr o, const char* entry, bool latent, DevicePtr comp_pool,
                          std::uint32_t comp_block_count) {
  validate_entry(v, gpu, kernel, {entry});
  if (latent) validate_latent(v, s, comp_block_count);
  const Validator::Extent out{"o", o, std::uint64_t{s.num_seqs} * s.num_q_heads * kWgmmaDim * 2};
  validate_apart_from_reads(v, s, out, comp_block_count > 0 ? comp_pool : DevicePtr{}, false);  // q: above
  v.disjoint(out, {{"sinks", sinks, std::uint64_t{s.num_q_heads} * 4}});
}

void launch_fused_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a, Stream stream,
                      const char* entry, std::uint32_t rows) {
  const Validator v{entry};
  SplitDecodeFp8Args s = a.split;
  s.o_partial = s.ml_partial = {};  // not used
  validate_split_fp8(v, s, false);
  validate_fused_shape(v, s, a.o, rows);
  v.e4m3_scale("v_scale", a.v_scale);
  validate_fused_entry(v, gpu, kernel, s, a.sinks, a.o, entry, entry == std::string_view(kFusedLatentEntry),
                       s.comp_pool, s.comp_pool ? s.comp_block_count : 0);
  KernelLaunch l(gpu, kernel);
  split_args(l, s, KvFormat::fp8, entry, std::pair{a.sinks, a.o})
      .cluster({s.num_splits, 1, 1})  // a (sequence, head group)'s chunks: one cluster
      .arg_u64(s.cache_stride)
      .arg_u32(s.sliding_window)
      .arg_ptr(s.comp_pool)
      .arg_u32(s.comp_block_count)
      .arg_u32(s.keys_per_split)
      .arg_f32(a.v_scale)
      .launch(stream);
}

}  // namespace

void mla_paged_decode_wgmma16_rs_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                             Stream stream) {
  launch_fused_fp8(gpu, kernel, a, stream, kFusedEntry, kWgmma16Rows);
}
void mla_paged_decode_wgmma_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                        Stream stream) {
  launch_fused_fp8(gpu, kernel, a, stream, kFusedEntry64, kWgmmaRows);
}
void mla_paged_decode_wgmma_latent_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                               Stream stream) {
  launch_fused_fp8(gpu, kernel, a, stream, kFusedLatentEntry, kWgmmaRows);
}

void mla_paged_decode_wgmma_latent_combine_nvfp4(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeNvfp4Args& a,
                                                 Stream stream) {
  const Validator v{kFusedLatentNvfp4Entry};
  SplitDecodeNvfp4Args s = a.split;
  s.o_partial = s.ml_partial = {};  // not used
  validate_split_nvfp4(v, s, false);
  validate_fused_shape(v, s, a.o, kWgmmaRows);
  validate_fused_entry(v, gpu, kernel, s, a.sinks, a.o, kFusedLatentNvfp4Entry, true, {}, 0);
  KernelLaunch l(gpu, kernel);
  split_args(l, s, KvFormat::nvfp4, kFusedLatentNvfp4Entry, std::pair{a.sinks, a.o})
      .cluster({s.num_splits, 1, 1})  // a (sequence, head group)'s chunks: one cluster
      .arg_u64(s.block_stride_bytes)
      .arg_u64(s.data_section_bytes)
      .arg_u32(s.keys_per_split)
      .launch(stream);
}

void mla_paged_decode_combine(GpuBackend& gpu, KernelHandle kernel, const CombineArgs& a, Stream stream) {
  const Validator v{"mla_paged_decode_combine"};
  v.non_null({{"o_partial", a.o_partial}, {"ml_partial", a.ml_partial}, {"o", a.o}});
  v.positive({{"num_q_heads", a.num_q_heads},
              {"kv_cache_dim", a.kv_cache_dim},
              {"num_splits", a.num_splits},
              {"num_seqs", a.num_seqs}});
  v.at_most("num_seqs", a.num_seqs, detail::kMaxGridYZ);
  v.at_most("num_q_heads", a.num_q_heads, detail::kMaxGridX);
  v.e4m3_scale("v_scale", a.v_scale);
  using detail::saturating_product;
  v.disjoint(
      {"o", a.o, saturating_product({a.num_seqs, a.num_q_heads, a.kv_cache_dim, 2})},
      {{"o_partial", a.o_partial, saturating_product({a.num_seqs, a.num_q_heads, a.num_splits, a.kv_cache_dim, 4})},
       {"ml_partial", a.ml_partial, saturating_product({a.num_seqs, a.num_q_heads, a.num_splits, 2, 4})},
       {"sinks", a.sinks, std::uint64_t{a.num_q_heads} * 4}});
  KernelLaunch(gpu, kernel)
      .grid({a.num_q_heads, a.num_seqs, combine_dim_blocks(a, gpu.multiprocessor_count())})
      .block({256, 1, 1})
      .early_start()  // the kernel waits for the split kernel before it reads the partials
      .arg_ptr(a.o_partial)
      .arg_ptr(a.ml_partial)
      .arg_ptr(a.sinks)
      .arg_ptr(a.o)
      .arg_u32(a.num_q_heads)
      .arg_u32(a.kv_cache_dim)
      .arg_u32(a.num_splits)
      .arg_f32(a.v_scale)
      .launch(stream);
}

void mla_batched_gemv_wide(GpuBackend& gpu, KernelHandle kernel, const BatchedGemvArgs& a, Stream stream,
                           GemvStart start) {
  const Validator v{"mla_batched_gemv_wide"};
  // The seed GEMV has the same parameters, so the backend's check cannot tell them apart.
  validate_entry(v, gpu, kernel, {"mla_batched_gemv_wide"});
  detail::validate_gemv(v, a);
  v.check(a.k % 8 == 0 && a.input_stride % 8 == 0, "k {} and input_stride {} must be multiples of 8 (16-byte loads)",
          a.k, a.input_stride);
  // the kernel loads 16 bytes at a time (its port reads elements: only this check catches a misaligned one)
  v.aligned(16, {{"input", a.input}, {"weight", a.weight}});
  detail::validate_gemv_buffers(v, a);
  KernelLaunch(gpu, kernel)
      .grid({div_ceil(a.n_out, gemv_wide_rows_per_block(a.k)), a.num_heads, 1})
      .block({256, 1, 1})
      .early_start(start == GemvStart::early)
      .arg_ptr(a.input)
      .arg_ptr(a.weight)
      .arg_ptr(a.output)
      .arg_u32(a.n_out)
      .arg_u32(a.k)
      .arg_u32(a.input_stride)
      .arg_u32(a.output_stride)
      .launch(stream);
}

DecodePath paged_decode_fp8(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast,
                            const PagedDecodeFp8Args& a, DecodeWorkspace& ws, Stream stream) {
  validate(a);  // the seed launcher's rules hold for both paths
  if (split_unsupported(a) || !split_fits(gpu.max_shared_bytes_per_block(), a.kv_cache_dim)) {
    mla_paged_decode_fp8(gpu, seed.paged_decode_fp8, a, stream);
    return DecodePath::seed;
  }
  const std::uint32_t comp = a.comp_pool ? a.comp_block_count : 0;
  const bool wide = wgmma_rows(a, comp, gpu.multiprocessor_count()) == kWgmmaRows;
  // One latent pool (V = K, no compressed entries) on 64-head blocks: the heads-in-M entries.
  const bool latent =
      wide && fast.wgmma_latent_fp8.id != 0 && latent_applies(a, comp, gpu.max_shared_bytes_per_block());
  const KernelHandle fused = latent ? fast.wgmma_latent_combine_fp8
                             : wide ? fast.wgmma_combine_fp8
                                    : fast.wgmma16_rs_combine_fp8;
  // The cluster entries' o: 8-byte aligned, apart from q (which the step may overwrite in place).
  const bool clusters = fused.id != 0 && a.o.addr % 8 == 0 &&
                        !o_overlaps_q(a.o, a.q, std::uint64_t{a.num_seqs} * a.num_q_heads, a.q_head_dim);
  const SplitPlan p = plan_split_decode(a, KvFormat::fp8, comp, gpu.multiprocessor_count(),
                                        gpu.max_shared_bytes_per_block(), fast.wgmma_fp8.id != 0,
                                        !clusters ? std::span<const std::uint32_t>{}
                                        : latent  ? fast.fused_clusters_latent
                                        : wide    ? fast.fused_clusters64
                                                  : fast.fused_clusters);
  const DevicePtr w = p.fused ? DevicePtr{} : ws.get(gpu, p.workspace_bytes);  // fused: no partials, no workspace
  SplitDecodeFp8Args s{split_from(a, p, w, a.inv_sqrt_d * a.k_scale), a.cache_stride, a.sliding_window, a.comp_pool,
                       a.comp_block_count};
  if (p.fused) {
    const FusedDecodeFp8Args f{s, a.sinks, a.o, a.v_scale};
    if (p.rows_per_block != kWgmmaRows) {
      mla_paged_decode_wgmma16_rs_combine_fp8(gpu, fused, f, stream);
    } else if (latent) {
      mla_paged_decode_wgmma_latent_combine_fp8(gpu, fused, f, stream);
    } else {
      mla_paged_decode_wgmma_combine_fp8(gpu, fused, f, stream);
    }
    return DecodePath::split;
  }
  if (p.wgmma) {
    mla_paged_decode_wgmma_fp8(gpu,
                               p.rows_per_block == kWgmmaRows ? (latent ? fast.wgmma_latent_fp8 : fast.wgmma_fp8)
                               : p.staged                     ? fast.wgmma16_rs_fp8
                                                              : fast.wgmma16_fp8,
                               s, stream);
  } else {
    mla_paged_decode_split_fp8(gpu, p.rows_per_block == kGroupRows ? fast.split16_fp8 : fast.split_fp8, s, stream);
  }
  mla_paged_decode_combine(
      gpu, fast.combine,
      {w, w + p.ml_offset, a.sinks, a.o, a.num_q_heads, a.kv_cache_dim, p.num_splits, a.v_scale, a.num_seqs}, stream);
  return DecodePath::split;
}

DecodePath paged_decode_nvfp4(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast,
                              const PagedDecodeNvfp4Args& a, DecodeWorkspace& ws, Stream stream) {
  validate(a);  // the seed launcher's rules hold for both paths
  if (split_unsupported(a) || !split_fits(gpu.max_shared_bytes_per_block(), a.kv_cache_dim)) {
    mla_paged_decode_nvfp4(gpu, seed.paged_decode_nvfp4, a, stream);
    return DecodePath::seed;
  }
  // One latent pool (V = K) on 64-head blocks: the heads-in-M entry, its combine in clusters where
  // o allows (8-byte aligned, apart from q) and the plan says so.
  const bool latent = wgmma_rows(a, 0, gpu.multiprocessor_count()) == kWgmmaRows && fast.wgmma_latent_nvfp4.id != 0 &&
                      latent_applies(a, 0, gpu.max_shared_bytes_per_block());
  const bool clusters = latent && fast.wgmma_latent_combine_nvfp4.id != 0 && a.o.addr % 8 == 0 &&
                        !o_overlaps_q(a.o, a.q, std::uint64_t{a.num_seqs} * a.num_q_heads, a.q_head_dim);
  const SplitPlan p = plan_split_decode(a, KvFormat::nvfp4, 0, gpu.multiprocessor_count(),
                                        gpu.max_shared_bytes_per_block(), fast.wgmma_nvfp4.id != 0,
                                        clusters ? fast.fused_clusters_latent_nvfp4 : std::span<const std::uint32_t>{});
  const DevicePtr w = p.fused ? DevicePtr{} : ws.get(gpu, p.workspace_bytes);  // fused: no partials, no workspace
  const SplitDecodeNvfp4Args s{split_from(a, p, w, a.inv_sqrt_d), a.block_stride_bytes, a.data_section_bytes};
  if (p.fused) {
    mla_paged_decode_wgmma_latent_combine_nvfp4(gpu, fast.wgmma_latent_combine_nvfp4, {s, {}, a.o}, stream);
    return DecodePath::split;
  }
  if (p.wgmma) {
    mla_paged_decode_wgmma_nvfp4(gpu,
                                 p.rows_per_block == kWgmmaRows ? (latent ? fast.wgmma_latent_nvfp4 : fast.wgmma_nvfp4)
                                 : p.staged                     ? fast.wgmma16_rs_nvfp4
                                                                : fast.wgmma16_nvfp4,
                                 s, stream);
  } else {
    mla_paged_decode_split_nvfp4(gpu, p.rows_per_block == kGroupRows ? fast.split16_nvfp4 : fast.split_nvfp4, s,
                                 stream);
  }
  mla_paged_decode_combine(gpu, fast.combine,
                           {w, w + p.ml_offset, {}, a.o, a.num_q_heads, a.kv_cache_dim, p.num_splits, 1.0f, a.num_seqs},
                           stream);
  return DecodePath::split;
}

bool batched_gemv(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast, const BatchedGemvArgs& a,
                  Stream stream, GemvStart start) {
  const bool wide = a.k % 8 == 0 && a.input_stride % 8 == 0 && a.input.addr % 16 == 0 && a.weight.addr % 16 == 0;
  if (wide) {
    mla_batched_gemv_wide(gpu, fast.gemv_wide, a, stream, start);
  } else {
    mla_batched_gemv(gpu, seed.batched_gemv, a, stream);
  }
  return wide;
}

}  // namespace metrale
