// Pieces several kernels share, each the device twin of emu/port_common.hpp.
#pragma once

#include <cstdint>

namespace metrale {

constexpr uint32_t kWarp = 32;

// Programmatic dependent launch (sm_90 and later; GpuBackend::launch's `early_start`). A kernel
// launched early waits here for the kernel ahead of it on the stream to finish (its writes
// visible) before touching what that kernel writes; launched as usual, or before sm_90, it
// returns at once. No port: the emulator runs each launch after the one before has ended.
__device__ inline void wait_for_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the kernel behind this one on the stream, launched early, start its blocks now.
__device__ inline void allow_next_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The butterfly sum the ports reproduce lane for lane; every lane ends with the total.
__device__ inline float warp_sum(float v) {
  for (uint32_t off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  return v;
}

// The same over segments of `width` lanes (a power of two): lanes 0..width−1, width..2·width−1, …
// each end with their segment's total.
__device__ inline float segment_sum(float v, uint32_t width) {
  for (uint32_t off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  return v;
}

// e^(x − m) for x ≤ m a running maximum, and 1 where x = m, infinities included (finite values give
// e^0 = 1 there anyway): a sink's term of the denominator (SPEC §3: a +inf sink, where the formula's
// inf − inf is NaN, then takes the whole denominator and o = 0, its limit) and a rescale from −inf
// to −inf (no keys and a −inf sink: 1, not NaN).
__device__ inline float exp_below(float x, float m) { return x == m ? 1.0f : expf(x - m); }

__device__ inline float warp_max(float v) {
  for (uint32_t off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  return v;
}

// The keys a paged decode attends for one sequence (SPEC §3): `comp` compressed entries first,
// then the window [start, L), L = seq_len clamped to [0, max_blocks·block_size], start = L − W
// when 0 < W < L.
struct KeySet {
  uint32_t comp, start, count;
};

__device__ inline KeySet key_set(int32_t seq_len, uint32_t max_blocks_per_seq, uint32_t block_size,
                                 uint32_t sliding_window, uint32_t comp) {
  const uint64_t cap = uint64_t{max_blocks_per_seq} * block_size;
  const uint32_t len = static_cast<uint32_t>(min(static_cast<uint64_t>(max(seq_len, 0)), cap));
  const uint32_t start = sliding_window > 0 && len > sliding_window ? len - sliding_window : 0;
  return {comp, start, comp + (len - start)};
}

}  // namespace metrale
