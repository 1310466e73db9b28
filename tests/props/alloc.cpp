// Allocation (issue 5): every launcher and decode entry point, over generated valid inputs,
// returns the emulator's live allocations to exactly those before the call (the same serial
// numbers, the same bytes), and every access its ports make is checked by the emulator: out of
// bounds, use after free, bytes never written (fresh temporaries and the device KV's unused
// rows are never written), races. A leak, a double free or a bad read fails the property.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "arb.hpp"
#include "metrale/buffer.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"
#include "props.hpp"

namespace metrale::props {

namespace {

struct Live {
  std::set<std::uint64_t> serials;
  std::size_t bytes = 0;
  bool operator==(const Live&) const = default;
};

Live live(const emu::EmulatorBackend& gpu) { return {live_serials(gpu), gpu.live_bytes()}; }

void require_same(const Live& before, const Live& after, const std::string& what) {
  if (before == after) return;
  RC_FAIL(fmt::format("{}: {} live allocations ({} bytes) before, {} ({} bytes) after", what, before.serials.size(),
                      before.bytes, after.serials.size(), after.bytes));
}

// Every launcher once per case, each through its case file's path: upload, launch, download.
void every_launcher() {
  std::vector<KernelCase> cases;
  std::string names;
  for (const auto& [module, entry] : launchable_kernels()) {
    cases.push_back(arb_kernel_case(module, entry));
    names += cases.back().name + "\n";
  }
  note_input(names, cases);
  for (const auto& c : cases) check_case(c);  // live allocations after == before, outputs in tolerance
}

std::vector<float> floats_of(const MlaConfig& cfg, bool v_row) { return arb_floats(v_row ? cfg.v_row() : cfg.k_row()); }

// K3: the decoder on both placements and both launchers directly, token after token.
void k3_entry_points() {
  const MlaConfig cfg = arb_k3_config();
  const auto tokens = *in_range<std::uint32_t>(1, 6);
  const auto history = *in_range<std::uint32_t>(0, 4);
  note_input(fmt::format("heads {} nope {} rope {} v {} use_nope {} gate {}, history {}, {} tokens", cfg.heads,
                         cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.mla_use_nope,
                         cfg.mla_use_output_gate, history, tokens));
  emu::EmulatorBackend gpu(emulator_options());
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  MlaKv host;
  for (std::uint32_t t = 0; t < history; ++t) host.append(floats_of(cfg, false), floats_of(cfg, true));
  auto g = [&] { return cfg.mla_use_output_gate ? floats_of(cfg, true) : std::vector<float>{}; };
  {
    K3MlaDecoder dev(gpu, cfg, tokens, MlaKvPlacement::device);
    K3MlaDecoder hst(gpu, cfg, tokens, MlaKvPlacement::host);
    auto kv = MlaDeviceKv::alloc_and_upload(gpu, host, history + tokens, cfg.k_row(), cfg.v_row());
    MlaKv direct = host;
    const Live base = live(gpu);  // the two device KVs
    for (std::uint32_t t = 0; t < tokens; ++t) {
      auto q = floats_of(cfg, false), k = floats_of(cfg, false);
      const auto v = floats_of(cfg, true), gate = g();
      dev.decode(q, k, v, gate, history + t, 1e4f);
      require_same(base, live(gpu), "K3MlaDecoder (device KV) decode");
      hst.decode(q, k, v, gate, history + t, 1e4f);
      require_same(base, live(gpu), "K3MlaDecoder (host KV) decode");
      launch_k3_mla_decode_token_on_device(gpu, kernels, q, k, v, gate, kv, cfg, history + t, 1e4f);
      require_same(base, live(gpu), "launch_k3_mla_decode_token_on_device");
      launch_k3_mla_decode_token(gpu, kernels, q, k, v, gate, direct, cfg, history + t, 1e4f);
      require_same(base, live(gpu), "launch_k3_mla_decode_token");
      RC_ASSERT(dev.history().seq_len == t + 1u);
      RC_ASSERT(kv.download().seq_len == history + t + 1u);
      require_same(base, live(gpu), "download");
    }
    kv.free();
    RC_ASSERT(live(gpu).serials.size() + 2 == base.serials.size());
  }
  RC_ASSERT(gpu.live_allocations().empty());
}

// DeepSeek: a paged cache and the decoder; prefill through append_kv, then decode steps.
void deepseek_entry_points() {
  MlaDims dims;
  // rope 0 is left out: DeepseekMlaDecoder::append_kv / step then launch mla_cache_assemble with a
  // null k_rope, which it refuses (reported; the constructor accepts rope 0).
  dims.rope = 8 * *in_range<std::uint32_t>(1, 3);
  dims.kv_lora = 16 * *in_range<std::uint32_t>(2, 5) - dims.rope;  // the row a multiple of 16 (NVFP4)
  dims.nope = *in_range<std::uint32_t>(1, 17);
  dims.v_head = *in_range<std::uint32_t>(1, 17);
  const auto heads = *in_range<std::uint32_t>(1, 5);
  PagedCacheConfig cc;
  cc.format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  cc.block_size = *in_range<std::uint32_t>(1, 9);
  cc.kv_cache_dim = dims.cache_dim();
  cc.free_list_seed = *in_range<std::uint64_t>(0, 1000);
  cc.k_scale = arb_scale(0.01f, 0.1f);
  cc.v_scale = arb_scale(0.01f, 0.1f);
  const bool rotate = *rc::gen::arbitrary<bool>();
  const auto seqs = *in_range<std::uint32_t>(1, 4);
  const auto steps = *in_range<std::uint32_t>(1, 4);
  std::vector<std::uint32_t> prefill;
  std::uint32_t need = 0;  // blocks for every token of the run: the pool never runs out here
  for (std::uint32_t s = 0; s < seqs; ++s) {
    prefill.push_back(*in_range<std::uint32_t>(0, 6));
    need += (prefill.back() + steps + cc.block_size - 1) / cc.block_size;
  }
  cc.num_blocks = need + *in_range<std::uint32_t>(0, 9);
  note_input(
      fmt::format("{} kv_lora {} rope {} nope {} v_head {} heads {} block_size {} num_blocks {} rotate {}, {} "
                  "sequences, {} steps",
                  to_string(cc.format), dims.kv_lora, dims.rope, dims.nope, dims.v_head, heads, cc.block_size,
                  cc.num_blocks, rotate, seqs, steps));
  emu::EmulatorBackend gpu(emulator_options());
  {
    PagedKvCache cache(gpu, cc);
    const auto w_uk = arb_floats(std::size_t{heads} * dims.nope * dims.kv_lora);
    const auto w_uv = arb_floats(std::size_t{heads} * dims.v_head * dims.kv_lora);
    std::vector<Bf16> wk(w_uk.size()), wv(w_uv.size());
    std::transform(w_uk.begin(), w_uk.end(), wk.begin(), Bf16::from_float);
    std::transform(w_uv.begin(), w_uv.end(), wv.begin(), Bf16::from_float);
    DeepseekMlaDecoder dec(gpu, {heads, dims, 1.0f / std::sqrt(float(dims.hd())), 1e4f, rotate}, wk, wv, cache);
    const Live base = live(gpu);  // the pools and the weights
    std::vector<SeqId> ids;
    std::vector<std::uint32_t> len;
    for (std::uint32_t s = 0; s < seqs; ++s) ids.push_back(cache.add_sequence());
    // Prefill: each sequence a few tokens, interleaved.
    std::vector<SeqId> tok;
    std::vector<std::uint32_t> pos;
    len.assign(seqs, 0);
    for (std::uint32_t s = 0; s < seqs; ++s)
      for (auto n = prefill[s]; n > 0; --n) {
        tok.push_back(ids[s]);
        pos.push_back(len[s]++);
      }
    dec.append_kv(tok, arb_floats(tok.size() * dims.kv_lora), arb_floats(tok.size() * dims.rope), pos);
    require_same(base, live(gpu), "append_kv");
    for (std::uint32_t step = 0; step < steps; ++step) {
      std::vector<std::uint32_t> p(len);
      const auto out = dec.step({ids, arb_floats(seqs * heads * dims.nope), arb_floats(seqs * heads * dims.rope),
                                 arb_floats(seqs * dims.kv_lora), arb_floats(seqs * dims.rope), p});
      require_same(base, live(gpu), "DeepseekMlaDecoder::step");
      for (float x : out.attn_out) RC_ASSERT(std::isfinite(x));
      for (auto& l : len) ++l;
    }
    auto tables = cache.upload_tables(ids);
    tables = {};
    require_same(base, live(gpu), "upload_tables");
  }
  RC_ASSERT(gpu.live_allocations().empty());
}

// The paged-decode dispatchers with one workspace across calls: it holds at most one buffer,
// grows when a call needs more, gives the same output as a fresh one, and leaves nothing behind.
void dispatcher_workspace() {
  const auto format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  const auto calls = *in_range(1, 4);
  std::vector<KernelCase> cases;
  for (int i = 0; i < calls; ++i)
    cases.push_back(*rc::gen::arbitrary<bool>() ? gen::split_path_case(arb_split_spec(format))
                                                : gen::paged_decode_case(arb_paged_spec(format)));
  std::string names;
  for (const auto& c : cases) names += c.name + "\n";
  note_input(names, cases);
  emu::EmulatorBackend gpu(emulator_options());
  const auto seed = MlaAbsorbedKernels::resolve(gpu);
  const auto fast = MlaFastKernels::resolve(gpu);
  {
    DecodeWorkspace ws;
    for (const auto& c : cases) {
      const Live before = live(gpu);
      std::map<std::string, DeviceBuffer> bufs;
      for (const auto& [name, t] : c.inputs) bufs.emplace(name, DeviceBuffer::from_host<std::byte>(gpu, t.data));
      auto ptr = [&](const std::string& n) { return bufs.count(n) != 0 ? bufs.at(n).ptr() : DevicePtr{}; };
      auto u32 = [&](const char* n) { return c.scalars.at(n).as_u32(); };
      const PagedDecodeCommon common{ptr("q"),
                                     ptr("k_cache"),
                                     ptr("v_cache"),
                                     ptr("o"),
                                     ptr("block_tables"),
                                     ptr("seq_lens"),
                                     u32("max_blocks_per_seq"),
                                     u32("num_q_heads"),
                                     u32("num_kv_heads"),
                                     u32("q_head_dim"),
                                     u32("kv_cache_dim"),
                                     u32("block_size"),
                                     c.scalars.at("inv_sqrt_d").as_f32(),
                                     u32("num_seqs")};
      const Live inputs = live(gpu);
      if (format == KvFormat::fp8) {
        paged_decode_fp8(gpu, seed, fast,
                         {common, c.scalars.at("k_scale").as_f32(), c.scalars.at("v_scale").as_f32(),
                          c.scalars.at("cache_stride").as_u64(), u32("sliding_window"), ptr("sinks"), ptr("comp_pool"),
                          u32("comp_block_count")},
                         ws);
      } else {
        paged_decode_nvfp4(
            gpu, seed, fast,
            {common, c.scalars.at("block_stride_bytes").as_u64(), c.scalars.at("data_section_bytes").as_u64()}, ws);
      }
      gpu.synchronize(0);
      // Only the workspace may have changed: at most one buffer beyond the inputs and the earlier one.
      const Live after = live(gpu);
      std::size_t extra = 0;
      for (auto s : after.serials) extra += inputs.serials.count(s) == 0 ? 1 : 0;
      RC_ASSERT(extra <= 1u);
      const Tensor got{Dtype::bf16, c.inputs.at("o").shape, bufs.at("o").to_host<std::byte>()};
      const auto r = check_output("o", got, c.expected.at("o"), c.tolerance.at("o"));
      if (!r.pass) RC_FAIL(fmt::format("o with a reused workspace: {} of {} bad, worst {}", r.bad, r.count, r.worst));
      bufs.clear();
      RC_ASSERT(live(gpu).serials.size() <= before.serials.size() + 1);
    }
  }
  RC_ASSERT(gpu.live_allocations().empty());
}

}  // namespace

std::vector<Property> alloc_properties() {
  return {{"every launcher over random valid inputs leaves live allocations as they were", every_launcher},
          {"the K3 decode entry points leave live allocations as they were", k3_entry_points},
          {"the DeepSeek decode entry points leave live allocations as they were", deepseek_entry_points},
          {"the paged-decode dispatchers reuse one workspace and leave nothing behind", dispatcher_workspace}};
}

}  // namespace metrale::props
