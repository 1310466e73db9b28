#include "metrale/kernel_case.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "metrale/buffer.hpp"
#include "metrale/error.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"
#include "metrale/model_case.hpp"
#include "validate.hpp"

namespace metrale {

namespace {

// The arguments of one case as the launcher adapters read them (under run_kernel_case, whose
// context names the case).
struct CaseArgs {
  const KernelCase& c;
  const std::map<std::string, DevicePtr>& ptrs;

  const KernelArg& scalar(const std::string& name, ArgKind kind) const {
    const auto it = c.scalars.find(name);
    if (it == c.scalars.end()) fail(Errc::invalid_argument, "no scalar {}", name);
    if (it->second.kind != kind)
      fail(Errc::invalid_argument, "scalar {} is {}, expected {}", name, to_string(it->second.kind), to_string(kind));
    return it->second;
  }
  std::uint32_t u32(const std::string& n) const { return scalar(n, ArgKind::u32).as_u32(); }
  std::uint64_t u64(const std::string& n) const { return scalar(n, ArgKind::u64).as_u64(); }
  float f32(const std::string& n) const { return scalar(n, ArgKind::f32).as_f32(); }
  /// A u32 scalar that is a switch: 0 or 1, anything else refused by name.
  bool flag(const std::string& n) const {
    const std::uint32_t v = u32(n);
    if (v > 1) fail(Errc::invalid_argument, "{} = {}, but it is a switch (0 or 1)", n, v);
    return v == 1;
  }
  DevicePtr ptr(const std::string& n) const {
    const auto it = ptrs.find(n);
    return it == ptrs.end() ? DevicePtr{} : it->second;
  }
};

struct Adapter {
  std::string module, entry;
  LauncherFields fields;
  // Launch-shape fields a recorded launch implies: grid 'x', 'y' or 'z', 'r' for the split
  // kernels' rows per block (block.x / 8: 128·R threads serve 16·R heads; the wgmma entries'
  // 256 threads serve 64, the wgmma16 entries' 384 or 128 threads 16), or 'c' for the K3 split's
  // chunks (grid.x × 4, a chunk per warp).
  std::vector<std::pair<std::string, char>> from_grid;
  std::function<void(GpuBackend&, KernelHandle, const CaseArgs&)> launch;
  // Grid dimensions ('x', 'y', 'z') the launcher sizes to the running device (the combine's dim
  // blocks: enough for its SMs), which a recorded launch's may differ in: a case recorded on one
  // device replays on another.
  std::string device_sized = {};
};

constexpr ArgKind U32 = ArgKind::u32, U64 = ArgKind::u64, F32 = ArgKind::f32;
constexpr std::string_view kAliasPrefix = "alias.";

PagedDecodeCommon paged_common(const CaseArgs& a) {
  return {a.ptr("q"),
          a.ptr("k_cache"),
          a.ptr("v_cache"),
          a.ptr("o"),
          a.ptr("block_tables"),
          a.ptr("seq_lens"),
          a.u32("max_blocks_per_seq"),
          a.u32("num_q_heads"),
          a.u32("num_kv_heads"),
          a.u32("q_head_dim"),
          a.u32("kv_cache_dim"),
          a.u32("block_size"),
          a.f32("inv_sqrt_d"),
          a.u32("num_seqs")};
}

CacheStoreCommon store_common(const CaseArgs& a) {
  return {a.ptr("k_src"),        a.ptr("v_src"),      a.ptr("k_cache"),   a.ptr("v_cache"),
          a.ptr("slot_mapping"), a.u32("num_tokens"), a.u32("row_width"), a.u32("block_size")};
}

const std::vector<std::pair<std::string, ArgKind>> kPagedScalars = {
    {"max_blocks_per_seq", U32}, {"num_q_heads", U32}, {"num_kv_heads", U32}, {"q_head_dim", U32},
    {"kv_cache_dim", U32},       {"block_size", U32},  {"inv_sqrt_d", F32},   {"num_seqs", U32}};
const std::vector<std::string> kPagedPointers = {"q", "k_cache", "v_cache", "o", "block_tables", "seq_lens"};

template <class T>
std::vector<T> concat(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A split-path case as one step through `dispatch` (paged_decode_fp8 or _nvfp4), its workspace
// inside. Errors: `unsupported` when the split path cannot take the arguments or the device's
// shared memory, rather than a silent run of the seed kernel.
template <class Args, class Dispatch>
void run_split_path(GpuBackend& g, const Args& args, Dispatch dispatch) {
  if (auto why = split_unsupported(args)) fail(Errc::unsupported, "split path: {}", *why);
  DecodeWorkspace ws;
  if (dispatch(g, MlaAbsorbedKernels::resolve(g), MlaFastKernels::resolve(g), args, ws, Stream{0}) != DecodePath::split)
    fail(Errc::unsupported, "split path: the device's {} bytes of shared memory per block are too few",
         g.max_shared_bytes_per_block());
  g.synchronize(0);
}

// The raw split kernels' fields (both entries of a format); `staged` is not recorded (it is
// shared memory, not an argument) and does not change the results: replays load directly.
const std::vector<std::pair<std::string, ArgKind>> kSplitScalars = {
    {"max_blocks_per_seq", U32}, {"num_q_heads", U32},   {"q_head_dim", U32},     {"kv_cache_dim", U32},
    {"block_size", U32},         {"logit_scale", F32},   {"keys_per_split", U32}, {"num_seqs", U32},
    {"num_splits", U32},         {"rows_per_block", U32}};
const std::vector<std::string> kSplitPointers = {"q",          "k_cache",      "v_cache", "o_partial",
                                                 "ml_partial", "block_tables", "seq_lens"};
const std::vector<std::pair<std::string, char>> kSplitShape = {
    {"num_splits", 'x'}, {"num_seqs", 'z'}, {"rows_per_block", 'r'}};

SplitDecodeArgs split_common(const CaseArgs& a) {
  return {a.ptr("q"),
          a.ptr("k_cache"),
          a.ptr("v_cache"),
          a.ptr("o_partial"),
          a.ptr("ml_partial"),
          a.ptr("block_tables"),
          a.ptr("seq_lens"),
          a.u32("max_blocks_per_seq"),
          a.u32("num_q_heads"),
          a.u32("q_head_dim"),
          a.u32("kv_cache_dim"),
          a.u32("block_size"),
          a.f32("logit_scale"),
          a.u32("keys_per_split"),
          a.u32("num_seqs"),
          a.u32("num_splits"),
          a.u32("rows_per_block"),
          false};
}

// The split entries of module mla_fast, or (`wgmma`) the wgmma or wgmma16 entries of module mla_wgmma.
Adapter split_fp8_adapter(const char* entry, bool wgmma = false) {
  return {wgmma ? "mla_wgmma" : "mla_fast",
          entry,
          {concat(kSplitScalars, {{"cache_stride", U64}, {"sliding_window", U32}, {"comp_block_count", U32}}),
           concat(kSplitPointers, {"comp_pool"})},
          kSplitShape,
          [wgmma](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
            const SplitDecodeFp8Args s{split_common(a), a.u64("cache_stride"), a.u32("sliding_window"),
                                       a.ptr("comp_pool"), a.u32("comp_block_count")};
            wgmma ? mla_paged_decode_wgmma_fp8(g, k, s) : mla_paged_decode_split_fp8(g, k, s);
          }};
}

Adapter split_nvfp4_adapter(const char* entry, bool wgmma = false) {
  return {wgmma ? "mla_wgmma" : "mla_fast",
          entry,
          {concat(kSplitScalars, {{"block_stride_bytes", U64}, {"data_section_bytes", U64}}), kSplitPointers},
          kSplitShape,
          [wgmma](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
            const SplitDecodeNvfp4Args s{split_common(a), a.u64("block_stride_bytes"), a.u64("data_section_bytes")};
            wgmma ? mla_paged_decode_wgmma_nvfp4(g, k, s) : mla_paged_decode_split_nvfp4(g, k, s);
          }};
}

// The wgmma entries with the combine in their clusters: the split fields but the partials, and
// the combine's sinks, o and v_scale; `launcher` the 16-head or 64-head entry's.
Adapter fused_fp8_adapter(const char* entry,
                          void (*launcher)(GpuBackend&, KernelHandle, const FusedDecodeFp8Args&, Stream)) {
  return {"mla_wgmma",
          entry,
          {concat(kSplitScalars,
                  {{"cache_stride", U64}, {"sliding_window", U32}, {"comp_block_count", U32}, {"v_scale", F32}}),
           {"q", "k_cache", "v_cache", "block_tables", "seq_lens", "comp_pool", "sinks", "o"}},
          kSplitShape,
          [launcher](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
            const SplitDecodeFp8Args s{split_common(a), a.u64("cache_stride"), a.u32("sliding_window"),
                                       a.ptr("comp_pool"), a.u32("comp_block_count")};
            launcher(g, k, {s, a.ptr("sinks"), a.ptr("o"), a.f32("v_scale")}, 0);
          }};
}

// mla_paged_decode_wgmma_latent_combine_nvfp4: the NVFP4 split fields but the partials, and the
// combine's sinks and o.
Adapter fused_nvfp4_adapter(const char* entry) {
  return {"mla_wgmma",
          entry,
          {concat(kSplitScalars, {{"block_stride_bytes", U64}, {"data_section_bytes", U64}}),
           {"q", "k_cache", "v_cache", "block_tables", "seq_lens", "sinks", "o"}},
          kSplitShape,
          [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
            const SplitDecodeNvfp4Args s{split_common(a), a.u64("block_stride_bytes"), a.u64("data_section_bytes")};
            mla_paged_decode_wgmma_latent_combine_nvfp4(g, k, {s, a.ptr("sinks"), a.ptr("o")});
          }};
}

// One adapter per launcher: the bridge from a case's named values to the launcher's args struct.
const std::vector<Adapter>& adapters() {
  static const std::vector<Adapter> table = {
      {"mla_absorbed",
       "mla_batched_gemv",
       {{{"n_out", U32}, {"k", U32}, {"num_heads", U32}, {"input_stride", U32}, {"output_stride", U32}},
        {"input", "weight", "output"}},
       {{"num_heads", 'y'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_batched_gemv(g, k,
                          {a.ptr("input"), a.ptr("weight"), a.ptr("output"), a.u32("n_out"), a.u32("k"),
                           a.u32("num_heads"), a.u32("input_stride"), a.u32("output_stride")});
       }},
      {"mla_absorbed",
       "mla_q_rope_scatter",
       {{{"nq", U32}, {"hd", U32}, {"nope", U32}, {"rope", U32}, {"kv_lora", U32}, {"mla_cache_dim", U32}},
        {"q_full", "q_absorbed_buf", "q_rope_contiguous"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_q_rope_scatter(g, k,
                            {a.ptr("q_full"), a.ptr("q_absorbed_buf"), a.ptr("q_rope_contiguous"), a.u32("nq"),
                             a.u32("hd"), a.u32("nope"), a.u32("rope"), a.u32("kv_lora"), a.u32("mla_cache_dim")});
       }},
      {"mla_absorbed",
       "mla_q_rope_writeback",
       {{{"nq", U32}, {"rope", U32}, {"kv_lora", U32}, {"mla_cache_dim", U32}}, {"q_rope_direct", "q_absorbed_buf"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_q_rope_writeback(g, k,
                              {a.ptr("q_rope_direct"), a.ptr("q_absorbed_buf"), a.u32("nq"), a.u32("rope"),
                               a.u32("kv_lora"), a.u32("mla_cache_dim")});
       }},
      {"mla_absorbed",
       "mla_cache_assemble",
       {{{"kv_lora", U32}, {"rope", U32}, {"mla_cache_dim", U32}}, {"kv_latent", "k_rope", "k_cache", "v_cache"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_cache_assemble(g, k,
                            {a.ptr("kv_latent"), a.ptr("k_rope"), a.ptr("k_cache"), a.ptr("v_cache"), a.u32("kv_lora"),
                             a.u32("rope"), a.u32("mla_cache_dim")});
       }},
      {"mla_absorbed",
       "rope_pairs_bf16",
       {{{"rows", U32}, {"rope", U32}, {"pos", U32}, {"theta", F32}}, {"x"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         rope_pairs_bf16(g, k, {a.ptr("x"), a.u32("rows"), a.u32("rope"), a.u32("pos"), a.f32("theta")});
       }},
      {"mla_absorbed",
       "mla_paged_decode_nvfp4",
       {concat(kPagedScalars, {{"block_stride_bytes", U64}, {"data_section_bytes", U64}}), kPagedPointers},
       {{"num_seqs", 'y'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_paged_decode_nvfp4(g, k, {paged_common(a), a.u64("block_stride_bytes"), a.u64("data_section_bytes")});
       }},
      {"mla_absorbed",
       "mla_paged_decode_fp8",
       {concat(kPagedScalars, {{"k_scale", F32},
                               {"v_scale", F32},
                               {"cache_stride", U64},
                               {"sliding_window", U32},
                               {"comp_block_count", U32}}),
        concat(kPagedPointers, {"sinks", "comp_pool"})},
       {{"num_seqs", 'y'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_paged_decode_fp8(g, k,
                              {paged_common(a), a.f32("k_scale"), a.f32("v_scale"), a.u64("cache_stride"),
                               a.u32("sliding_window"), a.ptr("sinks"), a.ptr("comp_pool"), a.u32("comp_block_count")});
       }},
      {"mla_absorbed",
       "mla_paged_cache_store_fp8",
       {{{"num_tokens", U32},
         {"row_width", U32},
         {"block_size", U32},
         {"cache_stride", U64},
         {"k_scale", F32},
         {"v_scale", F32}},
        {"k_src", "v_src", "k_cache", "v_cache", "slot_mapping"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_paged_cache_store_fp8(g, k, {store_common(a), a.u64("cache_stride"), a.f32("k_scale"), a.f32("v_scale")});
       }},
      {"mla_absorbed",
       "mla_paged_cache_store_nvfp4",
       {{{"num_tokens", U32},
         {"row_width", U32},
         {"block_size", U32},
         {"block_stride_bytes", U64},
         {"data_section_bytes", U64}},
        {"k_src", "v_src", "k_cache", "v_cache", "slot_mapping"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_paged_cache_store_nvfp4(g, k, {store_common(a), a.u64("block_stride_bytes"), a.u64("data_section_bytes")});
       }},
      {"mla_decode",
       "k3_mla_maybe_rope_f32",
       {{{"heads", U32}, {"nope", U32}, {"rope", U32}, {"pos", U32}, {"theta", F32}, {"use_nope", U32}},
        {"q", "k_new"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         k3_mla_maybe_rope_f32(g, k,
                               {a.ptr("q"), a.ptr("k_new"), a.u32("heads"), a.u32("nope"), a.u32("rope"), a.u32("pos"),
                                a.f32("theta"), a.flag("use_nope")});
       }},
      {"mla_decode",
       "k3_mla_sdpa_gate_f32",
       {{{"seq_len", U32}, {"heads", U32}, {"dq", U32}, {"dv", U32}, {"use_gate", U32}}, {"q", "k", "v", "g", "out"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         k3_mla_sdpa_gate_f32(g, k,
                              {a.ptr("q"), a.ptr("k"), a.ptr("v"), a.ptr("g"), a.ptr("out"), a.u32("seq_len"),
                               a.u32("heads"), a.u32("dq"), a.u32("dv"), a.flag("use_gate")});
       }},
      {"k3_fast",
       "k3_mla_sdpa_split_f32",
       {{{"seq_len", U32}, {"heads", U32}, {"dq", U32}, {"dv", U32}, {"keys_per_chunk", U32}, {"num_chunks", U32}},
        {"q", "k", "v", "o_partial", "ml_partial"}},
       {{"num_chunks", 'c'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         k3_mla_sdpa_split_f32(g, k,
                               {a.ptr("q"), a.ptr("k"), a.ptr("v"), a.ptr("o_partial"), a.ptr("ml_partial"),
                                a.u32("seq_len"), a.u32("heads"), a.u32("dq"), a.u32("dv"), a.u32("keys_per_chunk"),
                                a.u32("num_chunks")});
       }},
      {"k3_fast",
       "k3_mla_sdpa_combine_f32",
       {{{"heads", U32}, {"dv", U32}, {"num_chunks", U32}, {"use_gate", U32}}, {"o_partial", "ml_partial", "g", "out"}},
       {},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         k3_mla_sdpa_combine_f32(g, k,
                                 {a.ptr("o_partial"), a.ptr("ml_partial"), a.ptr("g"), a.ptr("out"), a.u32("heads"),
                                  a.u32("dv"), a.u32("num_chunks"), a.flag("use_gate")});
       }},
      // The K3 split path as one step (split + combine, workspace inside): the seed SDPA's fields.
      {"k3_fast",
       "k3_sdpa_split_path",
       {{{"seq_len", U32}, {"heads", U32}, {"dq", U32}, {"dv", U32}, {"use_gate", U32}}, {"q", "k", "v", "g", "out"}},
       {},
       [](GpuBackend& g, KernelHandle, const CaseArgs& a) {
         const K3SdpaArgs args{a.ptr("q"),       a.ptr("k"),     a.ptr("v"),  a.ptr("g"),  a.ptr("out"),
                               a.u32("seq_len"), a.u32("heads"), a.u32("dq"), a.u32("dv"), a.flag("use_gate")};
         if (auto why = k3_split_unsupported(args)) fail(Errc::unsupported, "split path: {}", *why);
         DecodeWorkspace ws;
         k3_sdpa(g, K3MlaDecodeKernels::resolve(g), args, ws);
         g.synchronize(0);
       }},
      {"mla_fast",
       "mla_batched_gemv_wide",
       {{{"n_out", U32}, {"k", U32}, {"num_heads", U32}, {"input_stride", U32}, {"output_stride", U32}},
        {"input", "weight", "output"}},
       {{"num_heads", 'y'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_batched_gemv_wide(g, k,
                               {a.ptr("input"), a.ptr("weight"), a.ptr("output"), a.u32("n_out"), a.u32("k"),
                                a.u32("num_heads"), a.u32("input_stride"), a.u32("output_stride")});
       }},
      split_fp8_adapter("mla_paged_decode_split_fp8"),
      split_fp8_adapter("mla_paged_decode_split16_fp8"),
      split_nvfp4_adapter("mla_paged_decode_split_nvfp4"),
      split_nvfp4_adapter("mla_paged_decode_split16_nvfp4"),
      split_fp8_adapter("mla_paged_decode_wgmma_fp8", true),
      split_fp8_adapter("mla_paged_decode_wgmma_latent_fp8", true),
      split_nvfp4_adapter("mla_paged_decode_wgmma_nvfp4", true),
      split_nvfp4_adapter("mla_paged_decode_wgmma_latent_nvfp4", true),
      split_fp8_adapter("mla_paged_decode_wgmma16_fp8", true),
      split_nvfp4_adapter("mla_paged_decode_wgmma16_nvfp4", true),
      split_fp8_adapter("mla_paged_decode_wgmma16_rs_fp8", true),
      split_nvfp4_adapter("mla_paged_decode_wgmma16_rs_nvfp4", true),
      fused_fp8_adapter("mla_paged_decode_wgmma16_rs_combine_fp8", &mla_paged_decode_wgmma16_rs_combine_fp8),
      fused_fp8_adapter("mla_paged_decode_wgmma_combine_fp8", &mla_paged_decode_wgmma_combine_fp8),
      fused_fp8_adapter("mla_paged_decode_wgmma_latent_combine_fp8", &mla_paged_decode_wgmma_latent_combine_fp8),
      fused_nvfp4_adapter("mla_paged_decode_wgmma_latent_combine_nvfp4"),
      {"mla_fast",
       "mla_paged_decode_combine",
       {{{"num_q_heads", U32}, {"kv_cache_dim", U32}, {"num_splits", U32}, {"v_scale", F32}, {"num_seqs", U32}},
        {"o_partial", "ml_partial", "sinks", "o"}},
       {{"num_seqs", 'y'}},
       [](GpuBackend& g, KernelHandle k, const CaseArgs& a) {
         mla_paged_decode_combine(
             g, k,
             {a.ptr("o_partial"), a.ptr("ml_partial"), a.ptr("sinks"), a.ptr("o"), a.u32("num_q_heads"),
              a.u32("kv_cache_dim"), a.u32("num_splits"), a.f32("v_scale"), a.u32("num_seqs")});
       },
       "z"},
      // The split path as one step (split + combine, workspace inside): same fields as the seed decode.
      {"mla_fast",
       "paged_decode_fp8_split_path",
       {concat(kPagedScalars, {{"k_scale", F32},
                               {"v_scale", F32},
                               {"cache_stride", U64},
                               {"sliding_window", U32},
                               {"comp_block_count", U32}}),
        concat(kPagedPointers, {"sinks", "comp_pool"})},
       {},
       [](GpuBackend& g, KernelHandle, const CaseArgs& a) {
         const PagedDecodeFp8Args args{paged_common(a),       a.f32("k_scale"),         a.f32("v_scale"),
                                       a.u64("cache_stride"), a.u32("sliding_window"),  a.ptr("sinks"),
                                       a.ptr("comp_pool"),    a.u32("comp_block_count")};
         run_split_path(g, args, [](auto&&... x) { return paged_decode_fp8(x...); });
       }},
      {"mla_fast",
       "paged_decode_nvfp4_split_path",
       {concat(kPagedScalars, {{"block_stride_bytes", U64}, {"data_section_bytes", U64}}), kPagedPointers},
       {},
       [](GpuBackend& g, KernelHandle, const CaseArgs& a) {
         const PagedDecodeNvfp4Args args{paged_common(a), a.u64("block_stride_bytes"), a.u64("data_section_bytes")};
         run_split_path(g, args, [](auto&&... x) { return paged_decode_nvfp4(x...); });
       }},
  };
  return table;
}

const Adapter& adapter(std::string_view module, std::string_view entry) {
  for (const auto& a : adapters())
    if (a.module == module && a.entry == entry) return a;
  fail(Errc::not_found, "no launcher for kernel {}.{}", excerpt(module), excerpt(entry));
}

// The element type of each pointer parameter as the kernel declares it (emu/, kernels/), so that
// a case file's tensor of another dtype is refused instead of reinterpreted; a kernel not listed
// here is not checked.
std::optional<Dtype> pointer_dtype(std::string_view module, std::string_view entry, std::string_view param) {
  if (module != kMlaAbsorbedModule && module != kMlaDecodeModule && module != kMlaFastModule &&
      module != kMlaWgmmaModule && module != kK3FastModule)
    return std::nullopt;
  constexpr Dtype BF16 = Dtype::bf16, U8 = Dtype::u8, I32 = Dtype::i32, FP32 = Dtype::f32;
  using Params = std::map<std::string_view, Dtype>;
  const Params paged = {{"q", BF16},           {"k_cache", U8},   {"v_cache", U8}, {"o", BF16},
                        {"block_tables", I32}, {"seq_lens", I32}, {"sinks", FP32}, {"comp_pool", U8}};
  const Params store = {{"k_src", BF16}, {"v_src", BF16}, {"k_cache", U8}, {"v_cache", U8}, {"slot_mapping", I32}};
  const Params split_nvfp4 = {{"q", BF16},          {"k_cache", U8},       {"v_cache", U8},  {"o_partial", FP32},
                              {"ml_partial", FP32}, {"block_tables", I32}, {"seq_lens", I32}};
  Params split_fp8 = split_nvfp4;
  split_fp8.emplace("comp_pool", U8);
  const Params fused_fp8 = {{"q", BF16},       {"k_cache", U8},   {"v_cache", U8}, {"block_tables", I32},
                            {"seq_lens", I32}, {"comp_pool", U8}, {"sinks", FP32}, {"o", BF16}};
  Params fused_nvfp4 = fused_fp8;
  fused_nvfp4.erase("comp_pool");
  static const std::map<std::string_view, Params> table = {
      {"mla_batched_gemv", {{"input", BF16}, {"weight", BF16}, {"output", BF16}}},
      {"mla_q_rope_scatter", {{"q_full", BF16}, {"q_absorbed_buf", BF16}, {"q_rope_contiguous", BF16}}},
      {"mla_q_rope_writeback", {{"q_rope_direct", BF16}, {"q_absorbed_buf", BF16}}},
      {"mla_cache_assemble", {{"kv_latent", BF16}, {"k_rope", BF16}, {"k_cache", BF16}, {"v_cache", BF16}}},
      {"rope_pairs_bf16", {{"x", BF16}}},
      {"mla_paged_decode_nvfp4", paged},
      {"mla_paged_decode_fp8", paged},
      {"mla_paged_cache_store_fp8", store},
      {"mla_paged_cache_store_nvfp4", store},
      {"k3_mla_maybe_rope_f32", {{"q", FP32}, {"k_new", FP32}}},
      {"k3_mla_sdpa_gate_f32", {{"q", FP32}, {"k", FP32}, {"v", FP32}, {"g", FP32}, {"out", FP32}}},
      {"k3_sdpa_split_path", {{"q", FP32}, {"k", FP32}, {"v", FP32}, {"g", FP32}, {"out", FP32}}},
      {"k3_mla_sdpa_split_f32", {{"q", FP32}, {"k", FP32}, {"v", FP32}, {"o_partial", FP32}, {"ml_partial", FP32}}},
      {"k3_mla_sdpa_combine_f32", {{"o_partial", FP32}, {"ml_partial", FP32}, {"g", FP32}, {"out", FP32}}},
      {"mla_batched_gemv_wide", {{"input", BF16}, {"weight", BF16}, {"output", BF16}}},
      {"paged_decode_fp8_split_path", paged},
      {"paged_decode_nvfp4_split_path", paged},
      {"mla_paged_decode_split_fp8", split_fp8},
      {"mla_paged_decode_split16_fp8", split_fp8},
      {"mla_paged_decode_split_nvfp4", split_nvfp4},
      {"mla_paged_decode_split16_nvfp4", split_nvfp4},
      {"mla_paged_decode_wgmma_fp8", split_fp8},
      {"mla_paged_decode_wgmma_latent_fp8", split_fp8},
      {"mla_paged_decode_wgmma_nvfp4", split_nvfp4},
      {"mla_paged_decode_wgmma_latent_nvfp4", split_nvfp4},
      {"mla_paged_decode_wgmma16_fp8", split_fp8},
      {"mla_paged_decode_wgmma16_nvfp4", split_nvfp4},
      {"mla_paged_decode_wgmma16_rs_fp8", split_fp8},
      {"mla_paged_decode_wgmma16_rs_nvfp4", split_nvfp4},
      {"mla_paged_decode_wgmma16_rs_combine_fp8", fused_fp8},
      {"mla_paged_decode_wgmma_combine_fp8", fused_fp8},
      {"mla_paged_decode_wgmma_latent_combine_fp8", fused_fp8},
      {"mla_paged_decode_wgmma_latent_combine_nvfp4", fused_nvfp4},
      {"mla_paged_decode_combine", {{"o_partial", FP32}, {"ml_partial", FP32}, {"sinks", FP32}, {"o", BF16}}},
  };
  const auto kernel = table.find(entry);
  if (kernel == table.end()) return std::nullopt;
  const auto it = kernel->second.find(param);
  return it == kernel->second.end() ? std::nullopt : std::optional<Dtype>(it->second);
}

std::string dims(Dim3 d) { return fmt::format("{},{},{}", d.x, d.y, d.z); }
// Dimension `d` ('x', 'y' or 'z') of `v`.
std::uint32_t& dim_of(Dim3& v, char d) { return d == 'x' ? v.x : d == 'y' ? v.y : v.z; }

// "x,y,z", three decimal u32 and nothing else (sscanf would take "-1" and "1,1,1junk").
Dim3 parse_dims(const std::string& text, const std::string& what) {
  auto bad = [&] {
    fail(Errc::invalid_argument, "{} '{}' is not x,y,z (three unsigned 32-bit integers)", what, excerpt(text));
  };
  Dim3 d;
  const char* p = text.data();
  const char* const e = text.data() + text.size();
  for (std::uint32_t* v : {&d.x, &d.y, &d.z}) {
    if (v != &d.x && (p == e || *p++ != ',')) bad();
    const auto r = std::from_chars(p, e, *v);
    if (r.ec != std::errc{}) bad();
    p = r.ptr;
  }
  if (p != e) bad();
  return d;
}

// tolerance.<param> / backend_tolerance.<param>: F64 [abs, rel, ulps], abs and rel non-negative
// (+inf allowed), ulps a whole number that fits u32 (a cast of anything else is undefined).
Tolerance parse_tolerance(const std::string& case_name, const std::string& tname, const Tensor& t) {
  if (t.dtype != Dtype::f64)
    fail(Errc::invalid_argument, "case {}: {} is {}, expected F64 [abs, rel, ulps]", case_name, tname,
         to_string(t.dtype));
  const auto v = t.values<double>();
  if (v.size() != 3) fail(Errc::invalid_argument, "case {}: {} must hold [abs, rel, ulps]", case_name, tname);
  if (!(v[0] >= 0) || !(v[1] >= 0))
    fail(Errc::invalid_argument, "case {}: {} abs {} and rel {} must be non-negative numbers (+inf allowed, not nan)",
         case_name, tname, v[0], v[1]);
  if (!(v[2] >= 0 && v[2] <= std::numeric_limits<std::uint32_t>::max() && v[2] == std::floor(v[2])))
    fail(Errc::invalid_argument, "case {}: {} ulps {} is not a whole number in [0, {}]", case_name, tname, v[2],
         std::numeric_limits<std::uint32_t>::max());
  return {v[0], v[1], static_cast<std::uint32_t>(v[2])};
}

std::string format_scalar(const KernelArg& a) {
  switch (a.kind) {
    case ArgKind::f32:
      return fmt::format("{}", a.as_f32());  // shortest round-trip form
    case ArgKind::i32:
      return fmt::format("{}", a.as_i32());
    case ArgKind::u32:
      return fmt::format("{}", a.as_u32());
    default:
      return fmt::format("{}", a.as_u64());
  }
}

KernelArg parse_scalar(const std::string& case_name, const std::string& name, const std::string& text, ArgKind kind) {
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto bad = [&] {
    fail(Errc::invalid_argument, "case {}: scalar {} = '{}' is not a {}", case_name, name, excerpt(text),
         to_string(kind));
  };
  if (kind == ArgKind::f32) {
    float v = 0;
    if (auto r = std::from_chars(b, e, v); r.ec != std::errc{} || r.ptr != e) bad();
    return KernelArg::f32(v);
  }
  if (kind == ArgKind::i32) {
    std::int32_t v = 0;
    if (auto r = std::from_chars(b, e, v); r.ec != std::errc{} || r.ptr != e) bad();
    return KernelArg::i32(v);
  }
  std::uint64_t v = 0;
  if (auto r = std::from_chars(b, e, v); r.ec != std::errc{} || r.ptr != e) bad();
  if (kind == ArgKind::u32 && v > std::numeric_limits<std::uint32_t>::max()) bad();
  return kind == ArgKind::u32 ? KernelArg::u32(static_cast<std::uint32_t>(v)) : KernelArg::u64(v);
}

std::vector<double> to_doubles(const Tensor& t) {
  switch (t.dtype) {
    case Dtype::f64:
      return t.values<double>();
    case Dtype::f32:
    case Dtype::bf16:
    case Dtype::f16: {
      const auto f = t.to_f32();
      return {f.begin(), f.end()};
    }
    case Dtype::i32: {
      const auto v = t.values<std::int32_t>();
      return {v.begin(), v.end()};
    }
    case Dtype::u8: {
      const auto v = t.values<std::uint8_t>();
      return {v.begin(), v.end()};
    }
    default:
      fail(Errc::unsupported, "comparison of {} tensors", to_string(t.dtype));
  }
}

// Elements [begin, begin + count) of `t` as doubles: the comparisons below take a large tensor
// (a KV cache) a slice at a time, so that its doubles, 8 bytes for each byte of a U8 cache, are
// never all in memory at once.
std::vector<double> to_doubles(const Tensor& t, std::size_t begin, std::size_t count) {
  const std::size_t size = dtype_size(t.dtype);
  const auto first = t.data.begin() + static_cast<std::ptrdiff_t>(begin * size);
  return to_doubles(
      Tensor{t.dtype, {static_cast<std::int64_t>(count)}, {first, first + static_cast<std::ptrdiff_t>(count * size)}});
}
constexpr std::size_t kSlice = std::size_t{1} << 20;  // elements a slice

// Distance in representable BF16 values (sign-magnitude bits mapped to a line).
std::uint32_t bf16_ulps(std::uint16_t a, std::uint16_t b) {
  auto line = [](std::uint16_t x) { return (x & 0x8000) ? 0x8000 - static_cast<int>(x & 0x7FFF) : 0x8000 + x; };
  return static_cast<std::uint32_t>(std::abs(line(a) - line(b)));
}

}  // namespace

const LauncherFields& launcher_fields(std::string_view module, std::string_view entry) {
  return adapter(module, entry).fields;
}

bool kernel_writes(std::string_view module, std::string_view entry, std::string_view param) {
  const auto& pointers = launcher_fields(module, entry).pointers;  // (not_found for no launcher)
  if (std::find(pointers.begin(), pointers.end(), param) == pointers.end()) return false;
  // The kernels name their outputs alike; the partials are inputs of the combines, the caches
  // outputs of the kernels that fill them, q and k_new of the rope that turns them in place.
  static const std::set<std::string_view> kOutputs = {"output", "q_absorbed_buf", "q_rope_contiguous", "x", "o", "out"};
  if (kOutputs.count(param) != 0) return true;
  if (param == "o_partial" || param == "ml_partial") return entry.find("combine") == std::string_view::npos;
  if (param == "k_cache" || param == "v_cache")
    return entry == "mla_cache_assemble" || entry.starts_with("mla_paged_cache_store_");
  if (param == "q" || param == "k_new") return entry == "k3_mla_maybe_rope_f32";
  return false;
}

std::optional<std::string> case_unavailable(const GpuBackend& gpu, const KernelCase& c) {
  if (auto why = entry_unavailable(gpu, c.module, c.entry)) return why;
  const auto u32 = [&](const char* name) {
    const auto it = c.scalars.find(name);
    return it == c.scalars.end() ? 0u : it->second.as_u32();
  };
  const std::uint32_t limit = gpu.max_shared_bytes_per_block(), dim = u32("kv_cache_dim"), rows = u32("rows_per_block");
  // Only for the shapes the launchers take: the launcher names any other value itself, where a
  // skip would hide a broken case.
  if (c.module != kMlaFastModule || dim == 0 || split_dim_problem(dim)) return std::nullopt;
  std::uint32_t bytes = 0;
  if (c.entry.starts_with("mla_paged_decode_split") && !split_rows_problem(rows))
    bytes = split_shared_bytes(rows, dim, 0);
  else if (c.entry.ends_with("_split_path") && !split_fits(limit, dim))
    bytes = split_least_shared_bytes(dim);
  if (bytes <= limit) return std::nullopt;
  return fmt::format("{} needs {} bytes of shared memory per block, the device allows {}", c.entry, bytes, limit);
}

std::vector<std::pair<std::string, std::string>> launchable_kernels() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& a : adapters()) out.emplace_back(a.module, a.entry);
  return out;
}

SafeTensors to_safetensors(const KernelCase& c) {
  SafeTensors f;
  f.metadata = {{"kind", "kernel"}, {"module", c.module}, {"entry", c.entry}, {"case", c.name}};
  if (c.shape_recorded) f.metadata["grid"] = dims(c.grid), f.metadata["block"] = dims(c.block);
  for (const auto& [name, v] : c.scalars) f.metadata[name] = format_scalar(v);
  for (const auto& [name, target] : c.aliases) f.metadata[std::string(kAliasPrefix) + name] = target;
  for (const auto& [name, t] : c.inputs) f.tensors[name] = t;
  for (const auto& [name, t] : c.expected) f.tensors["expected." + name] = t;
  for (const auto& [prefix, tols] :
       {std::pair{"tolerance.", &c.tolerance}, {"backend_tolerance.", &c.backend_tolerance}})
    for (const auto& [name, tol] : *tols) {
      const double v[] = {tol.abs, tol.rel, static_cast<double>(tol.ulps)};
      f.tensors[prefix + name] = Tensor::from<double>({3}, v);
    }
  return f;
}

KernelCase kernel_case_from(const SafeTensors& f, std::string name) {
  if (f.metadata.count("kind") == 0 || f.meta("kind") != "kernel")
    fail(Errc::invalid_argument, "case {}: metadata kind is not 'kernel'{}", name,
         is_model_case(f)      ? " (a model case: run it with metrale replay)"
         : is_format_tables(f) ? " (the number-format tables, which the formats tests read)"
                               : "");
  KernelCase c;
  // The name goes into reports and logs: its control characters escaped (a name cannot fake a line),
  // and cut short.
  c.name = excerpt(f.metadata.count("case") != 0 ? f.meta("case") : std::move(name));
  c.module = f.meta("module");
  c.entry = f.meta("entry");
  const Adapter& a = adapter(c.module, c.entry);
  const bool has_grid = f.metadata.count("grid") != 0;
  const bool has_block = f.metadata.count("block") != 0;
  // A launcher-level path runs the launches its dispatcher picks: a grid or block in its file
  // would be ignored without a word (run_kernel_case checks a single kernel's only).
  if (c.entry.ends_with("_path") && (has_grid || has_block))
    fail(Errc::invalid_argument, "case {}: {} is a path of several launches, shaped by its dispatcher: drop its {}",
         c.name, c.entry, has_grid ? "grid" : "block");
  // A recorded launch has both; one alone could not be checked against the launch (run_kernel_case
  // compares both), and an edited one would pass unseen.
  if (has_grid != has_block)
    fail(Errc::invalid_argument, "case {}: metadata {} without {} (a recorded launch gives both, or leave out both)",
         c.name, has_grid ? "grid" : "block", has_grid ? "block" : "grid");
  if (has_grid) c.grid = parse_dims(f.meta("grid"), "grid");
  if (has_block) c.block = parse_dims(f.meta("block"), "block");
  c.shape_recorded = has_grid && has_block;
  for (const auto& [field, kind] : a.fields.scalars) {
    // A recorded launch names only the kernel's parameters; the launch shape gives the rest
    // (a file without a grid has none: the default {1,1,1} would silently mean 1).
    const auto g =
        std::find_if(a.from_grid.begin(), a.from_grid.end(), [&](const auto& p) { return p.first == field; });
    const bool from_block = g != a.from_grid.end() && g->second == 'r';
    const bool shaped = g != a.from_grid.end() && (from_block ? has_block : has_grid);
    if (shaped && !from_block && c.grid.count() == 0)
      fail(Errc::invalid_argument, "case {}: grid ({},{},{}) has a zero dimension, so no value for {}", c.name,
           c.grid.x, c.grid.y, c.grid.z, field);
    if (shaped && g->second == 'c' && std::uint64_t{c.grid.x} * kK3ChunkWarps > 0xFFFF'FFFFu)
      fail(Errc::invalid_argument, "case {}: grid.x {} gives {} past 2^32 - 1 (four per block)", c.name, c.grid.x,
           field);
    const std::uint32_t rows = a.module != kMlaWgmmaModule ? c.block.x / 8 : wgmma_block(a.entry).rows;
    const auto implied = [&] {
      return from_block ? rows : g->second == 'c' ? c.grid.x * kK3ChunkWarps : dim_of(c.grid, g->second);
    };
    if (f.metadata.count(field) != 0) {
      // Given both ways, they must agree: the launcher takes the scalar and would run another
      // launch than the recorded one without a word.
      c.scalars[field] = parse_scalar(c.name, field, f.meta(field), kind);
      if (shaped && c.scalars[field] != KernelArg::u32(implied()))
        fail(Errc::invalid_argument, "case {}: {} = {} but the recorded {} ({},{},{}) gives {}", c.name, field,
             f.meta(field), from_block ? "block" : "grid", from_block ? c.block.x : c.grid.x,
             from_block ? c.block.y : c.grid.y, from_block ? c.block.z : c.grid.z, implied());
      continue;
    }
    if (!shaped) fail(Errc::invalid_argument, "case {}: no value for {}", c.name, field);
    c.scalars[field] = KernelArg::u32(implied());
  }
  // Any other metadata key would be ignored without a word (a misspelt scalar then runs with the
  // launch shape's value, or fails later for another reason): refuse it.
  for (const auto& [key, value] : f.metadata) {
    if (key == "kind" || key == "module" || key == "entry" || key == "case" || key == "grid" || key == "block")
      continue;
    if (key.starts_with(kAliasPrefix)) {
      c.aliases[key.substr(kAliasPrefix.size())] = value;
      continue;
    }
    if (std::none_of(a.fields.scalars.begin(), a.fields.scalars.end(), [&](const auto& s) { return s.first == key; }))
      fail(Errc::invalid_argument, "case {}: metadata {} = '{}' is not a scalar parameter of {}", c.name, excerpt(key),
           excerpt(value), c.entry);
  }
  // The wgmma entries' block follows from the entry: a recorded block that differs is not theirs.
  const std::uint32_t threads = wgmma_block(a.entry).threads;
  if (a.module == kMlaWgmmaModule && has_block && c.block != Dim3{threads, 1, 1})
    fail(Errc::invalid_argument, "case {}: block ({},{},{}) but {} runs blocks of {} threads", c.name, c.block.x,
         c.block.y, c.block.z, a.entry, threads);
  for (const auto& [tensor_name, t] : f.tensors) {
    const std::string tname = excerpt(tensor_name);  // as the messages name it
    if (tensor_name.starts_with("expected.")) {
      // check_output compares these dtypes; any other would fail only after the launch.
      constexpr std::array kComparable{Dtype::f64, Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::i32, Dtype::u8};
      if (std::find(kComparable.begin(), kComparable.end(), t.dtype) == kComparable.end())
        fail(Errc::invalid_argument, "case {}: {} is {}; an expectation is F64, F32, BF16, F16, I32 or U8", c.name,
             tname, to_string(t.dtype));
      c.expected[tensor_name.substr(9)] = t;
    } else if (is_tolerance_tensor(tensor_name)) {
      const bool backend = tensor_name.starts_with("backend_");
      (backend ? c.backend_tolerance : c.tolerance)[tensor_name.substr(tensor_name.find('.') + 1)] =
          parse_tolerance(c.name, tname, t);
    } else if (std::find(a.fields.pointers.begin(), a.fields.pointers.end(), tensor_name) != a.fields.pointers.end()) {
      // The bytes go to the device as they are: a tensor of another dtype would be reinterpreted.
      if (const auto want = pointer_dtype(c.module, c.entry, tensor_name); want && t.dtype != *want)
        fail(Errc::invalid_argument, "case {}: tensor {} is {}, but parameter {} of {} is {}", c.name, tname,
             to_string(t.dtype), tname, c.entry, to_string(*want));
      // An empty tensor would reach the launcher as a null pointer: "is null" for a required one,
      // silently absent for an optional one (sinks, comp_pool).
      if (t.numel() == 0)
        fail(Errc::invalid_argument, "case {}: tensor {} has no elements (leave an optional pointer out instead)",
             c.name, tname);
      c.inputs[tensor_name] = t;
    } else {
      fail(Errc::invalid_argument, "case {}: tensor '{}' is not a pointer parameter of {}", c.name, tname, c.entry);
    }
  }
  for (const auto& [out, t] : c.expected) {
    if (const auto alias = c.aliases.find(out); alias != c.aliases.end())
      fail(Errc::invalid_argument, "case {}: expected.{}, but {} is an alias of {} (expect {}'s buffer instead)",
           c.name, excerpt(out), excerpt(out), excerpt(alias->second), excerpt(alias->second));
    if (c.inputs.count(out) == 0)
      fail(Errc::invalid_argument, "case {}: output {} has no initial tensor (its device buffer)", c.name,
           excerpt(out));
    if (t.numel() != c.inputs.at(out).numel())  // else found only after the launch
      fail(Errc::invalid_argument, "case {}: expected.{} has {} values, its buffer {} {}", c.name, out, t.numel(), out,
           c.inputs.at(out).numel());
    // An expectation of a buffer the kernel only reads holds whatever the kernel did (adversarial
    // trial, forty-fourth session: expected.q alone passed); one an output aliases is written.
    const bool written =
        kernel_writes(c.module, c.entry, out) || std::any_of(c.aliases.begin(), c.aliases.end(), [&](const auto& al) {
          return al.second == out && kernel_writes(c.module, c.entry, al.first);
        });
    if (!written) {
      std::vector<std::string> outputs;
      for (const auto& p : a.fields.pointers)
        if (kernel_writes(c.module, c.entry, p)) outputs.push_back(p);
      fail(Errc::invalid_argument,
           "case {}: expected.{}, but {} does not write {} (it only reads it), so the expectation checks nothing; "
           "its outputs: {}",
           c.name, excerpt(out), c.entry, excerpt(out), fmt::join(outputs, ", "));
    }
  }
  for (const auto* tolerances : {&c.tolerance, &c.backend_tolerance})
    for (const auto& [out, tol] : *tolerances)
      if (c.expected.count(out) == 0) {
        fail(Errc::invalid_argument, "case {}: a tolerance for {}, which has no expected.{} tensor", c.name,
             excerpt(out), excerpt(out));
      } else if (const auto stored = pointer_dtype(c.module, c.entry, out); stored && tol.ulps > 0) {
        // check_output counts ULPs between two BF16 values only, where they would otherwise have
        // no effect: the output against its expectation (tolerance), or against another backend's
        // output, of its own dtype (backend_tolerance).
        const Dtype other = tolerances == &c.tolerance ? c.expected.at(out).dtype : *stored;
        if (*stored != Dtype::bf16 || other != Dtype::bf16)
          fail(Errc::invalid_argument,
               "case {}: {}tolerance.{} allows {} ulp{}, which count between BF16 values only, but {} is {} against {} "
               "{}: give rel instead",
               c.name, tolerances == &c.tolerance ? "" : "backend_", out, tol.ulps, tol.ulps == 1 ? "" : "s", out,
               to_string(*stored), tolerances == &c.tolerance ? "an expectation of" : "another backend's",
               to_string(other));
      }
  const auto& pointers = a.fields.pointers;
  for (const auto& [param, target] : c.aliases) {
    const std::string what = fmt::format("case {}: alias.{} = '{}'", c.name, excerpt(param), excerpt(target));
    if (std::find(pointers.begin(), pointers.end(), param) == pointers.end())
      fail(Errc::invalid_argument, "{}: '{}' is not a pointer parameter of {}", what, excerpt(param), c.entry);
    if (c.inputs.count(target) == 0)
      fail(Errc::invalid_argument, "{}: '{}' is not an input tensor of the case{}", what, excerpt(target),
           c.aliases.count(target) != 0 ? " (it is an alias itself)" : "");
    if (c.inputs.count(param) != 0)
      fail(Errc::invalid_argument, "{}: {} has a tensor of its own (an alias shares {}'s)", what, excerpt(param),
           excerpt(target));
    // The buffer goes to the parameter as it is: another dtype would be reinterpreted (a U8 pool
    // read as BF16, an FP32 output read as a cache).
    const Dtype have = c.inputs.at(target).dtype;
    if (const auto want = pointer_dtype(c.module, c.entry, param); want && have != *want)
      fail(Errc::invalid_argument, "{}: tensor {} is {}, but parameter {} of {} is {}", what, excerpt(target),
           to_string(have), excerpt(param), c.entry, to_string(*want));
  }
  return c;
}

bool is_tolerance_tensor(const std::string& name) {
  return name.starts_with("tolerance.") || name.starts_with("backend_tolerance.");
}

KernelCase read_kernel_case_header(const std::filesystem::path& path) {
  return read_kernel_case(SafeTensors::read_header(path, is_tolerance_tensor), path);
}

KernelCase read_kernel_case(const std::filesystem::path& path) {
  // The case's checks run on the header before the data is read, and again on the whole file; a
  // file they refuse is not read (adversarial trial, forty-ninth session: a 3 GB tensor under a
  // wrong name was read whole first). The read's errors name the file already.
  (void)read_kernel_case_header(path);
  return read_kernel_case(SafeTensors::read(path), path);
}

KernelCase read_kernel_case(const SafeTensors& file, const std::filesystem::path& path) {
  return with_context(path.string(), [&] { return kernel_case_from(file, path.stem().string()); });
}

std::map<std::string, Tensor> run_kernel_case(GpuBackend& gpu, const KernelCase& c, bool all) {
  return with_context("case " + c.name, [&] {
    const Adapter& a = adapter(c.module, c.entry);
    std::map<std::string, DeviceBuffer> buffers;
    std::map<std::string, DevicePtr> ptrs;
    for (const auto& [name, t] : c.inputs) {
      buffers.emplace(name, DeviceBuffer::from_host<std::byte>(gpu, t.data));
      ptrs[name] = buffers.at(name).ptr();
    }
    for (const auto& [param, target] : c.aliases) ptrs[param] = ptrs.at(target);
    const bool path = c.entry.ends_with("_path");  // a launcher-level path of several kernels
    // A single kernel's recorded launch shape must be the one its launcher runs: a grid or block
    // edited in the file would otherwise be ignored and the case pass as recorded, or (a size
    // edited past its buffers) run out of them. Compared as the launch is made, before it runs.
    bool first = true;
    const GpuBackend::LaunchObserver watch(gpu, [&](KernelHandle, Dim3 ran, Dim3 block) {
      if (!std::exchange(first, false) || path || !c.shape_recorded) return;
      Dim3 grid = c.grid;  // the recorded grid, the device's where sized to it
      for (const char d : a.device_sized) dim_of(grid, d) = dim_of(ran, d);
      if (ran != grid || block != c.block)
        fail(Errc::invalid_argument,
             "the launcher would run grid ({}) block ({}), but the case records grid ({}) block ({}){}; not run",
             dims(ran), dims(block), dims(c.grid), dims(c.block),
             a.device_sized.empty() ? "" : fmt::format(" (grid {} sized to the device)", a.device_sized));
    });
    try {
      a.launch(gpu, path ? KernelHandle{} : gpu.kernel(c.module, c.entry), CaseArgs{c, ptrs});
    } catch (const Error& e) {
      // A pointer the case has no tensor for reaches the launcher as null, and a required one is
      // refused as "<name> is null", which no file can hold: name what the file lacks (the
      // adversarial trial, forty-seventh session).
      for (const auto& p : a.fields.pointers)
        if (ptrs.count(p) == 0 && e.message().ends_with(": " + detail::Validator::null_pointer(p)))
          fail(e.code(), "{}: the case has no tensor '{}', a pointer parameter {} needs", e.message(), p, c.entry);
      throw;
    }
    gpu.synchronize(0);
    std::map<std::string, Tensor> out;
    for (const auto& [name, buf] : buffers) {
      if (!all && c.expected.count(name) == 0) continue;
      const Tensor& in = c.inputs.at(name);
      out[name] = Tensor{in.dtype, in.shape, buf.to_host<std::byte>()};
    }
    return out;
  });
}

OutputCheck check_output(const std::string& name, const Tensor& got, const Tensor& want, const Tolerance& tol) {
  OutputCheck r{name, got.numel(), 0, 0, 0, 0, "", false};
  if (got.numel() != want.numel()) {
    r.bad = r.count;
    r.worst = fmt::format("{} values against {} expected", got.numel(), want.numel());
    return r;
  }
  const bool ulp_check = tol.ulps > 0 && got.dtype == Dtype::bf16 && want.dtype == Dtype::bf16;
  const auto ulps = [&](std::size_t i) {  // BF16 values i of got and want, ulp_check only
    std::uint16_t a = 0, b = 0;
    std::memcpy(&a, got.data.data() + 2 * i, 2);
    std::memcpy(&b, want.data.data() + 2 * i, 2);
    return bf16_ulps(a, b);
  };
  got.check_size(), want.check_size();            // the slices below read numel values of each
  to_doubles(got, 0, 0), to_doubles(want, 0, 0);  // an error for a dtype it cannot compare, even when empty
  // The element `worst` names, written once at the end (not at each new leader: a tensor whose
  // errors grow along it would format a line an element): the failing element furthest from its
  // expectation, else the passing one nearest its tolerance.
  struct Element {
    std::size_t i = 0;
    double got = 0, want = 0, by = -1;
  } failing, nearest{0, 0, 0, 0};
  for (std::size_t begin = 0; begin < r.count; begin += kSlice) {
    const std::size_t n = std::min(kSlice, r.count - begin);
    const auto gs = to_doubles(got, begin, n), ws = to_doubles(want, begin, n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = begin + k;
      const double g = gs[k], w = ws[k];
      const double diff = std::fabs(g - w);
      const bool both_nan = std::isnan(g) && std::isnan(w);
      const bool same = both_nan || g == w;  // the same infinity included: no difference to report
      // An infinite expectation is met only by the same infinity (∞ − ∞ is NaN, and a relative
      // tolerance of ∞ would accept anything); a finite one only by a finite value within the
      // tolerance, as numpy's isclose has it (its relative part 0 at an expected 0, also when the
      // relative tolerance is ∞: ∞·0 is NaN; and ∞ under a relative tolerance of ∞ fails).
      const double rel = w == 0 ? 0.0 : tol.rel * std::fabs(w);
      bool ok = both_nan || (std::isfinite(w) ? std::isfinite(g) && diff <= tol.abs + rel : g == w);
      // ULPs between finite values only: on the bit line an infinity is one ULP past the largest
      // finite value and NaN payloads lie just past it.
      const bool ulp_pair = ulp_check && std::isfinite(g) && std::isfinite(w);
      if (!ok && ulp_pair) ok = ulps(i) <= tol.ulps;
      if (!same) {
        r.max_abs = std::isnan(diff) ? diff : std::max(r.max_abs, diff);
        if (w != 0) r.max_rel = std::max(r.max_rel, diff / std::fabs(w));
        const double inf = std::numeric_limits<double>::infinity(), allowed = tol.abs + rel;
        double used = !std::isfinite(diff) || !std::isfinite(w) ? inf : allowed > 0 ? diff / allowed : inf;
        if (ulp_pair) used = std::min(used, static_cast<double>(ulps(i)) / tol.ulps);
        r.tolerance_used = std::max(r.tolerance_used, used);
        if (ok && used > nearest.by) nearest = {i, g, w, used};
      }
      if (!ok) {
        ++r.bad;
        const double excess = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff;
        if (excess > failing.by) failing = {i, g, w, excess};
      }
    }
  }
  if (r.bad > 0)
    r.worst = fmt::format("[{}] got {} expected {}", failing.i, failing.got, failing.want);
  else if (nearest.by > 0)
    r.worst = fmt::format("[{}] got {} expected {} (within its tolerance)", nearest.i, nearest.got, nearest.want);
  r.pass = r.bad == 0;
  return r;
}

namespace {
bool is_float(Dtype d) { return d == Dtype::bf16 || d == Dtype::f16 || d == Dtype::f32 || d == Dtype::f64; }
}  // namespace

Tolerance same_arithmetic_tolerance(const Tensor& want, double floor) {
  if (!is_float(want.dtype)) return {};
  double peak = 0;
  const std::size_t count = want.numel();
  for (std::size_t begin = 0; begin < count; begin += kSlice)
    for (double v : to_doubles(want, begin, std::min(kSlice, count - begin)))
      if (std::isfinite(v)) peak = std::max(peak, std::fabs(v));
  if (want.dtype == Dtype::bf16) return {floor * peak, 0, 1};
  if (want.dtype == Dtype::f16) return {floor * peak, 0x1p-10, 0};  // one ULP, relative, at most
  return {floor * peak, 1e-6, 0};
}

namespace {
// One ULP of a 16-bit float format relative to the value, at most (0 for wider ones).
double ulp16(Dtype d) { return d == Dtype::bf16 ? 0x1p-7 : d == Dtype::f16 ? 0x1p-10 : 0; }

// same_arithmetic_tolerance(want), widened to the coarser format's one ULP where the output (as the
// kernel stores it) and the expectation are floats of two formats (a BF16 output against an F32
// reference's, an F32 partial against a BF16 or F16 expectation): one side carries that format's
// rounding, which F32's 1e-6 fails at half an ULP, and BF16's ULP count compares two BF16 values only.
Tolerance default_tolerance(const KernelCase& c, const std::string& output, const Tensor& want) {
  Tolerance t = same_arithmetic_tolerance(want);
  if (const auto stored = pointer_dtype(c.module, c.entry, output);
      stored && *stored != want.dtype && is_float(*stored) && is_float(want.dtype))
    t.rel = std::max({t.rel, ulp16(*stored), ulp16(want.dtype)});
  return t;
}
}  // namespace

Tolerance expected_tolerance(const KernelCase& c, const std::string& output, const Tensor& want) {
  const auto it = c.tolerance.find(output);
  return it != c.tolerance.end() ? it->second : default_tolerance(c, output, want);
}

Tolerance backend_tolerance(const KernelCase& c, const std::string& output, const Tensor& want) {
  const auto it = c.backend_tolerance.find(output);
  return it != c.backend_tolerance.end() ? it->second : default_tolerance(c, output, want);
}

std::string describe_kernel_case(const KernelCase& c) {
  std::string out = fmt::format("case      {}\nkernel    {}.{}\n", c.name, c.module, c.entry);
  const auto dims = [](const Dim3& d) { return fmt::format("[{}, {}, {}]", d.x, d.y, d.z); };
  out += c.shape_recorded ? fmt::format("launch    grid {}, block {} (recorded: a run refuses another shape)\n",
                                        dims(c.grid), dims(c.block))
                          : std::string("launch    as the launcher computes it (none recorded)\n");
  const auto tensor = [](const Tensor& t) {
    // (a header's tensors hold no data; a shape of thousands of dims, its first eight and a count)
    const std::string shape =
        t.shape.size() <= 8
            ? fmt::format("{}", fmt::join(t.shape, ", "))
            : fmt::format("{}, ... ({} dims)", fmt::join(t.shape.begin(), t.shape.begin() + 8, ", "), t.shape.size());
    return fmt::format("{} [{}], {} bytes", to_string(t.dtype), shape, t.numel() * dtype_size(t.dtype));
  };
  const auto tolerance = [](const Tolerance& t) {
    return fmt::format("abs {:g}, rel {:g}, ulps {}", t.abs, t.rel, t.ulps);
  };
  const auto section = [&out](const char* title, bool empty) {
    out += fmt::format("{}\n", title);
    if (empty) out += "  (none)\n";
  };
  section("scalars", c.scalars.empty());
  for (const auto& [name, v] : c.scalars)
    out += fmt::format("  {:<22} {} ({})\n", name, format_scalar(v), to_string(v.kind));
  section("inputs", c.inputs.empty() && c.aliases.empty());
  for (const auto& [name, t] : c.inputs) out += fmt::format("  {:<22} {}\n", name, tensor(t));
  for (const auto& [name, target] : c.aliases) out += fmt::format("  {:<22} = {} (one buffer)\n", name, target);
  section("expected", c.expected.empty());
  for (const auto& [name, t] : c.expected) {
    out += fmt::format("  {:<22} {}\n  {:<22} tolerance {} ({})\n", name, tensor(t), "",
                       tolerance(expected_tolerance(c, name, t)),
                       c.tolerance.contains(name) ? "the case's" : "the default: another backend's result");
    if (const auto it = c.backend_tolerance.find(name); it != c.backend_tolerance.end())
      out += fmt::format("  {:<22} between backends {}\n", "", tolerance(it->second));
  }
  return out;
}

}  // namespace metrale
