// Pieces several ports share, each the host twin of kernels/device_common.cuh.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace metrale::emu {

inline constexpr std::uint32_t kWarp = 32;

/// The butterfly sum of a segment of `width` lanes (a power of two; __shfl_xor_sync with offsets
/// width/2..1), lane for lane in the kernels' order, so that the FP32 sums agree; `v[i]` is the
/// segment's lane i.
inline float segment_sum(std::array<float, kWarp> v, std::uint32_t width) {
  for (std::uint32_t off = width / 2; off > 0; off /= 2) {
    std::array<float, kWarp> next{};
    for (std::uint32_t lane = 0; lane < width; ++lane) next[lane] = v[lane] + v[lane ^ off];
    v = next;
  }
  return v[0];
}

/// The warp's butterfly sum (offsets 16..1).
inline float warp_sum(const std::array<float, kWarp>& v) { return segment_sum(v, kWarp); }

/// e^(x − m) for x ≤ m, 1 where x = m, infinities included (exp_below in kernels/device_common.cuh:
/// a +inf sink takes the whole denominator, o = 0; a rescale from −inf to −inf is 1, not NaN).
inline float exp_below(float x, float m) { return x == m ? 1.0f : std::exp(x - m); }

/// The keys a paged decode attends for one sequence (SPEC §3): `comp` compressed entries first,
/// then the window [start, L) of the sequence, L = seq_len clamped to [0, max_blocks·block_size],
/// start = L − W when 0 < W < L.
struct KeySet {
  std::uint32_t comp = 0, start = 0, count = 0;
};

inline KeySet key_set(std::int32_t seq_len, std::uint32_t max_blocks_per_seq, std::uint32_t block_size,
                      std::uint32_t sliding_window, std::uint32_t comp) {
  const std::uint64_t cap = std::uint64_t{max_blocks_per_seq} * block_size;
  const auto len = static_cast<std::uint32_t>(std::min<std::uint64_t>(std::max(seq_len, 0), cap));
  const std::uint32_t start = sliding_window > 0 && len > sliding_window ? len - sliding_window : 0;
  return {comp, start, comp + (len - start)};
}

/// How a port names a block-table entry that sends a key outside the pool it reads (SPEC §3: the
/// columns a sequence attends must hold blocks of the cache), for Global::require_in_bounds: the
/// entry, the key, and the bytes it checked, [first, end) from the pool's start with the launch's
/// strides — `span` says which: FP8's "row", NVFP4's "block through its scales". Either the entry
/// is not a block of the cache, or the strides, block size and pool size disagree.
inline std::string bad_block_entry(std::uint32_t s, std::uint32_t column, std::int32_t entry, const char* pool,
                                   std::uint32_t key, const char* span, std::int64_t first, std::int64_t end) {
  return fmt::format(
      "block_tables[{}][{}] = {} puts key {} outside {}: its {} would be bytes [{}, {}) of it (the entry is not a "
      "block of the cache, or the strides, block size and pool size disagree)",
      s, column, entry, key, pool, span, first, end);
}

}  // namespace metrale::emu
