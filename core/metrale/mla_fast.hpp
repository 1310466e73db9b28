// The fast paths of the DeepSeek decode, module `mla_fast` (issue 6): the head-grouped split-KV
// paged decode (FP8 and NVFP4) with its log-sum-exp combine, and the wide batched GEMV; plus
// dispatchers that take the fast path when it applies and the seed kernel of `mla_absorbed`
// otherwise. Same case semantics as SPEC §3.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"
#include "metrale/dispatch.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/paged_cache.hpp"  // KvFormat

namespace metrale {

inline constexpr const char* kMlaFastModule = "mla_fast";
/// Module of the split decode on warpgroup MMA (sm_90a SASS only: loaded on compute capability 9.0).
inline constexpr const char* kMlaWgmmaModule = "mla_wgmma";

/// Whether `gpu` can run the kernels of `module`: mla_wgmma only on compute capability 9.0 (its
/// SASS is sm_90a's), every other module on every device.
bool module_runs_on(const GpuBackend& gpu, std::string_view module);
/// Why `gpu` cannot run entry `entry` of `module` (a case for it would fail to launch), or
/// nothing when it can: the module is not built for the device (module_runs_on), or a wgmma
/// entry's block needs more shared memory than the device allows (wgmma_shared_bytes against
/// GpuBackend::max_shared_bytes_per_block, e.g. an emulator playing a GB10).
std::optional<std::string> entry_unavailable(const GpuBackend& gpu, std::string_view module, std::string_view entry);

struct MlaFastKernels {
  KernelHandle split_fp8, split_nvfp4, combine, gemv_wide;
  KernelHandle split16_fp8, split16_nvfp4;  // 16-head blocks only: half-tiles held in registers
  KernelHandle wgmma_fp8, wgmma_nvfp4;      // module mla_wgmma; id 0 (absent) unless the device is sm_90
  KernelHandle wgmma16_fp8, wgmma16_nvfp4;  // module mla_wgmma's 16-head blocks; likewise
  KernelHandle wgmma16_rs_fp8, wgmma16_rs_nvfp4;  // its staged 16-head blocks (one warpgroup); likewise
  KernelHandle wgmma16_rs_combine_fp8;      // the same with the combine in its clusters; likewise
  KernelHandle wgmma_combine_fp8;           // the 64-head FP8 blocks with the combine in their clusters; likewise
  KernelHandle wgmma_latent_fp8;            // the 64-head FP8 block over one latent pool, heads in M; likewise
  KernelHandle wgmma_latent_combine_fp8;    // the same with the combine in its clusters; likewise
  KernelHandle wgmma_latent_nvfp4;          // the 64-head NVFP4 block over one latent pool, heads in M; likewise
  KernelHandle wgmma_latent_combine_nvfp4;  // the same with the combine in its clusters; likewise
  /// Clusters of n of wgmma16_rs_combine_fp8's blocks (fused_clusters), of wgmma_combine_fp8's
  /// (fused_clusters64), of wgmma_latent_combine_fp8's (fused_clusters_latent) and of
  /// wgmma_latent_combine_nvfp4's (fused_clusters_latent_nvfp4) the device runs at once
  /// (GpuBackend::max_active_clusters), n = 1..8; all 0 without the entry.
  std::array<std::uint32_t, 9> fused_clusters{}, fused_clusters64{}, fused_clusters_latent{},
      fused_clusters_latent_nvfp4{};
  /// Errors: `not_found` naming the module and the missing entry.
  static MlaFastKernels resolve(GpuBackend& gpu);
};

/// How a split decode divides its work: G = 16·R heads per block over `head_groups` groups,
/// `num_splits` chunks of `keys_per_split` keys per sequence, `threads` = 128·R per block;
/// `staged` when the block has room to stream the next tile's cache bytes into shared memory
/// (cp.async) under the current tile's math. 16-head split blocks are never staged: they run on
/// the 16-head entries, which hold the next half-tile in registers instead; on the wgmma path,
/// 16-head blocks are staged (mla_paged_decode_wgmma16_rs_{fp8,nvfp4}, two blocks per SM, their
/// raw half-tiles bulk-copied) where each of the SMs' block slots has at least 6 tiles to walk
/// (not NVFP4 over one latent pool, v_cache = k_cache: the warp-specialised entry converts each
/// of its tiles once), else they run on the warp-specialised wgmma16 entries (producers'
/// registers the staging).
struct SplitPlan {
  std::uint32_t rows_per_block = 0, head_groups = 0, num_splits = 0, keys_per_split = 0, threads = 0;
  bool staged = false;
  bool wgmma = false;  // the mla_wgmma entries: 64 (16) heads and 64-key tiles per block, 256 (384; 128 staged) threads
  /// wgmma blocks (16-head staged or 64-head) in n ≤ 8 splits that combine in clusters of n
  /// (mla_paged_decode_wgmma16_rs_combine_fp8, mla_paged_decode_wgmma_combine_fp8,
  /// mla_paged_decode_wgmma_latent_combine_fp8, mla_paged_decode_wgmma_latent_combine_nvfp4): no
  /// workspace, no combine launch.
  bool fused = false;
  std::uint32_t shared_bytes = 0;
  std::uint64_t workspace_bytes = 0;  // o_partial then ml_partial
  std::uint64_t ml_offset = 0;        // byte offset of ml_partial in the workspace
};

/// Plan a split decode of format `format` for `a` (its table capacity bounds the keys:
/// max_blocks_per_seq · block_size + comp_block_count) on a device of `multiprocessors` SMs whose
/// blocks may have `max_shared_bytes` of shared memory: with `wgmma` (the device has the
/// mla_wgmma entries) and wgmma_applies, wgmma_rows-head blocks on them; else the largest head
/// group (up to 64) that fits, staged when that fits too without costing a block per SM; as many
/// splits (of at least four tiles: 32 keys, or 64 on wgmma; one on the 16-head wgmma blocks)
/// as give the least work to the busiest of the device's block slots
/// (multiprocessors × blocks per SM): ⌈blocks / slots⌉ rounds of ⌈tiles / splits⌉ tiles and a
/// tile's worth of fixed cost per block. 16-head wgmma blocks are staged (see SplitPlan) from
/// num_seqs × head groups × ⌈keys / 64⌉ ≥ 6 × 2·multiprocessors, when two fit in
/// max_shared_bytes. Staged 16-head and 64-head wgmma blocks are `fused` when `fused_clusters`
/// (index n: the clusters of n blocks of the block's cluster entry the device runs at once,
/// MlaFastKernels::fused_clusters, fused_clusters64, fused_clusters_latent or
/// fused_clusters_latent_nvfp4 — the caller passes the one of the entry it will launch; empty:
/// none) gives some n ≤ 8 splits whose rounds of clusters cost no more than the best unfused plan
/// and its combine launch (two tiles' worth); the n that costs least is taken, and the plan has
/// no workspace. Errors: `invalid_argument` for a fused_clusters of other than 9 entries (or none);
/// `unsupported` when not even a 16-head group fits in `max_shared_bytes`.
SplitPlan plan_split_decode(const PagedDecodeCommon& a, KvFormat format, std::uint32_t comp_block_count,
                            std::uint32_t multiprocessors, std::uint32_t max_shared_bytes, bool wgmma = false,
                            std::span<const std::uint32_t> fused_clusters = {});

/// The heads per block of the wgmma entries for `a` on a device of `multiprocessors` SMs (0 counts
/// as one): DeepSeek's rows (q_head_dim = kv_cache_dim = 576) with 16 or fewer query heads take
/// the 16-head entries (mla_paged_decode_wgmma16_*); with more than 32 the 64-head entries
/// (mla_paged_decode_wgmma_*), except a small step — num_seqs × ⌈num_q_heads / 16⌉ × ⌈keys / 64⌉
/// at most 4 × multiprocessors, keys the table's capacity (max_blocks_per_seq · block_size) plus
/// `comp_block_count` — which the 16-head entries finish sooner (their blocks reach their first
/// tile sooner; measured on the H200, docs/performance.md). 0 otherwise (17-32 heads stay on the
/// 32-head mma.sync blocks: a 64-row block would mostly multiply zeros, two 16-head blocks read
/// the cache twice).
std::uint32_t wgmma_rows(const PagedDecodeCommon& a, std::uint32_t comp_block_count, std::uint32_t multiprocessors);

/// Whether the wgmma entries serve `a`: wgmma_rows (of `comp_block_count` and `multiprocessors`)
/// is not 0 and that block's wgmma_shared_bytes (for `format`) is within `max_shared_bytes`, or,
/// for FP8 on 64-head blocks, the heads-in-M block serves it (latent_applies).
bool wgmma_applies(const PagedDecodeCommon& a, KvFormat format, std::uint32_t max_shared_bytes,
                   std::uint32_t comp_block_count, std::uint32_t multiprocessors);

/// Why the split path cannot take these arguments (one KV head; q_head_dim a multiple of 32;
/// kv_cache_dim a multiple of 64, at most 576; 16-byte aligned rows), or nothing when it can.
std::optional<std::string> split_unsupported(const PagedDecodeFp8Args& a);
std::optional<std::string> split_unsupported(const PagedDecodeNvfp4Args& a);

/// The raw kernels' arguments.
struct SplitDecodeArgs {
  DevicePtr q, k_cache, v_cache, o_partial, ml_partial, block_tables, seq_lens;
  std::uint32_t max_blocks_per_seq = 0, num_q_heads = 0, q_head_dim = 0, kv_cache_dim = 0, block_size = 0;
  float logit_scale = 0;  // inv_sqrt_d · k_scale
  std::uint32_t keys_per_split = 0, num_seqs = 0, num_splits = 0, rows_per_block = 0;
  bool staged = true;  // give the block room for a raw tile (not a kernel argument: shared memory)
};
struct SplitDecodeFp8Args : SplitDecodeArgs {
  std::uint64_t cache_stride = 0;
  std::uint32_t sliding_window = 0;
  DevicePtr comp_pool;
  std::uint32_t comp_block_count = 0;
};
struct SplitDecodeNvfp4Args : SplitDecodeArgs {
  std::uint64_t block_stride_bytes = 0, data_section_bytes = 0;
};
/// Grid [num_splits, ⌈num_q_heads/rows_per_block⌉, num_seqs], block 8·rows_per_block, the
/// shared memory split_shared_bytes(rows_per_block, kv_cache_dim, raw pitch or 0 when not
/// staged). `kernel` is the module's split entry of the format, or its 16-head entry
/// (mla_paged_decode_split16_*) when rows_per_block is 16 and `staged` is false — any other
/// block size is refused by the backend's launch. Staged or not, on either entry, the results
/// are bit-identical. Launched early (programmatic dependent launch on sm_90 and later): the
/// kernel waits for the kernel ahead of it on the stream before it touches memory. It does not
/// let the combine start before it ends: blocks started early crowd onto the few SMs with room
/// left (measured: 1.5× slower at one sequence of 16K keys). Errors (`invalid_argument`):
/// a null pointer (comp_pool may be null); a zero count; rows_per_block not 16, 32, 48 or 64;
/// keys_per_split not a multiple of 32; logit_scale not finite, or times log2(e) past FP32's
/// range (the wgmma kernels' base-2 logits); num_splits × keys_per_split short of the table's
/// capacity (max_blocks_per_seq × block_size, + comp_block_count with a comp_pool), or that
/// capacity past 2^31 − 1; num_splits past 2^31 − 1 (the grid's x); more than 65535 head groups;
/// the split path's dimension and alignment rules (q, the pools and their pitches 16-byte
/// aligned); FP8: cache_stride below kv_cache_dim or
/// with row offsets past 2^32 (block_size × cache_stride) or compressed offsets past 2^62; NVFP4:
/// block_stride_bytes from 2^32 or sections too small for block_size rows; `kernel` not the
/// format's split or 16-head entry; block_tables, seq_lens, o_partial or ml_partial not 4-byte
/// aligned; last, o_partial or ml_partial overlapping q, block_tables,
/// seq_lens, each other, or a pool's (or comp_pool's) first row (a pool's extent follows its
/// table; every block writes its partial while others read these).
void mla_paged_decode_split_fp8(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeFp8Args& a, Stream stream = 0);
void mla_paged_decode_split_nvfp4(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeNvfp4Args& a,
                                  Stream stream = 0);
/// mla_paged_decode_wgmma_{fp8,nvfp4}, mla_paged_decode_wgmma16_{fp8,nvfp4} and
/// mla_paged_decode_wgmma16_rs_{fp8,nvfp4} (module mla_wgmma, sm_90a): the split decode on
/// warpgroup MMA, 64 heads per block (two warpgroups on register operands, transposed), or 16
/// transposed (keys and output dims in M): warp-specialised on the
/// wgmma16 entries (a consumer warpgroup multiplies, two producer warpgroups dequantise), or with
/// `staged` on the wgmma16_rs entries, one warpgroup that dequantises bulk-copied raw rows (NVFP4:
/// and their scales) into its own register operands, two blocks per SM (`staged` is ignored at 64
/// heads, whose block always stages). Same arguments, partial outputs and combine as the split entries; grid
/// [num_splits, ⌈num_q_heads/rows_per_block⌉, num_seqs], block wgmma_threads(rows_per_block,
/// staged), wgmma_shared_bytes(format, rows_per_block, staged) of shared memory; launched early
/// as they are. mla_paged_decode_wgmma_latent_fp8 and mla_paged_decode_wgmma_latent_nvfp4
/// (`kernel` MlaFastKernels::wgmma_latent_fp8 or wgmma_latent_nvfp4, rows_per_block 64, block
/// 256, wgmma_latent_shared_bytes) serve one latent pool as both caches (v_cache = k_cache, V = K
/// row for row, no compressed entries) with FlashMLA's shape: the heads in the wgmma's M, each
/// tile converted once to FP16 for both products (docs/performance.md).
/// Errors (`invalid_argument`): those of the split launchers, plus rows_per_block not
/// 64 or 16, keys_per_split not a multiple of 64, q_head_dim or kv_cache_dim not 576, o_partial
/// not 8-byte aligned, `kernel` not the entry for the format, rows_per_block and `staged`; for the
/// latent entry, v_cache other than k_cache or compressed entries (comp_pool with
/// comp_block_count > 0).
void mla_paged_decode_wgmma_fp8(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeFp8Args& a, Stream stream = 0);
void mla_paged_decode_wgmma_nvfp4(GpuBackend& gpu, KernelHandle kernel, const SplitDecodeNvfp4Args& a,
                                  Stream stream = 0);
/// Bytes of dynamic shared memory a wgmma block of `rows_per_block` heads (64 or 16) needs
/// (576-dim rows), with 1 KiB to align the swizzled tiles to 1024 bytes. 64 heads (register
/// operands, a warpgroup per 32 heads): Q and Pᵀ as FP16, two slots of the raw K and V tiles (FP8
/// 36 KiB each; NVFP4 18 KiB of data and 2.25 KiB of scales each), the per-warp maxima and votes,
/// the slots' mbarriers: 226.3 KiB (FP8), 163.3 KiB (NVFP4). 16 heads: Q
/// (18 KiB), a K and a V tile (72 KiB each) and P as FP16, the consumer's per-warp maxima:
/// 165.3 KiB for either format (the producers hold the raw bytes in registers); `staged`: Q and
/// P, the raw K and V half-tiles (FP8 36 KiB each; NVFP4 18 KiB of data and 2.25 KiB of scales
/// each), the maxima and two mbarriers: 94.3 KiB (FP8), 61.8 KiB (NVFP4).
std::uint32_t wgmma_shared_bytes(KvFormat format, std::uint32_t rows_per_block = 64, bool staged = false);
/// Bytes of dynamic shared memory of the heads-in-M block (mla_paged_decode_wgmma_latent_*, either
/// format: its tiles are FP16): 1 KiB of alignment, Q and two tiles (this one and the next) as
/// FP16, 72 KiB each, P as FP16, the Q rows' unscale factors, two tiles' rescale factors and their
/// four mbarriers: 225.8 KiB.
std::uint32_t wgmma_latent_shared_bytes();

/// Whether paged_decode_fp8 and paged_decode_nvfp4 take the heads-in-M block
/// (mla_paged_decode_wgmma_latent_{fp8,nvfp4}) for a step they run on 64-head wgmma blocks: one
/// latent pool (`v_cache == k_cache`, not null), no compressed entries (`comp_block_count` 0), a table of
/// at least 4096 keys (max_blocks_per_seq × block_size; below, FP8's fused register-operand
/// block is faster; NVFP4 takes the same rule, not measured below 4K keys) and
/// wgmma_latent_shared_bytes within `max_shared_bytes`. Source: docs/performance.md ("Twenty-third
/// session").
bool latent_applies(const PagedDecodeCommon& a, std::uint32_t comp_block_count, std::uint32_t max_shared_bytes);
/// Threads of a wgmma block of `rows_per_block` heads: 256 for 64, 384 for 16, 128 for 16 staged.
std::uint32_t wgmma_threads(std::uint32_t rows_per_block, bool staged = false);
/// The block of module mla_wgmma's entry `entry`, from its name: `rows` heads (16 for the
/// mla_paged_decode_wgmma16_* entries, else 64), `threads` (wgmma_threads; staged: the
/// mla_paged_decode_wgmma16_rs_* entries) and `shared_bytes` of dynamic shared memory
/// (wgmma_latent_shared_bytes for the heads-in-M entries, mla_paged_decode_wgmma_latent_*, else
/// wgmma_shared_bytes of the entry's format, rows and staging). The one table the launchers,
/// entry_unavailable, the cluster occupancy and the case files read. Source: kernels/mla_wgmma.cu
/// (each entry's shared-memory carve-up).
struct WgmmaBlock {
  std::uint32_t rows, threads, shared_bytes;
};
WgmmaBlock wgmma_block(std::string_view entry);

/// The split kernels' block shapes (kernels/mla_fast.cu): rows_per_block 16, 32, 48 or 64 heads;
/// kv_cache_dim a multiple of 64 up to 576. The rule the value breaks, or none; the launchers
/// refuse such a value with it (`invalid_argument`), and `case_unavailable` leaves it to them.
std::optional<std::string> split_rows_problem(std::uint32_t rows_per_block);
std::optional<std::string> split_dim_problem(std::uint32_t kv_cache_dim);
/// Bytes of one key's cache bytes in a staged tile (FP8: K and V rows; NVFP4: their data and
/// scales, padded to 16).
std::uint32_t split_raw_pitch(KvFormat format, std::uint32_t kv_cache_dim);
/// Bytes of dynamic shared memory a split block needs; `raw_pitch` 0 for an unstaged block.
std::uint32_t split_shared_bytes(std::uint32_t rows_per_block, std::uint32_t kv_cache_dim, std::uint32_t raw_pitch);
/// Bytes of dynamic shared memory the smallest split block needs: a direct 16-head block of
/// `kv_cache_dim` rows.
std::uint32_t split_least_shared_bytes(std::uint32_t kv_cache_dim);
/// Whether that block fits `max_shared_bytes` of shared memory a block: the paged dispatchers take
/// the seed kernel when not.
bool split_fits(std::uint32_t max_shared_bytes, std::uint32_t kv_cache_dim);

/// mla_paged_decode_wgmma16_rs_combine_fp8 (module mla_wgmma, sm_90a): mla_paged_decode_wgmma16_rs_fp8
/// and mla_paged_decode_combine in one kernel. The num_splits blocks of each (sequence, head group)
/// run as one thread-block cluster [num_splits, 1, 1] that keeps its chunks' partials in shared
/// memory and combines them there, each block a run of the dims: no workspace and no second
/// launch, and o bit-identical to the two kernels'. `split` as for mla_paged_decode_wgmma_fp8's
/// staged 16-head blocks (`staged` is taken as set; o_partial and ml_partial are not used and may
/// be null); `sinks` [num_q_heads] f32 or null; `o` [num_seqs, num_q_heads, 576] bf16; v_scale as
/// the combine's. Grid [num_splits, ⌈num_q_heads/16⌉, num_seqs], block 128, two per SM;
/// launched early. Errors (`invalid_argument`): those of mla_paged_decode_wgmma_fp8 but for
/// o_partial and ml_partial; rows_per_block not 16; num_splits above 8; `o` null, not 8-byte
/// aligned or overlapping q (a cluster's blocks read q while others write o; the dispatcher
/// takes the two kernels for a step in place), or overlapping sinks, the tables or a pool's first
/// row (as the partials may not); v_scale not finite or ≤ 0, or 448 times it past FP32;
/// `kernel` not this entry. Source: SPEC §3 (the decode), docs/performance.md (the cluster combine).
///
/// mla_paged_decode_wgmma_combine_fp8: the same for mla_paged_decode_wgmma_fp8's 64-head blocks
/// (rows_per_block 64, grid [num_splits, ⌈num_q_heads/64⌉, num_seqs], block 256, one per SM),
/// with the same errors but rows_per_block not 64.
///
/// mla_paged_decode_wgmma_latent_combine_fp8: the same for mla_paged_decode_wgmma_latent_fp8's
/// heads-in-M blocks (one latent pool; wgmma_latent_shared_bytes, the partial rows kept in its two
/// FP16 tiles' bytes), with the errors of the 64-head entry and the latent entry's: v_cache other
/// than k_cache, or compressed entries. Source: docs/performance.md ("Twenty-fifth session").
struct FusedDecodeFp8Args {
  SplitDecodeFp8Args split;
  DevicePtr sinks, o;  // sinks may be null
  float v_scale = 1.0f;
};
void mla_paged_decode_wgmma16_rs_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                             Stream stream = 0);
void mla_paged_decode_wgmma_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                        Stream stream = 0);
void mla_paged_decode_wgmma_latent_combine_fp8(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeFp8Args& a,
                                               Stream stream = 0);
/// mla_paged_decode_wgmma_latent_combine_nvfp4: mla_paged_decode_wgmma_latent_combine_fp8's
/// clusters for mla_paged_decode_wgmma_latent_nvfp4's heads-in-M blocks (V unscaled: v_scale 1),
/// with the errors of mla_paged_decode_wgmma_nvfp4 but for o_partial and ml_partial, and those of
/// the FP8 cluster entries on rows_per_block, num_splits, `o`, `sinks` and the latent pool.
/// Source: docs/performance.md ("Thirty-second session").
struct FusedDecodeNvfp4Args {
  SplitDecodeNvfp4Args split;
  DevicePtr sinks, o;  // sinks may be null
};
void mla_paged_decode_wgmma_latent_combine_nvfp4(GpuBackend& gpu, KernelHandle kernel, const FusedDecodeNvfp4Args& a,
                                                 Stream stream = 0);

struct CombineArgs {
  DevicePtr o_partial, ml_partial, sinks, o;  // sinks may be null
  std::uint32_t num_q_heads = 0, kv_cache_dim = 0, num_splits = 0;
  float v_scale = 1.0f;
  std::uint32_t num_seqs = 0;
};
/// Grid [num_q_heads, num_seqs, combine_dim_blocks(a, SMs)], block 256; launched early, it waits
/// for the split kernel ahead of it before it reads the partials, and lets the kernel behind it
/// start. Errors (`invalid_argument`): a null pointer other than
/// sinks; a zero count; v_scale not finite or ≤ 0, or 448 (the largest E4M3 code) times it past
/// FP32.
void mla_paged_decode_combine(GpuBackend& gpu, KernelHandle kernel, const CombineArgs& a, Stream stream = 0);
/// Blocks per (sequence, head) of the combine, each taking a run of the 64-dim tiles: enough for
/// eight 256-thread blocks per SM (at one sequence of 16 heads on 132 SMs, 9 for 576 dims), at
/// most one per tile, at least one (also for zero counts, which the launcher refuses). The result
/// does not depend on it.
std::uint32_t combine_dim_blocks(const CombineArgs& a, std::uint32_t multiprocessors);

/// When the wide GEMV may start: after the kernel ahead of it on the stream (`after`), or while
/// that kernel finishes (`early`, programmatic dependent launch on sm_90 and later: the GEMV
/// streams its first weights in before it waits for that kernel, so no kernel that may still
/// run then may write `weight` — the one ahead, and those before it that were started early
/// too, such as the combine; it reads `input` and writes `output` only after the wait).
enum class GemvStart { after, early };

/// Grid [⌈n_out/gemv_wide_rows_per_block(k)⌉, num_heads], block 256. Errors
/// (`invalid_argument`): those of mla_batched_gemv but its kernel rule; `kernel` not
/// mla_batched_gemv_wide; k or input_stride not a multiple of 8, and input or weight not 16-byte
/// aligned (16-byte loads).
void mla_batched_gemv_wide(GpuBackend& gpu, KernelHandle kernel, const BatchedGemvArgs& a, Stream stream = 0,
                           GemvStart start = GemvStart::after);
/// Output rows per block of the wide GEMV: 16·(32/S), a row summed by S lanes, S the largest
/// power of two ≤ min(32, k/16), at least 1 (k = 128: 64 rows; k ≥ 512: 16).
std::uint32_t gemv_wide_rows_per_block(std::uint32_t k);

/// Paged decode: the split path (split + combine, its workspace from `ws`) when
/// split_unsupported is empty and a 16-head split block fits the device's shared memory — on the
/// wgmma entries where `fast` has them and wgmma_applies — else the seed kernel. One latent pool
/// may be passed as both caches (v_cache == k_cache: V = K row for row, FlashMLA's layout; o's
/// dims past the latent are then P·K_rope): the FP8 staged 16-head blocks copy each key's row
/// once (without compressed entries); FP8 steps on 64-head blocks without compressed entries whose
/// table holds at least 4096 keys (max_blocks_per_seq · block_size) run on
/// mla_paged_decode_wgmma_latent_fp8 (heads in M, each tile converted once for both products),
/// or mla_paged_decode_wgmma_latent_combine_fp8 where the plan fuses the combine into its
/// clusters, and NVFP4 steps of the same kind on mla_paged_decode_wgmma_latent_nvfp4 (or
/// mla_paged_decode_wgmma_latent_combine_nvfp4); every other kernel reads the row twice. The
/// wgmma steps combine in their clusters (one launch) where the plan says so (SplitPlan::fused)
/// and o is 8-byte aligned and apart from q; otherwise the split kernel and the combine run.
/// Source: SPEC §3, docs/performance.md. Errors: the launchers'.
DecodePath paged_decode_fp8(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast,
                            const PagedDecodeFp8Args& a, DecodeWorkspace& ws, Stream stream = 0);
DecodePath paged_decode_nvfp4(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast,
                              const PagedDecodeNvfp4Args& a, DecodeWorkspace& ws, Stream stream = 0);
/// Batched GEMV: the wide kernel when k and input_stride are multiples of 8 and the pointers
/// 16-byte aligned (started as `start` says), else the seed kernel. Returns whether the wide
/// kernel ran.
bool batched_gemv(GpuBackend& gpu, const MlaAbsorbedKernels& seed, const MlaFastKernels& fast, const BatchedGemvArgs& a,
                  Stream stream = 0, GemvStart start = GemvStart::after);

}  // namespace metrale
