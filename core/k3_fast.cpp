// Launchers, plan and dispatcher of module `k3_fast`.
#include "metrale/k3_fast.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "metrale/launch.hpp"
#include "validate.hpp"

namespace metrale {

using detail::validate_entry;
using detail::Validator;

namespace {

constexpr std::uint32_t kStepKeys = 4;       // keys a warp loads at once
constexpr std::uint32_t kMinChunkKeys = 32;  // 16: faster only at 16 heads x 1K (docs/k3.md)
constexpr std::uint32_t kWarpsPerSm = 32;    // the plan's target: two rounds of 16 resident warps

void validate_chunks(const Validator& v, std::uint32_t num_chunks) {
  v.check(num_chunks > 0 && num_chunks % kK3ChunkWarps == 0 && num_chunks <= kK3MaxChunks,
          "num_chunks {} is not a positive multiple of 4 up to {}", num_chunks, kK3MaxChunks);
}

}  // namespace

K3SplitPlan plan_k3_sdpa_split(std::uint32_t seq_len, std::uint32_t heads, std::uint32_t dv,
                               std::uint32_t multiprocessors) {
  if (heads == 0) fail(Errc::invalid_argument, "k3 split plan: heads is 0");
  if (seq_len > detail::kMaxKeys)
    fail(Errc::invalid_argument, "k3 split plan: seq_len {} exceeds {}", seq_len, detail::kMaxKeys);
  const std::uint64_t keys = std::max<std::uint32_t>(seq_len, 1);
  // Whole blocks of four chunks, no more than two rounds' worth: a third round of a few blocks
  // would cost as much as a full one.
  const std::uint64_t want = std::uint64_t{multiprocessors} * kWarpsPerSm / heads / kK3ChunkWarps * kK3ChunkWarps;
  const std::uint64_t most = std::clamp<std::uint64_t>(keys / kMinChunkKeys, 1, kK3MaxChunks);  // chunks of ≥ 32 keys
  const std::uint64_t chunks = std::clamp<std::uint64_t>(want, 1, most);
  K3SplitPlan p;
  p.keys_per_chunk = static_cast<std::uint32_t>(div_ceil<std::uint64_t>(div_ceil(keys, chunks), kStepKeys) * kStepKeys);
  p.num_chunks = static_cast<std::uint32_t>(
      div_ceil<std::uint64_t>(div_ceil<std::uint64_t>(keys, p.keys_per_chunk), kK3ChunkWarps) * kK3ChunkWarps);
  const std::uint64_t rows = std::uint64_t{p.num_chunks} * heads;
  p.ml_offset = rows * dv * sizeof(float);
  p.workspace_bytes = p.ml_offset + rows * 2 * sizeof(float);
  return p;
}

std::optional<std::string> k3_split_unsupported(const K3SdpaArgs& a) {
  if (a.seq_len > detail::kMaxKeys)
    return fmt::format("seq_len {} above {} (the split kernel steps through keys in 32 bits)", a.seq_len,
                       detail::kMaxKeys);
  if (a.dq > kK3SplitMaxDim || a.dv > kK3SplitMaxDim)
    return fmt::format("dq {} or dv {} above {} (the split kernel's registers)", a.dq, a.dv, kK3SplitMaxDim);
  if (a.heads > detail::kMaxGridYZ) return fmt::format("heads {} above {} (the grid's y)", a.heads, detail::kMaxGridYZ);
  return std::nullopt;
}

void k3_mla_sdpa_split_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaSplitArgs& a, Stream stream) {
  const Validator v{"k3_mla_sdpa_split_f32"};
  v.non_null({{"q", a.q}, {"o_partial", a.o_partial}, {"ml_partial", a.ml_partial}});
  if (a.seq_len > 0) v.non_null({{"k", a.k}, {"v", a.v}});
  v.positive({{"heads", a.heads}, {"dq", a.dq}, {"dv", a.dv}, {"keys_per_chunk", a.keys_per_chunk}});
  v.at_most("dq", a.dq, kK3SplitMaxDim);
  v.at_most("dv", a.dv, kK3SplitMaxDim);
  v.at_most("heads", a.heads, detail::kMaxGridYZ);
  v.at_most("seq_len", a.seq_len, detail::kMaxKeys);  // a warp's key steps must not wrap
  validate_chunks(v, a.num_chunks);
  v.check(std::uint64_t{a.num_chunks} * a.keys_per_chunk >= a.seq_len,
          "num_chunks {} x keys_per_chunk {} covers fewer keys than seq_len {}: keys would be dropped", a.num_chunks,
          a.keys_per_chunk, a.seq_len);
  using detail::saturating_product;
  const std::uint64_t rows = std::uint64_t{a.num_chunks} * a.heads;
  const Validator::Extent q{"q", a.q, saturating_product({a.heads, a.dq, 4})},
      k{"k", a.k, saturating_product({a.seq_len, a.heads, a.dq, 4})},
      v_{"v", a.v, saturating_product({a.seq_len, a.heads, a.dv, 4})}, ml{"ml_partial", a.ml_partial, rows * 2 * 4};
  v.disjoint({"o_partial", a.o_partial, rows * a.dv * 4}, {q, k, v_, ml});
  v.disjoint(ml, {q, k, v_});
  validate_entry(v, gpu, kernel, {"k3_mla_sdpa_split_f32"});
  KernelLaunch(gpu, kernel)
      .grid({a.num_chunks / kK3ChunkWarps, a.heads, 1})
      .block({kK3ChunkWarps * 32, 1, 1})
      .early_start()  // the kernel waits for the one ahead before it touches memory
      .arg_ptr(a.q)
      .arg_ptr(a.k)
      .arg_ptr(a.v)
      .arg_ptr(a.o_partial)
      .arg_ptr(a.ml_partial)
      .arg_u32(a.seq_len)
      .arg_u32(a.heads)
      .arg_u32(a.dq)
      .arg_u32(a.dv)
      .arg_u32(a.keys_per_chunk)
      .launch(stream);
}

void k3_mla_sdpa_combine_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaCombineArgs& a, Stream stream) {
  const Validator v{"k3_mla_sdpa_combine_f32"};
  v.non_null({{"o_partial", a.o_partial}, {"ml_partial", a.ml_partial}, {"out", a.out}});
  if (a.use_gate) v.non_null({{"g", a.g}});
  v.positive({{"heads", a.heads}, {"dv", a.dv}});
  v.at_most("heads", a.heads, detail::kMaxGridX);
  v.at_most("dv", a.dv, std::uint64_t{detail::kMaxGridYZ} * 32);  // blocks of 32 dims: the grid's y
  validate_chunks(v, a.num_chunks);
  using detail::saturating_product;
  v.disjoint({"out", a.out, saturating_product({a.heads, a.dv, 4})},
             {{"o_partial", a.o_partial, saturating_product({a.num_chunks, a.heads, a.dv, 4})},
              {"ml_partial", a.ml_partial, saturating_product({a.num_chunks, a.heads, 2, 4})},
              {"g", a.use_gate ? a.g : DevicePtr{}, saturating_product({a.heads, a.dv, 4})}});
  validate_entry(v, gpu, kernel, {"k3_mla_sdpa_combine_f32"});
  KernelLaunch(gpu, kernel)
      .grid({a.heads, div_ceil(a.dv, 32u), 1})
      .block({256, 1, 1})
      .early_start()  // the kernel waits for the split kernel before it reads the partials
      .arg_ptr(a.o_partial)
      .arg_ptr(a.ml_partial)
      .arg_ptr(a.g)
      .arg_ptr(a.out)
      .arg_u32(a.heads)
      .arg_u32(a.dv)
      .arg_u32(a.num_chunks)
      .arg_u32(a.use_gate ? 1 : 0)
      .launch(stream);
}

DecodePath k3_sdpa(GpuBackend& gpu, const K3MlaDecodeKernels& kernels, const K3SdpaArgs& a, DecodeWorkspace& ws,
                   Stream stream) {
  validate(a);  // the seed launcher's rules hold for both paths
  if (k3_split_unsupported(a)) {
    k3_mla_sdpa_gate_f32(gpu, kernels.sdpa, a, stream);
    return DecodePath::seed;
  }
  const K3SplitPlan p = plan_k3_sdpa_split(a.seq_len, a.heads, a.dv, gpu.multiprocessor_count());
  const DevicePtr w = ws.get(gpu, p.workspace_bytes);
  k3_mla_sdpa_split_f32(
      gpu, kernels.sdpa_split,
      {a.q, a.k, a.v, w, w + p.ml_offset, a.seq_len, a.heads, a.dq, a.dv, p.keys_per_chunk, p.num_chunks}, stream);
  k3_mla_sdpa_combine_f32(gpu, kernels.sdpa_combine,
                          {w, w + p.ml_offset, a.g, a.out, a.heads, a.dv, p.num_chunks, a.use_gate}, stream);
  return DecodePath::split;
}

}  // namespace metrale
