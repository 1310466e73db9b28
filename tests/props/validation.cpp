// Launcher validation (issue 5; STYLE §4 "every rule has a test") as properties: from valid
// random arguments, break one rule at a time with a random bad value; the launcher must refuse
// with the rule's error code and a message naming the kernel and the bad value, before any
// backend call (the emulator's call counters do not move, nothing is allocated or launched).
// The decode entry points' size checks likewise.
#include <rapidcheck.h>

#include <cmath>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arb.hpp"
#include "launchers.hpp"
#include "metrale/buffer.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/mla_decode.hpp"
#include "metrale/mla_fast.hpp"  // entry_unavailable
#include "props.hpp"

namespace metrale::props {

namespace {

// `body` must throw Error with `code` and every needle, and leave the backend untouched.
template <class F>
void require_refused(emu::EmulatorBackend& gpu, const std::string& what, Errc code,
                     const std::vector<std::string>& needles, F&& body) {
  const auto calls = gpu.calls();
  const auto live = live_serials(gpu);
  try {
    body();
  } catch (const Error& e) {
    if (e.code() != code)
      RC_FAIL(fmt::format("{}: error code {}, expected {}: {}", what, to_string(e.code()), to_string(code), e.what()));
    for (const auto& n : needles)
      if (std::string(e.what()).find(n) == std::string::npos)
        RC_FAIL(fmt::format("{}: message \"{}\" does not contain \"{}\"", what, e.what(), n));
    if (gpu.calls() != calls)
      RC_FAIL(fmt::format("{}: refused after {} backend calls", what, gpu.calls() - calls));
    RC_ASSERT(live_serials(gpu) == live);
    return;
  }
  RC_FAIL(fmt::format("{}: accepted ({} backend calls)", what, gpu.calls() - calls));
}

void every_rule() {
  emu::EmulatorBackend gpu(emulator_options());
  gpu.set_dry_run(true);  // a launch that passes is checked and counted, never run
  std::string inputs;
  for (const auto& l : launchers()) {
    // an entry the device played cannot run (METRALE_EMU_COMPUTE_CAPABILITY=121, a small
    // METRALE_EMU_SHARED_BYTES): its launcher refuses every launch, so it has no valid set here
    if (entry_unavailable(gpu, l.module, l.entry)) continue;
    const KernelHandle k = gpu.kernel(l.module, l.entry);
    auto args = l.arb();
    if (args->expected().shared_bytes > gpu.max_shared_bytes_per_block()) continue;  // (the same, for these arguments)
    const auto launches = gpu.calls(emu::Op::launch);
    try {
      args->launch(gpu, k);  // the valid set, boundaries included, is accepted
    } catch (const Error& e) {
      RC_FAIL(fmt::format("{}: valid arguments refused: {}; {}", l.entry, e.what(), describe(args->expected())));
    }
    RC_ASSERT(gpu.calls(emu::Op::launch) == launches + 1);
    const std::string valid = describe(args->expected());
    const auto rule = *in_range<std::size_t>(0, args->rules());
    const BrokenRule broken = args->break_rule(rule);  // the launch shape may now be undefined (a zero divisor)
    inputs += fmt::format("{} broken by {} (message: {})\n", valid, broken.rule, fmt::join(broken.needles, " ... "));
    note_input(inputs);
    require_refused(gpu, fmt::format("{} with {}", l.entry, broken.rule), broken.code, broken.needles,
                    [&] { args->launch(gpu, k); });
  }
}

// A length other than `n`: one off either way, zero, or random.
std::size_t wrong_size(std::size_t n) {
  switch (*in_range(0, 4)) {
    case 0: return n + 1;
    case 1: return n == 0 ? 1 : n - 1;
    case 2: return n == 0 ? 2 : 0;
    default: {
      const auto m = *in_range<std::size_t>(0, 3 * n + 3);
      return m == n ? n + 2 : m;
    }
  }
}

void k3_sizes() {
  const MlaConfig cfg = arb_k3_config();
  emu::EmulatorBackend gpu(emulator_options());
  const auto kernels = K3MlaDecodeKernels::resolve(gpu);
  const std::size_t kr = cfg.k_row(), vr = cfg.v_row();
  std::size_t n[4] = {kr, kr, vr, cfg.mla_use_output_gate ? vr : 0};
  const char* names[4] = {"q", "k", "v", "g"};
  const auto which = *in_range(0, 4);
  n[which] = wrong_size(n[which]);
  // Without the gate g may be empty or of the gate's size; anything else is refused.
  if (which == 3 && !cfg.mla_use_output_gate && (n[3] == 0 || n[3] == vr)) n[3] = vr + 1;
  std::vector<float> q(n[0]), k(n[1]), v(n[2]), g(n[3]);
  const std::string what = fmt::format("{} of {} values, config heads {} qk {} v {} gate {}", names[which], n[which],
                                       cfg.heads, cfg.qk_head_dim(), cfg.v_head_dim, cfg.mla_use_output_gate);
  note_input(what);
  const std::vector<std::string> needles{fmt::format("k3 mla: {} has {} values", names[which], n[which])};
  MlaKv host;
  require_refused(gpu, "host path: " + what, Errc::invalid_argument, needles,
                  [&] { launch_k3_mla_decode_token(gpu, kernels, q, k, v, g, host, cfg, 0, 1e4f); });
  RC_ASSERT(host.seq_len == 0u);
  auto kv = MlaDeviceKv::alloc(gpu, 2, kr, vr);
  require_refused(gpu, "device path: " + what, Errc::invalid_argument, needles,
                  [&] { launch_k3_mla_decode_token_on_device(gpu, kernels, q, k, v, g, kv, cfg, 0, 1e4f); });
  RC_ASSERT(kv.seq_len() == 0u);
}

void deepseek_sizes() {
  emu::EmulatorBackend gpu(emulator_options());
  MlaDims dims{16 * *in_range<std::uint32_t>(1, 3) - 8, 8, *in_range<std::uint32_t>(1, 9),
               *in_range<std::uint32_t>(1, 9)};
  const std::uint32_t heads = *in_range<std::uint32_t>(1, 4);
  PagedCacheConfig cc;
  cc.num_blocks = 8, cc.block_size = 2, cc.kv_cache_dim = dims.cache_dim();
  {
    PagedKvCache cache(gpu, cc);
    const std::vector<Bf16> w_uk(std::size_t{heads} * dims.nope * dims.kv_lora), w_uv(std::size_t{heads} *
                                                                                       dims.v_head * dims.kv_lora);
    DeepseekMlaDecoder dec(gpu, {heads, dims, 0.125f, 1e4f, true}, w_uk, w_uv, cache);
    const auto S = *in_range<std::size_t>(1, 4);
    std::vector<SeqId> seqs;
    for (std::size_t s = 0; s < S; ++s) seqs.push_back(cache.add_sequence());
    std::size_t n[5] = {S * heads * dims.nope, S * heads * dims.rope, S * dims.kv_lora, S * dims.rope, S};
    const char* names[5] = {"q_nope", "q_rope", "kv_latent", "k_rope", "positions"};
    const auto which = *in_range(0, 5);
    n[which] = wrong_size(n[which]);
    std::vector<float> q_nope(n[0]), q_rope(n[1]), kv(n[2]), kr(n[3]);
    std::vector<std::uint32_t> pos(n[4]);
    const std::string what = fmt::format("{} of {} values, {} sequences, heads {}", names[which], n[which], S, heads);
    note_input(what);
    require_refused(gpu, what, Errc::invalid_argument, {fmt::format("deepseek mla: {} has {} values", names[which],
                                                                    n[which])},
                    [&] { dec.step({seqs, q_nope, q_rope, kv, kr, pos}); });
    for (SeqId s : seqs) RC_ASSERT(cache.seq_len(s) == 0u);
  }
  RC_ASSERT(gpu.live_allocations().empty());
}

}  // namespace

std::vector<Property> validation_properties() {
  return {{"every launcher validation rule refuses its bad value before any backend call", every_rule},
          {"the K3 decode paths refuse q, k, v or g of the wrong size before any backend call", k3_sizes},
          {"the DeepSeek decode step refuses inputs of the wrong size before any backend call", deepseek_sizes}};
}

}  // namespace metrale::props
