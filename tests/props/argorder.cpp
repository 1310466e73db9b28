// Argument ordering (issue 5): sentinel values through every launcher and dispatcher, read back
// from the emulator's launch record by name. The record names each argument by the kernel's
// declared parameter list (the port's signature, itself checked against the PTX and the .cu
// sources by ptx_signature_test), so a launcher that pushes two arguments in the wrong order, or
// a port whose names disagree with the kernel's, fails here.
#include <rapidcheck.h>

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "launcher_defs.hpp"
#include "launchers.hpp"
#include "metrale/launch.hpp"
#include "metrale/mla_absorbed.hpp"
#include "metrale/mla_fast.hpp"
#include "props.hpp"

namespace metrale::props {

namespace {

using defs::coin;
using defs::u;
using defs::u64;
using defs::u_fit;

std::string dims(Dim3 d) { return fmt::format("({},{},{})", d.x, d.y, d.z); }

std::string show(const KernelArg& a) {
  return a.kind == ArgKind::f32 ? fmt::format("f32 {}", a.as_f32())
                                : fmt::format("{} {:#x}", to_string(a.kind), a.bits);
}

// The record must be `e`: same kernel and launch shape (grid, block, shared memory, cluster), the
// declared parameters in the expected order, each holding the value of the field of its name.
void check_record(const emu::LaunchRecord& r, const ExpectedLaunch& e) {
  if (r.module != e.module || r.entry != e.entry)
    RC_FAIL(fmt::format("launched {}.{}, expected {}.{}", r.module, r.entry, e.module, e.entry));
  if (!(r.grid == e.grid) || !(r.block == e.block))
    RC_FAIL(fmt::format("{}: grid {} block {}, expected grid {} block {}", e.entry, dims(r.grid), dims(r.block),
                        dims(e.grid), dims(e.block)));
  if (r.shared_bytes != e.shared_bytes || !(r.cluster == e.cluster))
    RC_FAIL(fmt::format("{}: {} bytes of shared memory, cluster {}; expected {} bytes, cluster {}", e.entry,
                        r.shared_bytes, dims(r.cluster), e.shared_bytes, dims(e.cluster)));
  if (r.args.size() != e.args.size())
    RC_FAIL(fmt::format("{}: {} arguments recorded, {} expected", e.entry, r.args.size(), e.args.size()));
  for (std::size_t i = 0; i < e.args.size(); ++i) {
    const auto& [name, want] = e.args[i];
    if (r.args[i].name != name)
      RC_FAIL(fmt::format("{}: parameter {} is declared as {}, expected {}", e.entry, i, r.args[i].name, name));
    if (!(r.args[i].value == want))
      RC_FAIL(fmt::format("{}: parameter {} ({}) received {}, the launcher's field {} holds {}", e.entry, i, name,
                          show(r.args[i].value), name, show(want)));
  }
}

struct DryRun {
  emu::EmulatorBackend gpu{emulator_options()};
  DryRun() {
    gpu.set_dry_run(true);
    gpu.record_launches(true);
  }
};

void every_launcher() {
  DryRun rig;
  std::string inputs;
  for (const auto& l : launchers()) {
    if (entry_unavailable(rig.gpu, l.module, l.entry)) continue;  // the device played cannot run it (validation.cpp)
    const auto args = l.arb();
    const ExpectedLaunch e = args->expected();
    if (e.shared_bytes > rig.gpu.max_shared_bytes_per_block()) continue;  // (the same, for these arguments)
    inputs += describe(e) + "\n";
    note_input(inputs);
    const KernelHandle k = rig.gpu.kernel(l.module, l.entry);
    rig.gpu.clear_launch_log();
    args->launch(rig.gpu, k);
    RC_ASSERT(rig.gpu.launch_log().size() == 1u);
    check_record(rig.gpu.launch_log().back(), e);
  }
}

// Split-path arguments the seed launcher's rules accept (one KV head, q_head_dim a multiple of
// 32, kv_cache_dim of 64..576 by 64, 16-byte pitches), or with `seed_only` shapes it must refuse.
template <class A>
void arb_dispatch(A& a, bool seed_only) {
  defs::Sentinels s;
  a.q = s.next(), a.k_cache = s.next(), a.v_cache = s.next(), a.o = s.next();
  a.block_tables = s.next(), a.seq_lens = s.next();
  a.num_kv_heads = 1;
  a.num_q_heads = u(1, 200);
  a.kv_cache_dim = 64 * u(1, 9);
  a.q_head_dim = 32 * u(1, a.kv_cache_dim / 32);
  if (coin()) a.q_head_dim = a.kv_cache_dim = 576;  // DeepSeek's rows: the wgmma entries (>32, ≤16 heads)
  if (seed_only) a.q_head_dim -= u(1, 31);          // not a multiple of 32: the seed kernel
  a.block_size = u(1, 512);
  a.max_blocks_per_seq = u(1, 512);
  a.inv_sqrt_d = defs::positive_float();
  a.num_seqs = u(1, 16);
}

std::vector<std::pair<std::string, KernelArg>> split_common(const PagedDecodeCommon& a, const SplitPlan& p,
                                                            DevicePtr ws, float logit_scale) {
  using defs::P, defs::U, defs::F;
  return {{"q", P(a.q)},
          {"k_cache", P(a.k_cache)},
          {"v_cache", P(a.v_cache)},
          {"o_partial", P(ws)},
          {"ml_partial", P(ws + p.ml_offset)},
          {"block_tables", P(a.block_tables)},
          {"seq_lens", P(a.seq_lens)},
          {"max_blocks_per_seq", U(a.max_blocks_per_seq)},
          {"num_q_heads", U(a.num_q_heads)},
          {"q_head_dim", U(a.q_head_dim)},
          {"kv_cache_dim", U(a.kv_cache_dim)},
          {"block_size", U(a.block_size)},
          {"logit_scale", F(logit_scale)}};
}

ExpectedLaunch combine_launch(const PagedDecodeCommon& a, const SplitPlan& p, DevicePtr ws, DevicePtr sinks,
                              float v_scale) {
  using defs::P, defs::U, defs::F;
  return {"mla_fast",
          "mla_paged_decode_combine",
          {a.num_q_heads, a.num_seqs, defs::combine_blocks(a.num_q_heads, a.num_seqs, a.kv_cache_dim)},
          {256, 1, 1},
          {{"o_partial", P(ws)},
           {"ml_partial", P(ws + p.ml_offset)},
           {"sinks", P(sinks)},
           {"o", P(a.o)},
           {"num_q_heads", U(a.num_q_heads)},
           {"kv_cache_dim", U(a.kv_cache_dim)},
           {"num_splits", U(p.num_splits)},
           {"v_scale", F(v_scale)}}};
}

// The module and entry the dispatcher runs for plan `p` of format `f`.
std::pair<const char*, std::string> split_entry(const SplitPlan& p, const char* f) {
  if (p.wgmma)
    return {"mla_wgmma", fmt::format("{}_{}",
                                     p.rows_per_block != 16 ? "mla_paged_decode_wgmma"
                                     : p.staged             ? "mla_paged_decode_wgmma16_rs"
                                                            : "mla_paged_decode_wgmma16",
                                     f)};
  return {"mla_fast",
          fmt::format("{}_{}", p.rows_per_block == 16 ? "mla_paged_decode_split16" : "mla_paged_decode_split", f)};
}

void paged_dispatchers() {
  DryRun rig;
  const auto seed = MlaAbsorbedKernels::resolve(rig.gpu);
  const auto fast = MlaFastKernels::resolve(rig.gpu);
  const bool seed_only = *rc::gen::arbitrary<bool>();
  DecodeWorkspace ws;
  using defs::P, defs::U, defs::F, defs::Q;
  if (coin()) {
    PagedDecodeFp8Args a;
    arb_dispatch(a, seed_only);
    a.k_scale = defs::positive_float(), a.v_scale = defs::positive_float();
    a.cache_stride = 16 * u(a.kv_cache_dim / 16, 4096);
    a.sliding_window = u(0, defs::kU32Max);
    defs::Sentinels s(0x80);
    a.sinks = coin() ? s.next() : DevicePtr{};
    a.comp_pool = coin() ? s.next() : DevicePtr{};
    a.comp_block_count = u(0, 64);
    // The cluster entries need o 8-byte aligned and apart from q (the step may write o over q, row
    // for row, where the widths agree; any other overlap is refused): o a quarter of the time 2
    // bytes off its sentinel, half the time q itself where it can be.
    if (const std::uint32_t pick = u(0, 3); pick == 0)
      a.o = a.o + 2;
    else if (pick < 3 && a.q_head_dim == a.kv_cache_dim)
      a.o = a.q;
    if (u(0, 3) == 0) a.v_cache = a.k_cache;  // one latent pool: the heads-in-M entry where 64-head blocks run
    const std::uint32_t comp = a.comp_pool ? a.comp_block_count : 0, sms = rig.gpu.multiprocessor_count();
    const bool latent = fast.wgmma_latent_fp8.id != 0 && wgmma_rows(a, comp, sms) == 64 &&
                        latent_applies(a, comp, rig.gpu.max_shared_bytes_per_block());
    const bool clusters_allowed = a.o.addr % 8 == 0 && a.o.addr != a.q.addr;
    const DecodePath path = paged_decode_fp8(rig.gpu, seed, fast, a, ws);
    note_input(fmt::format("fp8 num_q_heads {} q_head_dim {} kv_cache_dim {} block_size {} comp {} q {:#x} o {:#x}",
                           a.num_q_heads, a.q_head_dim, a.kv_cache_dim, a.block_size, a.comp_block_count, a.q.addr,
                           a.o.addr));
    const auto& log = rig.gpu.launch_log();
    RC_ASSERT((path == DecodePath::seed) ==
              (seed_only || !split_fits(rig.gpu.max_shared_bytes_per_block(), a.kv_cache_dim)));
    if (path == DecodePath::seed) {
      RC_ASSERT(log.size() == 1u);
      RC_ASSERT(log[0].entry == std::string("mla_paged_decode_fp8"));
      return;
    }
    const std::span<const std::uint32_t> clusters = !clusters_allowed                ? std::span<const std::uint32_t>{}
                                                    : latent                         ? fast.fused_clusters_latent
                                                    : wgmma_rows(a, comp, sms) == 64 ? fast.fused_clusters64
                                                                                     : fast.fused_clusters;
    const SplitPlan p = plan_split_decode(a, KvFormat::fp8, comp, sms, rig.gpu.max_shared_bytes_per_block(),
                                          fast.wgmma_fp8.id != 0, clusters);
    const bool fused = p.fused;  // the combine in the split kernel's clusters
    RC_ASSERT(log.size() == (fused ? 1u : 2u));
    const DevicePtr w = fused ? DevicePtr{} : ws.get(rig.gpu, 0);
    const auto [module, entry] = split_entry(p, "fp8");
    ExpectedLaunch split{module,
                         latent && fused                               ? "mla_paged_decode_wgmma_latent_combine_fp8"
                         : latent && p.wgmma && p.rows_per_block == 64 ? "mla_paged_decode_wgmma_latent_fp8"
                         : !fused                                      ? entry
                         : p.rows_per_block == 64                      ? "mla_paged_decode_wgmma_combine_fp8"
                                                                       : "mla_paged_decode_wgmma16_rs_combine_fp8",
                         {p.num_splits, p.head_groups, a.num_seqs},
                         {p.threads, 1, 1},
                         split_common(a, p, w, a.inv_sqrt_d * a.k_scale)};
    if (fused) split.args[3] = {"sinks", P(a.sinks)}, split.args[4] = {"o", P(a.o)};
    // The heads-in-M block: Q, two FP16 tiles and P, its factors and mbarriers (225.8 KiB); the
    // others' as the plan sized them. Fused: a (sequence, head group)'s chunks are one cluster.
    split.shared_bytes = latent && p.wgmma && p.rows_per_block == 64 ? 231200 : p.shared_bytes;
    if (fused) split.cluster = {p.num_splits, 1, 1};
    split.args.insert(split.args.end(), {{"cache_stride", Q(a.cache_stride)},
                                         {"sliding_window", U(a.sliding_window)},
                                         {"comp_pool", P(a.comp_pool)},
                                         {"comp_block_count", U(a.comp_block_count)},
                                         {"keys_per_split", U(p.keys_per_split)}});
    if (fused) split.args.push_back({"v_scale", F(a.v_scale)});
    check_record(log[0], split);
    if (!fused) check_record(log[1], combine_launch(a, p, w, a.sinks, a.v_scale));
  } else {
    PagedDecodeNvfp4Args a;
    arb_dispatch(a, seed_only);
    const std::uint64_t width = a.kv_cache_dim;
    a.data_section_bytes = (a.block_size * width / 2 + 15) / 16 * 16 + 16 * u(0, 4);
    a.block_stride_bytes = a.data_section_bytes + (a.block_size * width / 16 + 15) / 16 * 16 + 16 * u(0, 4);
    if (u(0, 3) == 0) a.v_cache = a.k_cache;  // one latent pool: the heads-in-M entry where 64-head blocks run
    if (const std::uint32_t pick = u(0, 3); pick == 0)  // o as for FP8 above: the cluster entry's rules
      a.o = a.o + 2;
    else if (pick < 3 && a.q_head_dim == a.kv_cache_dim)
      a.o = a.q;
    const std::uint32_t sms = rig.gpu.multiprocessor_count();
    const bool latent = fast.wgmma_latent_nvfp4.id != 0 && wgmma_rows(a, 0, sms) == 64 &&
                        latent_applies(a, 0, rig.gpu.max_shared_bytes_per_block());
    const bool clusters_allowed = latent && a.o.addr % 8 == 0 && a.o.addr != a.q.addr;
    const DecodePath path = paged_decode_nvfp4(rig.gpu, seed, fast, a, ws);
    note_input(fmt::format("nvfp4 num_q_heads {} q_head_dim {} kv_cache_dim {} block_size {} q {:#x} o {:#x}",
                           a.num_q_heads, a.q_head_dim, a.kv_cache_dim, a.block_size, a.q.addr, a.o.addr));
    const auto& log = rig.gpu.launch_log();
    RC_ASSERT((path == DecodePath::seed) ==
              (seed_only || !split_fits(rig.gpu.max_shared_bytes_per_block(), a.kv_cache_dim)));
    if (path == DecodePath::seed) {
      RC_ASSERT(log.size() == 1u);
      RC_ASSERT(log[0].entry == std::string("mla_paged_decode_nvfp4"));
      return;
    }
    const SplitPlan p =
        plan_split_decode(a, KvFormat::nvfp4, 0, sms, rig.gpu.max_shared_bytes_per_block(), fast.wgmma_nvfp4.id != 0,
                          clusters_allowed ? fast.fused_clusters_latent_nvfp4 : std::span<const std::uint32_t>{});
    RC_ASSERT(log.size() == (p.fused ? 1u : 2u));
    const DevicePtr w = p.fused ? DevicePtr{} : ws.get(rig.gpu, 0);
    const auto [module, entry] = split_entry(p, "nvfp4");
    ExpectedLaunch split{module,
                         p.fused  ? "mla_paged_decode_wgmma_latent_combine_nvfp4"
                         : latent ? "mla_paged_decode_wgmma_latent_nvfp4"
                                  : entry,
                         {p.num_splits, p.head_groups, a.num_seqs},
                         {p.threads, 1, 1},
                         split_common(a, p, w, a.inv_sqrt_d)};
    if (p.fused) split.args[3] = {"sinks", P(DevicePtr{})}, split.args[4] = {"o", P(a.o)};
    split.shared_bytes = latent ? 231200 : p.shared_bytes;  // the heads-in-M block's, as FP8's above
    if (p.fused) split.cluster = {p.num_splits, 1, 1};
    split.args.insert(split.args.end(), {{"block_stride_bytes", Q(a.block_stride_bytes)},
                                         {"data_section_bytes", Q(a.data_section_bytes)},
                                         {"keys_per_split", U(p.keys_per_split)}});
    check_record(log[0], split);
    if (!p.fused) check_record(log[1], combine_launch(a, p, w, DevicePtr{}, 1.0f));
  }
}

void gemv_dispatcher() {
  DryRun rig;
  const auto seed = MlaAbsorbedKernels::resolve(rig.gpu);
  const auto fast = MlaFastKernels::resolve(rig.gpu);
  defs::Sentinels s;
  BatchedGemvArgs a{s.next(), s.next(), s.next()};
  // Wide only when k and input_stride are multiples of 8 and input, weight 16-byte aligned.
  if (coin()) a.input = a.input + 2 * u(1, 7);
  if (coin()) a.weight = a.weight + 2 * u(1, 7);
  a.n_out = u(1, 1u << 20);
  a.num_heads = u(1, 65535);
  // The weights within their slot.
  const std::uint64_t row_bytes = 2ull * a.num_heads * a.n_out;
  a.k = coin() ? 8 * u_fit(1, 1u << 16, 8 * row_bytes) : u_fit(1, 1u << 19, row_bytes);
  a.input_stride = coin() ? 8 * u(0, 1u << 16) : u(0, 1u << 19);
  a.output_stride = a.n_out + u(0, 1000);
  const bool want_wide = a.k % 8 == 0 && a.input_stride % 8 == 0 && a.input.addr % 16 == 0 && a.weight.addr % 16 == 0;
  const bool wide = batched_gemv(rig.gpu, seed, fast, a);
  note_input(
      fmt::format("k {} input_stride {} input {:#x} weight {:#x}", a.k, a.input_stride, a.input.addr, a.weight.addr));
  RC_ASSERT(wide == want_wide);
  RC_ASSERT(rig.gpu.launch_log().size() == 1u);
  using defs::P, defs::U;
  check_record(rig.gpu.launch_log()[0],
               {wide ? "mla_fast" : "mla_absorbed",
                wide ? "mla_batched_gemv_wide" : "mla_batched_gemv",
                {wide ? div_ceil(a.n_out, defs::wide_gemv_rows(a.k)) : div_ceil(a.n_out, 8u), a.num_heads, 1},
                {256, 1, 1},
                {{"input", P(a.input)},
                 {"weight", P(a.weight)},
                 {"output", P(a.output)},
                 {"n_out", U(a.n_out)},
                 {"k", U(a.k)},
                 {"input_stride", U(a.input_stride)},
                 {"output_stride", U(a.output_stride)}}});
}

}  // namespace

std::vector<Property> argorder_properties() {
  return {{"random sentinels through every launcher reach the declared parameters of their names", every_launcher},
          {"the paged-decode dispatchers route every argument to the kernels they choose", paged_dispatchers},
          {"the batched GEMV dispatcher routes every argument to the kernel it chooses", gemv_dispatcher}};
}

}  // namespace metrale::props
