// Free on error (issue 5), SQLite-style: run an operation once on a twin to count its backend
// calls n, then for every N ≤ n make call N fail, once and from N on. The injected error must
// surface (a failed free alone is ignored, SPEC §4, and then the operation completes with the
// clean result), nothing may leak, and the stored state — the paged cache's sequences, tables,
// free blocks and live rows; MlaKv and MlaDeviceKv contents; the inputs of a dispatch — must be
// exactly as before; a retry without faults gives the clean result bit for bit. The generated
// scenarios (configs, batch shapes, histories, cache formats, paths) are what deepseek_mla_test
// and mla_decode_test sweep for one fixed configuration each.
#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arb.hpp"
#include "metrale/buffer.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"
#include "props.hpp"

namespace metrale::props {

namespace {

// The code an injected failure of `op` carries (emulator.cpp).
Errc injected_code(std::string_view op) {
  if (op == "alloc") return Errc::out_of_memory;
  if (op == "launch") return Errc::launch_failed;
  if (op == "kernel") return Errc::not_found;
  return Errc::device_fault;
}

// The error is the injected one, with its code, and (when given) the context frame first.
void require_injected(const Error& e, const std::string& context_prefix, const std::string& what) {
  const std::string msg = e.what();
  const auto at = e.message().find("injected fault: ");
  if (at == std::string::npos) RC_FAIL(fmt::format("{}: not the injected fault: {}", what, msg));
  const std::string rest = e.message().substr(at + 16);
  const std::string op = rest.substr(0, rest.find(' '));
  if (e.code() != injected_code(op))
    RC_FAIL(fmt::format("{}: code {} for an injected {} fault: {}", what, to_string(e.code()), op, msg));
  if (!context_prefix.empty() && (e.context().empty() || e.context().front().rfind(context_prefix, 0) != 0))
    RC_FAIL(fmt::format("{}: context does not start with \"{}\": {}", what, context_prefix, msg));
}

std::string plan_name(std::uint64_t nth, std::uint64_t n, bool persistent) {
  return fmt::format("failing call {} of {}{}", nth, n, persistent ? " and every later one" : " once");
}

// ---- the DeepSeek decode step over a paged cache ----------------------------------------------------

struct DsScenario {
  MlaDims dims;
  std::uint32_t heads = 1;
  PagedCacheConfig cache;
  bool rotate = true;
  std::vector<Bf16> w_uk, w_uv;
  std::vector<std::uint32_t> prefill;  // tokens per sequence before the sweep
  std::vector<float> kv, kr;           // the prefill's rows
  std::vector<SeqId> tok;              // the prefill's sequence of each token
  std::vector<std::uint32_t> pos;
  std::vector<float> q_nope, q_rope, step_kv, step_kr;  // the swept step's inputs
  std::uint32_t append_tokens = 0;                      // the swept append's batch (by sequence index)
  std::vector<SeqId> append_tok;
  std::vector<std::uint32_t> append_pos;
  std::vector<float> append_kv, append_kr;

  std::string describe() const {
    return fmt::format("{} kv_lora {} rope {} nope {} v_head {} heads {} block_size {} num_blocks {} rotate {} "
                       "prefill {} append {}",
                       to_string(cache.format), dims.kv_lora, dims.rope, dims.nope, dims.v_head, heads,
                       cache.block_size, cache.num_blocks, rotate, fmt::join(prefill, ","), append_tokens);
  }
};

std::vector<Bf16> bf16s(const std::vector<float>& f) {
  std::vector<Bf16> b(f.size());
  std::transform(f.begin(), f.end(), b.begin(), Bf16::from_float);
  return b;
}

DsScenario arb_ds() {
  DsScenario s;
  s.dims.rope = 8 * *in_range<std::uint32_t>(1, 3);  // not 0: see alloc.cpp
  s.dims.kv_lora = 16 * *in_range<std::uint32_t>(2, 4) - s.dims.rope;
  s.dims.nope = *in_range<std::uint32_t>(1, 9);
  s.dims.v_head = *in_range<std::uint32_t>(1, 9);
  s.heads = *in_range<std::uint32_t>(1, 3);
  s.cache.format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  s.cache.block_size = *in_range<std::uint32_t>(1, 5);
  s.cache.num_blocks = 24;
  s.cache.kv_cache_dim = s.dims.cache_dim();
  s.cache.free_list_seed = *in_range<std::uint64_t>(0, 100);
  s.cache.k_scale = arb_scale(0.01f, 0.1f);
  s.cache.v_scale = arb_scale(0.01f, 0.1f);
  s.rotate = *rc::gen::arbitrary<bool>();
  s.w_uk = bf16s(arb_floats(std::size_t{s.heads} * s.dims.nope * s.dims.kv_lora));
  s.w_uv = bf16s(arb_floats(std::size_t{s.heads} * s.dims.v_head * s.dims.kv_lora));
  const auto seqs = *in_range<std::uint32_t>(1, 3);
  std::vector<std::uint32_t> len(seqs, 0);
  for (std::uint32_t i = 0; i < seqs; ++i) s.prefill.push_back(*in_range<std::uint32_t>(0, 6));
  for (std::uint32_t i = 0; i < seqs; ++i)
    for (std::uint32_t t = 0; t < s.prefill[i]; ++t) s.tok.push_back(i), s.pos.push_back(len[i]++);
  s.kv = arb_floats(s.tok.size() * s.dims.kv_lora);
  s.kr = arb_floats(s.tok.size() * s.dims.rope);
  s.append_tokens = *in_range<std::uint32_t>(1, 4);
  for (std::uint32_t t = 0; t < s.append_tokens; ++t) {
    const auto i = *in_range<std::uint32_t>(0, seqs);
    s.append_tok.push_back(i), s.append_pos.push_back(len[i]++);
  }
  s.append_kv = arb_floats(s.append_tokens * s.dims.kv_lora);
  s.append_kr = arb_floats(s.append_tokens * s.dims.rope);
  s.q_nope = arb_floats(std::size_t{seqs} * s.heads * s.dims.nope);
  s.q_rope = arb_floats(std::size_t{seqs} * s.heads * s.dims.rope);
  s.step_kv = arb_floats(std::size_t{seqs} * s.dims.kv_lora);
  s.step_kr = arb_floats(std::size_t{seqs} * s.dims.rope);
  return s;
}

// A backend, a cache and a decoder holding the scenario's prefill.
struct DsRig {
  emu::EmulatorBackend gpu{emulator_options()};
  std::optional<PagedKvCache> cache;
  std::optional<DeepseekMlaDecoder> dec;
  std::vector<SeqId> ids;

  explicit DsRig(const DsScenario& s) {
    cache.emplace(gpu, s.cache);
    dec.emplace(gpu, DeepseekMlaConfig{s.heads, s.dims, 0.25f, 1e4f, s.rotate}, s.w_uk, s.w_uv, *cache);
    for (std::size_t i = 0; i < s.prefill.size(); ++i) ids.push_back(cache->add_sequence());
    dec->append_kv(seqs(s.tok), s.kv, s.kr, s.pos);
  }
  ~DsRig() {
    dec.reset();
    cache.reset();
  }
  std::vector<SeqId> seqs(const std::vector<SeqId>& idx) const {
    std::vector<SeqId> out;
    for (auto i : idx) out.push_back(ids[i]);
    return out;
  }
  void append(const DsScenario& s) { dec->append_kv(seqs(s.append_tok), s.append_kv, s.append_kr, s.append_pos); }
  DeepseekMlaDecoder::StepOutput step(const DsScenario& s) {
    std::vector<std::uint32_t> pos;
    for (SeqId id : ids) pos.push_back(cache->seq_len(id));
    return dec->step({ids, s.q_nope, s.q_rope, s.step_kv, s.step_kr, pos});
  }

  // Everything stored: sequences, lengths, tables, free blocks, and the bytes of every live row.
  struct State {
    std::vector<SeqId> seqs;
    std::vector<std::uint32_t> lens;
    std::vector<std::vector<std::int32_t>> tables;
    std::uint32_t free_blocks = 0;
    std::vector<std::vector<std::byte>> rows;
    bool operator==(const State&) const = default;
  };
  State state() {
    State st;
    st.seqs = cache->sequences();
    st.free_blocks = cache->free_blocks();
    const auto& c = cache->config();
    const std::uint64_t w = cache->row_width();
    for (SeqId id : st.seqs) {
      st.lens.push_back(cache->seq_len(id));
      const auto t = cache->block_table(id);
      st.tables.emplace_back(t.begin(), t.end());
      for (std::uint32_t j = 0; j < st.lens.back(); ++j) {
        const std::uint64_t b = static_cast<std::uint64_t>(t[j / c.block_size]), i = j % c.block_size;
        for (DevicePtr pool : {cache->k_pool(), cache->v_pool()}) {
          if (c.format == KvFormat::fp8) {
            st.rows.push_back(download<std::byte>(gpu, pool + (b * c.block_size + i) * cache->cache_stride(), w));
          } else {
            const DevicePtr blk = pool + b * cache->block_stride_bytes();
            st.rows.push_back(download<std::byte>(gpu, blk + i * w / 2, w / 2));
            st.rows.push_back(download<std::byte>(gpu, blk + cache->data_section_bytes() + i * w / 16, w / 16));
          }
        }
      }
    }
    return st;
  }
};

bool same(const DeepseekMlaDecoder::StepOutput& a, const DeepseekMlaDecoder::StepOutput& b) {
  return a.q_absorbed == b.q_absorbed && a.o_latent == b.o_latent && a.attn_out == b.attn_out;
}

// Sweep `op` (an append or a step) of the scenario: call N failing once or from N on, for every N.
// `done` checks an operation that completed (after the faults are cleared).
template <class Op, class Done>
void sweep_ds(const DsScenario& s, const char* what, Op op, Done done) {
  std::uint64_t n = 0;
  {
    DsRig twin(s);
    const auto before = twin.gpu.calls();
    op(twin);
    n = twin.gpu.calls() - before;
  }
  RC_ASSERT(n > 0u);
  for (const bool persistent : {false, true}) {
    auto rig = std::make_unique<DsRig>(s);
    for (std::uint64_t nth = 1; nth <= n; ++nth) {
      const std::string plan = fmt::format("{}, {}", what, plan_name(nth, n, persistent));
      const auto state = rig->state();
      const auto live = live_serials(rig->gpu);
      rig->gpu.inject_fault({std::nullopt, nth, persistent});
      bool completed = false;
      try {
        op(*rig);
        completed = true;
      } catch (const Error& e) {
        require_injected(e, "", plan);
      }
      rig->gpu.clear_faults();
      if (live_serials(rig->gpu) != live)
        RC_FAIL(fmt::format("{}: {} live allocations before, {} after", plan, live.size(),
                            live_serials(rig->gpu).size()));
      if (!completed) {
        if (!(rig->state() == state)) RC_FAIL(plan + ": the cache changed");
        continue;
      }
      // Only failed frees, which are ignored: the operation completed, with the clean result.
      done(*rig, plan);
      rig = std::make_unique<DsRig>(s);
    }
    op(*rig);
    done(*rig, std::string(what) + ": the retry after the sweep");
  }
}

void deepseek_append() {
  const DsScenario s = arb_ds();
  note_input(s.describe());
  const auto appended = [&] {
    DsRig twin(s);
    twin.append(s);
    return twin.state();
  }();
  sweep_ds(
      s, "append_kv", [&](DsRig& r) { r.append(s); },
      [&](DsRig& r, const std::string& plan) {
        if (!(r.state() == appended)) RC_FAIL(plan + ": the cache differs from the clean append's");
      });
}

void deepseek_step() {
  const DsScenario s = arb_ds();
  note_input(s.describe());
  const auto stepped = [&] {
    DsRig twin(s);
    return twin.step(s);
  }();
  std::optional<DeepseekMlaDecoder::StepOutput> out;
  sweep_ds(
      s, "step", [&](DsRig& r) { out = r.step(s); },
      [&](DsRig&, const std::string& plan) {
        if (!same(*out, stepped)) RC_FAIL(plan + ": the output differs from the clean step's");
      });
}

// ---- Kimi K3 ---------------------------------------------------------------------------------------------

enum class K3Path { host, device, decoder_host, decoder_device };

struct K3Rig {
  emu::EmulatorBackend gpu{emulator_options()};
  K3MlaDecodeKernels kernels = K3MlaDecodeKernels::resolve(gpu);
  MlaConfig cfg;
  K3Path path;
  MlaKv host;
  std::optional<MlaDeviceKv> device;
  std::optional<K3MlaDecoder> decoder;

  K3Rig(const MlaConfig& c, K3Path p, const std::vector<std::array<std::vector<float>, 3>>& history)
      : cfg(c), path(p) {
    if (p == K3Path::host || p == K3Path::device) {
      for (const auto& t : history) host.append(t[1], t[2]);
      if (p == K3Path::device) device.emplace(MlaDeviceKv::alloc_and_upload(gpu, host, history.size() + 1, c.k_row(), c.v_row()));
      return;
    }
    decoder.emplace(gpu, c, history.size() + 1, p == K3Path::decoder_host ? MlaKvPlacement::host : MlaKvPlacement::device);
    for (std::size_t i = 0; i < history.size(); ++i) {
      const auto& t = history[i];
      decoder->decode(t[0], t[1], t[2], c.mla_use_output_gate ? t[2] : std::vector<float>{}, static_cast<std::uint32_t>(i), 1e4f);
    }
  }
  ~K3Rig() {
    decoder.reset();
    device.reset();
  }
  std::vector<float> decode(std::vector<float>& q, std::vector<float>& k, const std::vector<float>& v,
                            const std::vector<float>& g, std::uint32_t pos) {
    switch (path) {
      case K3Path::host: return launch_k3_mla_decode_token(gpu, kernels, q, k, v, g, host, cfg, pos, 1e4f);
      case K3Path::device:
        return launch_k3_mla_decode_token_on_device(gpu, kernels, q, k, v, g, *device, cfg, pos, 1e4f);
      default: return decoder->decode(q, k, v, g, pos, 1e4f);
    }
  }
  MlaKv kv() const { return decoder ? decoder->history() : device ? device->download() : host; }
};

void k3() {
  const MlaConfig cfg = arb_k3_config();
  const auto path = *rc::gen::element(K3Path::host, K3Path::device, K3Path::decoder_host, K3Path::decoder_device);
  const auto len = *in_range<std::uint32_t>(0, 4);
  std::vector<std::array<std::vector<float>, 3>> history;
  for (std::uint32_t t = 0; t < len; ++t)
    history.push_back({arb_floats(cfg.k_row()), arb_floats(cfg.k_row()), arb_floats(cfg.v_row())});
  const auto q0 = arb_floats(cfg.k_row()), k0 = arb_floats(cfg.k_row()), v = arb_floats(cfg.v_row());
  const auto g = cfg.mla_use_output_gate ? arb_floats(cfg.v_row()) : std::vector<float>{};
  const bool on_device = path == K3Path::device || path == K3Path::decoder_device;
  note_input(fmt::format("heads {} nope {} rope {} v {} use_nope {} gate {}, {} path{}, history {}", cfg.heads,
                         cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.mla_use_nope,
                         cfg.mla_use_output_gate, on_device ? "device" : "host",
                         path >= K3Path::decoder_host ? " (K3MlaDecoder)" : "", len));
  std::uint64_t n = 0;
  std::vector<float> clean;
  {
    K3Rig twin(cfg, path, history);
    auto q = q0, k = k0;
    const auto before = twin.gpu.calls();
    clean = twin.decode(q, k, v, g, len);
    n = twin.gpu.calls() - before;
  }
  const std::string context = fmt::format("k3 mla decode ({} KV) at position {}", on_device ? "device" : "host", len);
  for (const bool persistent : {false, true}) {
    for (std::uint64_t nth = 1; nth <= n; ++nth) {
      const std::string what = plan_name(nth, n, persistent);
      K3Rig rig(cfg, path, history);
      const MlaKv before = rig.kv();
      const auto live = live_serials(rig.gpu);
      auto q = q0, k = k0;
      rig.gpu.inject_fault({std::nullopt, nth, persistent});
      std::optional<std::vector<float>> out;
      try {
        out = rig.decode(q, k, v, g, len);
      } catch (const Error& e) {
        require_injected(e, context, what);
      }
      rig.gpu.clear_faults();
      if (live_serials(rig.gpu) != live) RC_FAIL(fmt::format("{}: a temporary leaked", what));
      if (out) {
        if (*out != clean) RC_FAIL(fmt::format("{}: completed with another result", what));
        continue;
      }
      if (!(rig.kv() == before)) RC_FAIL(fmt::format("{}: the KV changed", what));
      if (q != q0 || k != k0) RC_FAIL(fmt::format("{}: the caller's q or k changed", what));
      if (rig.decode(q, k, v, g, len) != clean) RC_FAIL(fmt::format("{}: the retry differs from the clean run", what));
    }
  }
}

// MlaDeviceKv's own operations: alloc and alloc_and_upload free what they allocated; an append that
// fails leaves seq_len and the rows as they were.
void device_kv() {
  const MlaConfig cfg = arb_k3_config();
  const auto len = *in_range<std::uint32_t>(0, 4);
  const auto cap = len + *in_range<std::uint32_t>(1, 3);
  MlaKv host;
  for (std::uint32_t t = 0; t < len; ++t) host.append(arb_floats(cfg.k_row()), arb_floats(cfg.v_row()));
  const auto k_new = arb_floats(cfg.k_row()), v_new = arb_floats(cfg.v_row());
  const bool upload = *rc::gen::arbitrary<bool>();
  note_input(fmt::format("k_row {} v_row {} history {} cap {} {}", cfg.k_row(), cfg.v_row(), len, cap,
                         upload ? "alloc_and_upload" : "alloc"));
  auto make = [&](GpuBackend& gpu) {
    return upload ? MlaDeviceKv::alloc_and_upload(gpu, host, cap, cfg.k_row(), cfg.v_row())
                  : MlaDeviceKv::alloc(gpu, cap, cfg.k_row(), cfg.v_row());
  };
  std::uint64_t n = 0;
  {
    emu::EmulatorBackend gpu(emulator_options());
    const auto kv = make(gpu);
    n = gpu.calls();  // before the KV's own frees
  }
  for (const bool persistent : {false, true})
    for (std::uint64_t nth = 1; nth <= n; ++nth) {
      emu::EmulatorBackend gpu(emulator_options());
      gpu.inject_fault({std::nullopt, nth, persistent});
      try {
        make(gpu);
        RC_FAIL(plan_name(nth, n, persistent) + ": no error");
      } catch (const Error& e) {
        require_injected(e, "k3 mla: ", plan_name(nth, n, persistent));
      }
      gpu.clear_faults();
      if (!gpu.live_allocations().empty()) RC_FAIL(plan_name(nth, n, persistent) + ": an allocation leaked");
    }
  // append_from_device: a copy_d2d and a copy_h2d.
  emu::EmulatorBackend gpu(emulator_options());
  auto kv = MlaDeviceKv::alloc_and_upload(gpu, host, cap, cfg.k_row(), cfg.v_row());
  const auto row = DeviceBuffer::from_host<float>(gpu, k_new);
  for (const bool persistent : {false, true})
    for (std::uint64_t nth = 1; nth <= 2; ++nth) {
      gpu.inject_fault({std::nullopt, nth, persistent});
      bool threw = false;
      try {
        kv.append_from_device(row.ptr(), v_new);
      } catch (const Error& e) {
        threw = true;
        require_injected(e, "", plan_name(nth, 2, persistent));
      }
      gpu.clear_faults();
      RC_ASSERT(threw);
      RC_ASSERT(kv.seq_len() == len);
      RC_ASSERT(kv.download() == host);
    }
}

// ---- the split-path dispatcher ----------------------------------------------------------------------------

void split_dispatcher() {
  const auto format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  const KernelCase c = gen::split_path_case(arb_split_spec(format));
  const bool reuse = *rc::gen::arbitrary<bool>();  // a workspace grown by an earlier clean call, or a fresh one
  note_input(c.name + (reuse ? " (workspace reused)" : " (fresh workspace)"), {c});
  emu::EmulatorBackend gpu(emulator_options());
  const auto seed = MlaAbsorbedKernels::resolve(gpu);
  const auto fast = MlaFastKernels::resolve(gpu);
  std::map<std::string, DeviceBuffer> bufs;
  for (const auto& [name, t] : c.inputs) bufs.emplace(name, DeviceBuffer::from_host<std::byte>(gpu, t.data));
  auto ptr = [&](const char* n) { return bufs.count(n) != 0 ? bufs.at(n).ptr() : DevicePtr{}; };
  auto u32 = [&](const char* n) { return c.scalars.at(n).as_u32(); };
  const PagedDecodeCommon common{ptr("q"),          ptr("k_cache"),      ptr("v_cache"),
                                 ptr("o"),          ptr("block_tables"), ptr("seq_lens"),
                                 u32("max_blocks_per_seq"), u32("num_q_heads"), u32("num_kv_heads"),
                                 u32("q_head_dim"), u32("kv_cache_dim"), u32("block_size"),
                                 c.scalars.at("inv_sqrt_d").as_f32(), u32("num_seqs")};
  const Tensor& poison = c.inputs.at("o");
  std::optional<DecodeWorkspace> ws;
  auto dispatch = [&] {
    upload<std::byte>(gpu, poison.data, ptr("o"));  // every attempt starts from a poisoned o
    if (!reuse) ws.emplace();
    if (format == KvFormat::fp8) {
      paged_decode_fp8(gpu, seed, fast,
                       {common, c.scalars.at("k_scale").as_f32(), c.scalars.at("v_scale").as_f32(),
                        c.scalars.at("cache_stride").as_u64(), u32("sliding_window"), ptr("sinks"), ptr("comp_pool"),
                        u32("comp_block_count")},
                       *ws);
    } else {
      paged_decode_nvfp4(
          gpu, seed, fast,
          {common, c.scalars.at("block_stride_bytes").as_u64(), c.scalars.at("data_section_bytes").as_u64()}, *ws);
    }
    gpu.synchronize(0);
    return bufs.at("o").to_host<std::byte>();
  };
  ws.emplace();
  const auto clean = dispatch();  // with reuse, this grows the workspace the sweep then reuses
  const auto inputs = live_serials(gpu);
  std::uint64_t n = 0;
  {
    const auto before = gpu.calls();
    dispatch();
    n = gpu.calls() - before;
  }
  for (const bool persistent : {false, true})
    for (std::uint64_t nth = 1; nth <= n; ++nth) {
      const std::string what = plan_name(nth, n, persistent);
      gpu.inject_fault({std::nullopt, nth, persistent});
      std::optional<std::vector<std::byte>> out;
      try {
        out = dispatch();
      } catch (const Error& e) {
        require_injected(e, "", what);
      }
      gpu.clear_faults();
      // Only a failed free (the replaced workspace's) can go unreported: then the result is the clean one.
      if (out && *out != clean) RC_FAIL(what + ": completed with another result");
      // Nothing beyond the inputs and the workspace's one buffer.
      std::size_t extra = 0;
      for (auto s : live_serials(gpu)) extra += inputs.count(s) == 0 ? 1 : 0;
      if (extra > 1) RC_FAIL(fmt::format("{}: {} allocations beyond the inputs and the workspace", what, extra));
      if (dispatch() != clean) RC_FAIL(what + ": the retry differs from the clean run");
    }
  ws.reset();
  // The inputs are as they were (o aside) and nothing else is live.
  for (const auto& [name, t] : c.inputs)
    if (name != "o" && bufs.at(name).to_host<std::byte>() != t.data) RC_FAIL("input " + name + " changed");
  bufs.clear();
  RC_ASSERT(gpu.live_allocations().empty());
}

}  // namespace

std::vector<Property> faults_properties() {
  return {{"a DeepSeek decode step failing at any backend call leaves the paged cache as it was", deepseek_step},
          {"a DeepSeek append_kv failing at any backend call leaves the paged cache as it was", deepseek_append},
          {"a K3 decode failing at any backend call leaves the KV, the caller's q and k and memory as they were", k3},
          {"MlaDeviceKv alloc, upload and append failing at any backend call leave nothing behind", device_kv},
          {"the split-path dispatcher failing at any backend call leaks nothing and retries exactly", split_dispatcher}};
}

}  // namespace metrale::props
