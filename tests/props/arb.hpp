// Generated inputs shared by the property families: each function draws with `*rc::gen::...`,
// so it may only be called while a property runs (under rc::prop or a fuzz driver). The kernel
// cases themselves come from core's generators (metrale/case_gen.hpp); these pick their shapes.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "metrale/case_gen.hpp"
#include "metrale/kernel_case.hpp"
#include "metrale/mla_decode.hpp"

namespace metrale {
/// For RapidCheck's counterexamples.
inline std::ostream& operator<<(std::ostream& os, KvFormat f) { return os << to_string(f); }
}  // namespace metrale

namespace metrale::props {

/// rc::gen::inRange(lo, hi) — [lo, hi) — drawn over the whole range whatever RapidCheck's size:
/// no case needs to start small, the emulator is fast enough; a failure still shrinks towards lo.
template <class T>
rc::Gen<T> in_range(T lo, T hi) {
  return rc::gen::resize(100, rc::gen::inRange<T>(lo, hi));
}

/// A float in [lo, hi] that is not a power of two (scales whose rounding shows).
float arb_scale(float lo, float hi);

/// A paged-decode batch for the seed kernels (SPEC §3): either format; block_size 1..512
/// (small ones and the powers of two with their neighbours); seq_lens drawn from 0, 1,
/// block_size − 1, block_size, block_size + 1, multiples, the table's maximum, past it and
/// negative; tables one to a few blocks wider than needed, over a shuffled pool with spare
/// blocks; unused columns −1, INT32_MAX, INT32_MIN or garbage; 1..3 KV heads with 1..4 q heads
/// each; q_head_dim ≤ kv_cache_dim. FP8: scales that are not powers of two, padded row pitch,
/// windows covering none, some or all keys, sinks, compressed pools of 0..4 entries (and a
/// count without a pool). NVFP4: random group scales and every n-th group all zero.
gen::PagedSpec arb_paged_spec(KvFormat format);
/// As arb_paged_spec, restricted to what the split path of mla_fast takes (one KV head,
/// q_head_dim a multiple of 32, kv_cache_dim 64 or 128, a 16-byte row pitch).
gen::PagedSpec arb_split_spec(KvFormat format);

/// A small K3 attention shape: 1..4 heads, nope and rope 0..7 (not both 0; odd rope included),
/// v_head_dim 1..7, NoPE and the gate on or off.
MlaConfig arb_k3_config();

/// A valid case of the launcher `entry` of module `module` (one of launchable_kernels()) over
/// small random shapes, its outputs poisoned and expected from the float64 reference.
KernelCase arb_kernel_case(const std::string& module, const std::string& entry);

/// `n` uniform floats in [-1, 1] from one drawn seed.
std::vector<float> arb_floats(std::size_t n);

}  // namespace metrale::props
