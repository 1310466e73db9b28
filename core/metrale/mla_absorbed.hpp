// Launchers of the DeepSeek-V4-Flash absorbed-MLA decode kernels, module
// `mla_absorbed` (SPEC §3; seed 000 `kv_cache_mla.rs`). Each launcher validates
// its arguments (errors name the bad value; nothing is launched on error),
// builds the `KernelLaunch` in the kernel's declaration order, and launches.
// Buffers are BF16 unless stated; "elements" are of the buffer's dtype.
#pragma once

#include <cstdint>

#include "metrale/backend.hpp"

namespace metrale {

inline constexpr const char* kMlaAbsorbedModule = "mla_absorbed";

/// Handles of every kernel of the module, looked up once.
struct MlaAbsorbedKernels {
  KernelHandle batched_gemv, q_rope_scatter, q_rope_writeback, cache_assemble, paged_decode_nvfp4,
      paged_decode_fp8, rope_pairs_bf16, paged_cache_store_fp8, paged_cache_store_nvfp4;
  /// Errors: `not_found` naming the module and the missing entry.
  static MlaAbsorbedKernels resolve(GpuBackend& gpu);
};

/// `output[h*output_stride + n] = Σ_{j<k} weight[(h*n_out + n)*k + j] * input[h*input_stride + j]`
/// for h < num_heads, n < n_out; FP32 accumulation, BF16 in and out.
struct BatchedGemvArgs {
  DevicePtr input;   // [num_heads, input_stride] bf16 (first k used per head)
  DevicePtr weight;  // [num_heads, n_out, k] bf16
  DevicePtr output;  // [num_heads, output_stride] bf16 (first n_out written per head)
  std::uint32_t n_out = 0, k = 0, num_heads = 0, input_stride = 0, output_stride = 0;
};
/// Grid [⌈n_out/8⌉, num_heads], block 256 (SPEC §3). Errors (`invalid_argument`):
/// `kernel` not mla_batched_gemv; null pointer; n_out, k or num_heads 0; num_heads > 65535;
/// output_stride < n_out (heads would overlap); output's bytes overlapping input's or weight's
/// (blocks would read what others write), the message giving both byte ranges.
void mla_batched_gemv(GpuBackend& gpu, KernelHandle kernel, const BatchedGemvArgs& a, Stream stream = 0);

/// Copy `q_full[h*hd + nope + i]` (i < rope) to `q_absorbed_buf[h*mla_cache_dim + kv_lora + i]`
/// and `q_rope_contiguous[h*rope + i]`, for h < nq.
struct QRopeScatterArgs {
  DevicePtr q_full;             // [nq, hd] bf16
  DevicePtr q_absorbed_buf;     // [nq, mla_cache_dim] bf16
  DevicePtr q_rope_contiguous;  // [nq, rope] bf16
  std::uint32_t nq = 0, hd = 0, nope = 0, rope = 0, kv_lora = 0, mla_cache_dim = 0;
};
/// One block of 256. Errors (`invalid_argument`): null pointer; nq or rope 0;
/// nope + rope > hd; kv_lora + rope > mla_cache_dim.
void mla_q_rope_scatter(GpuBackend& gpu, KernelHandle kernel, const QRopeScatterArgs& a, Stream stream = 0);

/// `q_absorbed_buf[h*mla_cache_dim + kv_lora + i] = q_rope_direct[h*rope + i]`.
struct QRopeWritebackArgs {
  DevicePtr q_rope_direct;   // [nq, rope] bf16
  DevicePtr q_absorbed_buf;  // [nq, mla_cache_dim] bf16
  std::uint32_t nq = 0, rope = 0, kv_lora = 0, mla_cache_dim = 0;
};
/// One block of 256. Errors (`invalid_argument`): null pointer; nq or rope 0;
/// kv_lora + rope > mla_cache_dim.
void mla_q_rope_writeback(GpuBackend& gpu, KernelHandle kernel, const QRopeWritebackArgs& a, Stream stream = 0);

/// One token's cache rows: K = [kv_latent ‖ k_rope ‖ 0…], V = [kv_latent ‖ 0…],
/// each mla_cache_dim wide.
struct CacheAssembleArgs {
  DevicePtr kv_latent;  // [kv_lora] bf16
  DevicePtr k_rope;     // [rope] bf16
  DevicePtr k_cache;    // [mla_cache_dim] bf16 (the K row written)
  DevicePtr v_cache;    // [mla_cache_dim] bf16 (the V row written)
  std::uint32_t kv_lora = 0, rope = 0, mla_cache_dim = 0;
};
/// One block of max(mla_cache_dim, 256) threads. Errors (`invalid_argument`):
/// null pointer; kv_lora 0; kv_lora + rope > mla_cache_dim; mla_cache_dim >
/// 1024 (one thread per element).
void mla_cache_assemble(GpuBackend& gpu, KernelHandle kernel, const CacheAssembleArgs& a, Stream stream = 0);

/// Rotate each contiguous `[rows, rope]` BF16 row in place, pairs (2i, 2i+1):
/// a' = a cos − b sin, b' = b cos + a sin, angle = pos · theta^(−2i/rope), FP32.
struct RopePairsArgs {
  DevicePtr x;  // [rows, rope] bf16, in place
  std::uint32_t rows = 0, rope = 0, pos = 0;
  float theta = 10000.0f;
};
/// Grid [⌈rows·rope/2 / 256⌉], block 256. Errors (`invalid_argument`): null x;
/// rows or rope 0; odd rope; theta not finite or ≤ 0, or so small that an angle overflows FP32;
/// pos past 2^24 (FP32 holds no larger position exactly).
void rope_pairs_bf16(GpuBackend& gpu, KernelHandle kernel, const RopePairsArgs& a, Stream stream = 0);

/// Paged attention (SPEC §3 "Paged attention") shared fields.
struct PagedDecodeCommon {
  DevicePtr q;             // [num_seqs, num_q_heads, q_head_dim] bf16
  DevicePtr k_cache;       // pool, layout per format
  DevicePtr v_cache;       // pool, layout per format
  DevicePtr o;             // [num_seqs, num_q_heads, kv_cache_dim] bf16
  DevicePtr block_tables;  // [num_seqs, max_blocks_per_seq] int32
  DevicePtr seq_lens;      // [num_seqs] int32
  std::uint32_t max_blocks_per_seq = 0, num_q_heads = 0, num_kv_heads = 1, q_head_dim = 0, kv_cache_dim = 0,
                block_size = 0;
  float inv_sqrt_d = 0.0f;  // the model's softmax scale (1/√192 for DeepSeek)
  std::uint32_t num_seqs = 0;
};

/// Largest kv_cache_dim the paged decode kernels support (each of the 256
/// threads owns up to 4 output values).
inline constexpr std::uint32_t kMaxKvCacheDim = 1024;

struct PagedDecodeNvfp4Args : PagedDecodeCommon {
  std::uint64_t block_stride_bytes = 0;  // bytes per physical block
  std::uint64_t data_section_bytes = 0;  // packed E2M1 data, then one E4M3 scale per 16 values
};
/// Grid [num_q_heads, num_seqs], block 256. Errors (`invalid_argument`): a null q, k_cache,
/// v_cache, o, block_tables or seq_lens; num_seqs, num_q_heads, num_kv_heads, q_head_dim,
/// block_size or max_blocks_per_seq 0; num_q_heads > 2^31 − 1; num_q_heads not a multiple of
/// num_kv_heads; q_head_dim > kv_cache_dim; num_seqs > 65535; inv_sqrt_d not finite, or times
/// log2(e) past FP32's range (the wgmma kernels' base-2 logits); row width (num_kv_heads·kv_cache_dim)
/// not a multiple of 16; max_blocks_per_seq·block_size > 2^31 − 1; block_stride_bytes ≥ 2^32;
/// data_section_bytes < block_size·row_width/2; block_stride_bytes < data_section_bytes +
/// block_size·row_width/16; o sharing a byte with q other than as q itself with q_head_dim =
/// kv_cache_dim (a step in place, row for row), or with block_tables, seq_lens or the first row of
/// k_cache or v_cache. `unsupported`: kv_cache_dim > kMaxKvCacheDim. Not checked here (device data,
/// or extents the arguments do not give): o over a pool's other rows, which the caller must keep
/// apart (PagedKvCache's pools are their own allocations); the block tables' entries (one outside
/// the pool faults on the emulator, as an out-of-bounds access); seq_lens, which the kernels clamp
/// to [0, max_blocks_per_seq·block_size] (SPEC §3: a negative length attends no key, o = 0).
void mla_paged_decode_nvfp4(GpuBackend& gpu, KernelHandle kernel, const PagedDecodeNvfp4Args& a, Stream stream = 0);
/// The launcher's rules alone (also the fast path's, which shares the case semantics).
void validate(const PagedDecodeNvfp4Args& a);

struct PagedDecodeFp8Args : PagedDecodeCommon {
  float k_scale = 1.0f, v_scale = 1.0f;  // dequantised = code · scale
  std::uint64_t cache_stride = 0;        // bytes per token row, ≥ num_kv_heads·kv_cache_dim
  std::uint32_t sliding_window = 0;      // 0 = attend to the whole sequence
  DevicePtr sinks;                       // [num_q_heads] f32, may be null; +inf: o = 0, −inf: no term
  DevicePtr comp_pool;                   // [num_seqs, comp_block_count, 2, cache_stride] e4m3, may be null
  std::uint32_t comp_block_count = 0;
};
/// Grid [num_q_heads, num_seqs], block 256. Errors (`invalid_argument`): as for
/// NVFP4, plus k_scale or v_scale not finite or ≤ 0, or 448 (the largest E4M3 code) times it, or
/// inv_sqrt_d × k_scale × log2(e), past FP32's range; cache_stride < row width;
/// block_size x cache_stride ≥ 2^32 (row offsets would wrap); with comp_pool,
/// more than 2^31 − 1 keys or entry offsets past 2^62; o over q, the tables or a pool's first row
/// as for NVFP4, or over sinks or comp_pool's first row. `unsupported`: kv_cache_dim >
/// kMaxKvCacheDim. Unchecked, as for NVFP4: o over a pool's other rows, the tables' entries, and
/// seq_lens (clamped).
void mla_paged_decode_fp8(GpuBackend& gpu, KernelHandle kernel, const PagedDecodeFp8Args& a, Stream stream = 0);
/// The launcher's rules alone (also the fast path's, which shares the case semantics).
void validate(const PagedDecodeFp8Args& a);

/// Store BF16 K/V rows into paged cache slots: token t goes to slot
/// slot_mapping[t] = block·block_size + offset (int32; −1 = skip, as is every negative slot: the
/// kernels test slot < 0). The slots are device data, not checked here: a launch with a slot past
/// the pool faults (on the emulator, `device_fault`) after it may have stored other tokens, as on a
/// GPU; PagedKvCache's reservations hand out only slots of the pool.
struct CacheStoreCommon {
  DevicePtr k_src, v_src;  // [num_tokens, row_width] bf16
  DevicePtr k_cache, v_cache;
  DevicePtr slot_mapping;  // [num_tokens] int32
  std::uint32_t num_tokens = 0, row_width = 0, block_size = 0;
};
struct CacheStoreFp8Args : CacheStoreCommon {
  std::uint64_t cache_stride = 0;  // bytes per row, ≥ row_width
  float k_scale = 1.0f, v_scale = 1.0f;  // stored code = E4M3(x / scale)
};
/// Grid [num_tokens], block 256. Errors (`invalid_argument`): null pointer;
/// num_tokens, row_width or block_size 0; cache_stride < row_width; a scale not
/// finite or ≤ 0; a cache's first row (row_width bytes) over k_src, v_src or slot_mapping, or
/// over the other cache's (a cache's other rows follow slot_mapping, device data: unchecked).
void mla_paged_cache_store_fp8(GpuBackend& gpu, KernelHandle kernel, const CacheStoreFp8Args& a, Stream stream = 0);

struct CacheStoreNvfp4Args : CacheStoreCommon {
  std::uint64_t block_stride_bytes = 0, data_section_bytes = 0;
};
/// Grid [num_tokens], block 256. Errors (`invalid_argument`): null pointer;
/// num_tokens, row_width or block_size 0; row_width not a multiple of 16; the
/// NVFP4 section sizes as for the decode; a cache's first data row (row_width / 2 bytes) over
/// k_src, v_src or slot_mapping, or over the other cache's (its other rows and the scales follow
/// slot_mapping: unchecked).
void mla_paged_cache_store_nvfp4(GpuBackend& gpu, KernelHandle kernel, const CacheStoreNvfp4Args& a,
                                 Stream stream = 0);

}  // namespace metrale
