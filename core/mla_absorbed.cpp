// Launchers of module `mla_absorbed` (SPEC §3): validate, build, launch.
#include "metrale/mla_absorbed.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "metrale/formats.hpp"
#include "metrale/launch.hpp"
#include "validate.hpp"

namespace metrale {

using detail::kMaxKeys;
using detail::validate_block_offsets;
using detail::validate_comp_offsets;
using detail::validate_row_offsets;
using detail::Validator;

namespace {

constexpr Dim3 kBlock256{256, 1, 1};

void validate_paged_decode(const Validator& v, const PagedDecodeCommon& a) {
  v.non_null({{"q", a.q},
              {"k_cache", a.k_cache},
              {"v_cache", a.v_cache},
              {"o", a.o},
              {"block_tables", a.block_tables},
              {"seq_lens", a.seq_lens}});
  v.positive({{"num_seqs", a.num_seqs},
              {"num_q_heads", a.num_q_heads},
              {"num_kv_heads", a.num_kv_heads},
              {"q_head_dim", a.q_head_dim},
              {"block_size", a.block_size},
              {"max_blocks_per_seq", a.max_blocks_per_seq}});
  v.at_most("num_seqs", a.num_seqs, detail::kMaxGridYZ);
  v.at_most("num_q_heads", a.num_q_heads, detail::kMaxGridX);
  v.check(a.num_q_heads % a.num_kv_heads == 0, "num_q_heads {} is not a multiple of num_kv_heads {}", a.num_q_heads,
          a.num_kv_heads);
  v.check(a.q_head_dim <= a.kv_cache_dim, "q_head_dim {} > kv_cache_dim {}", a.q_head_dim, a.kv_cache_dim);
  if (a.kv_cache_dim > kMaxKvCacheDim)
    fail(Errc::unsupported, "{}: kv_cache_dim {} exceeds the kernel's limit {}", v.kernel, a.kv_cache_dim,
         kMaxKvCacheDim);
  v.logit_scale("inv_sqrt_d", a.inv_sqrt_d);
  // Key indices are 32-bit in the kernels: the table's capacity must leave room for them.
  v.check(std::uint64_t{a.max_blocks_per_seq} * a.block_size <= kMaxKeys,
          "max_blocks_per_seq {} x block_size {} keys exceed {}", a.max_blocks_per_seq, a.block_size, kMaxKeys);
}

// A decode launcher's last rules: o apart from what the launch reads that the launcher can size —
// each pool's and comp_pool's first row (`pool_row` bytes), the tables and `more` (FP8: sinks) —
// and from q, unless o is q itself, row for row (a step in place: a seed block reads its q row
// before it writes that row of o, and the split path reads all of q before its combine writes o).
void validate_o_apart(const Validator& v, const PagedDecodeCommon& a, std::uint64_t pool_row, DevicePtr comp_pool = {},
                      std::initializer_list<Validator::Extent> more = {}) {
  using detail::saturating_product;
  const std::uint64_t rows = std::uint64_t{a.num_seqs} * a.num_q_heads;
  const Validator::Extent o{"o", a.o, saturating_product({rows, a.kv_cache_dim, 2})};
  detail::validate_apart_from_pools_and_tables(v, o, a, pool_row, comp_pool);
  v.disjoint(o, more);
  if (a.o.addr == a.q.addr && a.q_head_dim == a.kv_cache_dim) return;
  v.disjoint(o, {{"q", a.q, saturating_product({rows, a.q_head_dim, 2})}});
}

// NVFP4 block layout: [block_size rows of row_width/2 bytes][block_size rows of row_width/16 scales].
void validate_nvfp4_layout(const Validator& v, std::uint64_t row_width, std::uint32_t block_size,
                           std::uint64_t block_stride_bytes, std::uint64_t data_section_bytes) {
  validate_block_offsets(v, block_stride_bytes);
  // Compared by division (block_size > 0, row_width % 16 == 0 make it exact) so that neither
  // block_size x row width nor data_section_bytes + scales can wrap around 2^64.
  v.check(row_width % 16 == 0, "row width {} is not a multiple of 16", row_width);
  v.check(data_section_bytes / block_size >= row_width / 2, "data_section_bytes {} < block_size {} x row width {} / 2",
          data_section_bytes, block_size, row_width);
  v.check(block_stride_bytes >= data_section_bytes &&
              (block_stride_bytes - data_section_bytes) / block_size >= row_width / 16,
          "block_stride_bytes {} < data_section_bytes {} + block_size {} x row width {} / 16", block_stride_bytes,
          data_section_bytes, block_size, row_width);
}

KernelLaunch& paged_decode_args(KernelLaunch& l, const PagedDecodeCommon& a) {
  return l.grid({a.num_q_heads, a.num_seqs, 1})
      .block(kBlock256)
      .arg_ptr(a.q)
      .arg_ptr(a.k_cache)
      .arg_ptr(a.v_cache)
      .arg_ptr(a.o)
      .arg_ptr(a.block_tables)
      .arg_ptr(a.seq_lens)
      .arg_u32(a.max_blocks_per_seq)
      .arg_u32(a.num_q_heads)
      .arg_u32(a.num_kv_heads)
      .arg_u32(a.q_head_dim)
      .arg_u32(a.kv_cache_dim)
      .arg_u32(a.block_size)
      .arg_f32(a.inv_sqrt_d);
}

// `pool_row`: the bytes of a cache's first row (its extent follows slot_mapping, device data).
void validate_cache_store(const Validator& v, const CacheStoreCommon& a, std::uint64_t pool_row) {
  using detail::saturating_product;
  v.non_null({{"k_src", a.k_src},
              {"v_src", a.v_src},
              {"k_cache", a.k_cache},
              {"v_cache", a.v_cache},
              {"slot_mapping", a.slot_mapping}});
  v.positive({{"num_tokens", a.num_tokens}, {"row_width", a.row_width}, {"block_size", a.block_size}});
  v.at_most("num_tokens", a.num_tokens, 0x7FFF'FFFF);
  // One latent pool as both caches: a token's V row would overwrite its K row.
  v.check(a.k_cache != a.v_cache || a.k_src == a.v_src,
          "k_cache and v_cache are one pool {:#x} (latent), but k_src {:#x} and v_src {:#x} differ: V's rows would "
          "overwrite K's",
          a.k_cache.addr, a.k_src.addr, a.v_src.addr);
  // Every token's block writes its rows while the others read the sources and slot_mapping.
  const std::uint64_t src = saturating_product({a.num_tokens, a.row_width, 2});
  const std::initializer_list<Validator::Extent> ins{{"k_src", a.k_src, src},
                                                     {"v_src", a.v_src, src},
                                                     {"slot_mapping", a.slot_mapping, std::uint64_t{a.num_tokens} * 4}};
  v.disjoint({"k_cache", a.k_cache, pool_row}, ins);
  v.disjoint({"v_cache", a.v_cache, pool_row}, ins);
  if (a.k_cache != a.v_cache) v.disjoint({"v_cache", a.v_cache, pool_row}, {{"k_cache", a.k_cache, pool_row}});
}

}  // namespace

MlaAbsorbedKernels MlaAbsorbedKernels::resolve(GpuBackend& gpu) {
  auto k = [&](const char* entry) { return gpu.kernel(kMlaAbsorbedModule, entry); };
  return {k("mla_batched_gemv"),   k("mla_q_rope_scatter"),        k("mla_q_rope_writeback"),
          k("mla_cache_assemble"), k("mla_paged_decode_nvfp4"),    k("mla_paged_decode_fp8"),
          k("rope_pairs_bf16"),    k("mla_paged_cache_store_fp8"), k("mla_paged_cache_store_nvfp4")};
}

void detail::validate_gemv(const Validator& v, const BatchedGemvArgs& a) {
  v.non_null({{"input", a.input}, {"weight", a.weight}, {"output", a.output}});
  v.positive({{"n_out", a.n_out}, {"k", a.k}, {"num_heads", a.num_heads}});
  v.at_most("num_heads", a.num_heads, detail::kMaxGridYZ);
  v.check(a.output_stride >= a.n_out, "output_stride {} < n_out {} (heads would overlap)", a.output_stride, a.n_out);
}

void detail::validate_gemv_buffers(const Validator& v, const BatchedGemvArgs& a) {
  v.disjoint({"output", a.output, detail::strided_bytes(a.num_heads, a.output_stride, a.n_out, 2)},
             {{"input", a.input, detail::strided_bytes(a.num_heads, a.input_stride, a.k, 2)},
              {"weight", a.weight, detail::saturating_product({a.num_heads, a.n_out, a.k, 2})}});
}

void mla_batched_gemv(GpuBackend& gpu, KernelHandle kernel, const BatchedGemvArgs& a, Stream stream) {
  const Validator v{"mla_batched_gemv"};
  detail::validate_entry(v, gpu, kernel, {"mla_batched_gemv"});  // the wide GEMV has the same parameters
  detail::validate_gemv(v, a);
  detail::validate_gemv_buffers(v, a);
  KernelLaunch(gpu, kernel)
      .grid({div_ceil(a.n_out, 8u), a.num_heads, 1})  // 8 warps, one output row each
      .block(kBlock256)
      .arg_ptr(a.input)
      .arg_ptr(a.weight)
      .arg_ptr(a.output)
      .arg_u32(a.n_out)
      .arg_u32(a.k)
      .arg_u32(a.input_stride)
      .arg_u32(a.output_stride)
      .launch(stream);
}

void mla_q_rope_scatter(GpuBackend& gpu, KernelHandle kernel, const QRopeScatterArgs& a, Stream stream) {
  const Validator v{"mla_q_rope_scatter"};
  v.non_null({{"q_full", a.q_full}, {"q_absorbed_buf", a.q_absorbed_buf}, {"q_rope_contiguous", a.q_rope_contiguous}});
  v.positive({{"nq", a.nq}, {"rope", a.rope}});
  v.check(std::uint64_t{a.nope} + a.rope <= a.hd, "nope {} + rope {} > hd {}", a.nope, a.rope, a.hd);
  v.check(std::uint64_t{a.kv_lora} + a.rope <= a.mla_cache_dim, "kv_lora {} + rope {} > mla_cache_dim {}", a.kv_lora,
          a.rope, a.mla_cache_dim);
  const Validator::Extent q_full{"q_full", a.q_full, std::uint64_t{a.nq} * a.hd * 2},
      q_absorbed{"q_absorbed_buf", a.q_absorbed_buf, std::uint64_t{a.nq} * a.mla_cache_dim * 2};
  v.disjoint(q_absorbed, {q_full});
  v.disjoint({"q_rope_contiguous", a.q_rope_contiguous, std::uint64_t{a.nq} * a.rope * 2}, {q_full, q_absorbed});
  KernelLaunch(gpu, kernel)
      .grid({1, 1, 1})
      .block(kBlock256)
      .arg_ptr(a.q_full)
      .arg_ptr(a.q_absorbed_buf)
      .arg_ptr(a.q_rope_contiguous)
      .arg_u32(a.nq)
      .arg_u32(a.hd)
      .arg_u32(a.nope)
      .arg_u32(a.rope)
      .arg_u32(a.kv_lora)
      .arg_u32(a.mla_cache_dim)
      .launch(stream);
}

void mla_q_rope_writeback(GpuBackend& gpu, KernelHandle kernel, const QRopeWritebackArgs& a, Stream stream) {
  const Validator v{"mla_q_rope_writeback"};
  v.non_null({{"q_rope_direct", a.q_rope_direct}, {"q_absorbed_buf", a.q_absorbed_buf}});
  v.positive({{"nq", a.nq}, {"rope", a.rope}});
  v.check(std::uint64_t{a.kv_lora} + a.rope <= a.mla_cache_dim, "kv_lora {} + rope {} > mla_cache_dim {}", a.kv_lora,
          a.rope, a.mla_cache_dim);
  v.disjoint({"q_absorbed_buf", a.q_absorbed_buf, std::uint64_t{a.nq} * a.mla_cache_dim * 2},
             {{"q_rope_direct", a.q_rope_direct, std::uint64_t{a.nq} * a.rope * 2}});
  KernelLaunch(gpu, kernel)
      .grid({1, 1, 1})
      .block(kBlock256)
      .arg_ptr(a.q_rope_direct)
      .arg_ptr(a.q_absorbed_buf)
      .arg_u32(a.nq)
      .arg_u32(a.rope)
      .arg_u32(a.kv_lora)
      .arg_u32(a.mla_cache_dim)
      .launch(stream);
}

void mla_cache_assemble(GpuBackend& gpu, KernelHandle kernel, const CacheAssembleArgs& a, Stream stream) {
  const Validator v{"mla_cache_assemble"};
  v.non_null({{"kv_latent", a.kv_latent}, {"k_rope", a.k_rope}, {"k_cache", a.k_cache}, {"v_cache", a.v_cache}});
  v.positive({{"kv_lora", a.kv_lora}});
  v.check(std::uint64_t{a.kv_lora} + a.rope <= a.mla_cache_dim, "kv_lora {} + rope {} > mla_cache_dim {}", a.kv_lora,
          a.rope, a.mla_cache_dim);
  v.at_most("mla_cache_dim", a.mla_cache_dim, kMaxKvCacheDim);  // one thread per element
  const Validator::Extent latent{"kv_latent", a.kv_latent, std::uint64_t{a.kv_lora} * 2},
      rope{"k_rope", a.k_rope, std::uint64_t{a.rope} * 2},
      k_row{"k_cache", a.k_cache, std::uint64_t{a.mla_cache_dim} * 2};
  v.disjoint(k_row, {latent, rope});
  v.disjoint({"v_cache", a.v_cache, std::uint64_t{a.mla_cache_dim} * 2}, {latent, rope, k_row});
  KernelLaunch(gpu, kernel)
      .grid({1, 1, 1})
      .block({std::max(a.mla_cache_dim, 256u), 1, 1})
      .arg_ptr(a.kv_latent)
      .arg_ptr(a.k_rope)
      .arg_ptr(a.k_cache)
      .arg_ptr(a.v_cache)
      .arg_u32(a.kv_lora)
      .arg_u32(a.rope)
      .arg_u32(a.mla_cache_dim)
      .launch(stream);
}

void rope_pairs_bf16(GpuBackend& gpu, KernelHandle kernel, const RopePairsArgs& a, Stream stream) {
  const Validator v{"rope_pairs_bf16"};
  v.non_null({{"x", a.x}});
  v.positive({{"rows", a.rows}, {"rope", a.rope}});
  v.check(a.rope % 2 == 0, "rope {} is odd (pairs (2i, 2i+1))", a.rope);
  v.rope_theta(a.theta, a.rope, a.pos);
  const std::uint64_t pairs = std::uint64_t{a.rows} * (a.rope / 2);
  v.at_most("rows x rope / 2", pairs, 0x7FFF'FFFFull * 256);
  KernelLaunch(gpu, kernel)
      .grid({static_cast<std::uint32_t>(div_ceil<std::uint64_t>(pairs, 256)), 1, 1})
      .block(kBlock256)
      .arg_ptr(a.x)
      .arg_u32(a.rows)
      .arg_u32(a.rope)
      .arg_u32(a.pos)
      .arg_f32(a.theta)
      .launch(stream);
}

void validate(const PagedDecodeNvfp4Args& a) {
  const Validator v{"mla_paged_decode_nvfp4"};
  validate_paged_decode(v, a);
  validate_nvfp4_layout(v, std::uint64_t{a.num_kv_heads} * a.kv_cache_dim, a.block_size, a.block_stride_bytes,
                        a.data_section_bytes);
  validate_o_apart(v, a, std::uint64_t{a.num_kv_heads} * a.kv_cache_dim / 2);
}

void mla_paged_decode_nvfp4(GpuBackend& gpu, KernelHandle kernel, const PagedDecodeNvfp4Args& a, Stream stream) {
  validate(a);
  KernelLaunch l(gpu, kernel);
  paged_decode_args(l, a).arg_u64(a.block_stride_bytes).arg_u64(a.data_section_bytes).launch(stream);
}

void validate(const PagedDecodeFp8Args& a) {
  const Validator v{"mla_paged_decode_fp8"};
  validate_paged_decode(v, a);
  // Every path works in FP32: the largest code (448) times a scale, and the softmax scale times
  // the K scale (the split path's logit scale) times log2(e), must be finite, else the step is inf
  // and NaN.
  v.e4m3_scale("k_scale", a.k_scale);
  v.e4m3_scale("v_scale", a.v_scale);
  v.fp8_logit_scale("inv_sqrt_d", a.inv_sqrt_d, a.k_scale);
  v.check(a.cache_stride >= std::uint64_t{a.num_kv_heads} * a.kv_cache_dim,
          "cache_stride {} < row width {} (num_kv_heads {} x kv_cache_dim {})", a.cache_stride,
          std::uint64_t{a.num_kv_heads} * a.kv_cache_dim, a.num_kv_heads, a.kv_cache_dim);
  validate_row_offsets(v, a.block_size, a.cache_stride, "cache_stride");
  if (a.comp_pool) {
    // Entries are 32-bit key indices after the table's.
    v.check(std::uint64_t{a.max_blocks_per_seq} * a.block_size + a.comp_block_count <= kMaxKeys,
            "comp_block_count {} with max_blocks_per_seq {} x block_size {} exceeds {} keys", a.comp_block_count,
            a.max_blocks_per_seq, a.block_size, kMaxKeys);
    validate_comp_offsets(v, a.num_seqs, a.comp_block_count, a.cache_stride);
  }
  const std::uint64_t row = std::uint64_t{a.num_kv_heads} * a.kv_cache_dim;
  validate_o_apart(v, a, row, a.comp_block_count > 0 ? a.comp_pool : DevicePtr{},
                   {{"sinks", a.sinks, std::uint64_t{a.num_q_heads} * 4}});
}

void mla_paged_decode_fp8(GpuBackend& gpu, KernelHandle kernel, const PagedDecodeFp8Args& a, Stream stream) {
  validate(a);
  KernelLaunch l(gpu, kernel);
  paged_decode_args(l, a)
      .arg_f32(a.k_scale)
      .arg_f32(a.v_scale)
      .arg_u64(a.cache_stride)
      .arg_u32(a.sliding_window)
      .arg_ptr(a.sinks)
      .arg_ptr(a.comp_pool)
      .arg_u32(a.comp_block_count)
      .launch(stream);
}

void mla_paged_cache_store_fp8(GpuBackend& gpu, KernelHandle kernel, const CacheStoreFp8Args& a, Stream stream) {
  const Validator v{"mla_paged_cache_store_fp8"};
  validate_cache_store(v, a, a.row_width);
  v.check(a.cache_stride >= a.row_width, "cache_stride {} < row_width {}", a.cache_stride, a.row_width);
  validate_row_offsets(v, a.block_size, a.cache_stride, "cache_stride");
  v.positive_finite("k_scale", a.k_scale);
  v.positive_finite("v_scale", a.v_scale);
  v.check(a.k_cache != a.v_cache || a.k_scale == a.v_scale,
          "k_cache and v_cache are one pool (latent), but k_scale {} and v_scale {} differ: V's codes would overwrite "
          "K's",
          a.k_scale, a.v_scale);
  KernelLaunch(gpu, kernel)
      .grid({a.num_tokens, 1, 1})
      .block(kBlock256)
      .arg_ptr(a.k_src)
      .arg_ptr(a.v_src)
      .arg_ptr(a.k_cache)
      .arg_ptr(a.v_cache)
      .arg_ptr(a.slot_mapping)
      .arg_u32(a.num_tokens)
      .arg_u32(a.row_width)
      .arg_u32(a.block_size)
      .arg_u64(a.cache_stride)
      .arg_f32(a.k_scale)
      .arg_f32(a.v_scale)
      .launch(stream);
}

void mla_paged_cache_store_nvfp4(GpuBackend& gpu, KernelHandle kernel, const CacheStoreNvfp4Args& a, Stream stream) {
  const Validator v{"mla_paged_cache_store_nvfp4"};
  validate_cache_store(v, a, a.row_width / 2);
  validate_nvfp4_layout(v, a.row_width, a.block_size, a.block_stride_bytes, a.data_section_bytes);
  KernelLaunch(gpu, kernel)
      .grid({a.num_tokens, 1, 1})
      .block(kBlock256)
      .arg_ptr(a.k_src)
      .arg_ptr(a.v_src)
      .arg_ptr(a.k_cache)
      .arg_ptr(a.v_cache)
      .arg_ptr(a.slot_mapping)
      .arg_u32(a.num_tokens)
      .arg_u32(a.row_width)
      .arg_u32(a.block_size)
      .arg_u64(a.block_stride_bytes)
      .arg_u64(a.data_section_bytes)
      .launch(stream);
}

}  // namespace metrale
