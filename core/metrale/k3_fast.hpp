// The fast path of the Kimi K3 SDPA, module `k3_fast` (issue 6): the keys of each head cut into
// chunks, one warp per chunk (k3_mla_sdpa_split_f32), and a log-sum-exp combine that normalises
// and applies the output gate (k3_mla_sdpa_combine_f32); plus the dispatcher the K3 decode uses,
// which takes the fast path when it applies and the seed kernel k3_mla_sdpa_gate_f32 (module
// `mla_decode`) otherwise. Same semantics as the seed kernel (SPEC §4).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "metrale/backend.hpp"
#include "metrale/dispatch.hpp"
#include "metrale/mla_decode.hpp"

namespace metrale {

inline constexpr const char* kK3FastModule = "k3_fast";

/// Chunks (warps) per split block, and the most chunks per head the combine takes.
inline constexpr std::uint32_t kK3ChunkWarps = 4, kK3MaxChunks = 4096;
/// The largest dq and dv the split kernel holds in registers (8 values per lane).
inline constexpr std::uint32_t kK3SplitMaxDim = 256;

/// How a split SDPA divides its work: `num_chunks` chunks (a multiple of 4) of `keys_per_chunk`
/// keys per head; the workspace holds o_partial [num_chunks, heads, dv] f32, then ml_partial
/// [num_chunks, heads, 2] f32 at `ml_offset` bytes.
struct K3SplitPlan {
  std::uint32_t num_chunks = 0, keys_per_chunk = 0;
  std::uint64_t workspace_bytes = 0, ml_offset = 0;
};

/// Plan a split SDPA of `seq_len` keys over `heads` heads of `dv` output dims on a device of
/// `multiprocessors` SMs: up to 32 warps per SM over all heads in whole blocks of four chunks
/// (each SM holds 16 of the split kernel's warps at once: two full rounds, never a third of a few
/// blocks), no chunk under 32 keys, at most kK3MaxChunks chunks, chunks a multiple of four keys
/// (a warp's step). seq_len 0 gives one block of empty chunks. Errors (`invalid_argument`): heads
/// 0, or seq_len above 2^31 − 1 (the split kernel's limit).
K3SplitPlan plan_k3_sdpa_split(std::uint32_t seq_len, std::uint32_t heads, std::uint32_t dv,
                               std::uint32_t multiprocessors);

/// Why the split path cannot take `a` (seq_len above 2^31 − 1, dq or dv above 256, more than
/// 65535 heads), or nothing.
std::optional<std::string> k3_split_unsupported(const K3SdpaArgs& a);

/// The raw split kernel's arguments.
struct K3SdpaSplitArgs {
  DevicePtr q;           // [heads, dq] f32
  DevicePtr k;           // [seq_len, heads, dq] f32 (may be null when seq_len is 0)
  DevicePtr v;           // [seq_len, heads, dv] f32 (may be null when seq_len is 0)
  DevicePtr o_partial;   // [num_chunks, heads, dv] f32, written
  DevicePtr ml_partial;  // [num_chunks, heads, 2] f32 (running max, sum), written
  std::uint32_t seq_len = 0, heads = 0, dq = 0, dv = 0, keys_per_chunk = 0, num_chunks = 0;
};
/// k3_mla_sdpa_split_f32: grid [num_chunks/4, heads], block 128; chunk c (warp c mod 4 of block
/// c/4) attends keys [c·keys_per_chunk, (c+1)·keys_per_chunk) ∩ [0, seq_len) and writes its
/// unnormalised output and (max, sum). Launched early (programmatic dependent launch on sm_90
/// and later): it waits for the kernel ahead of it before it touches memory.
/// Errors (`invalid_argument`, naming the value): a null q, o_partial or ml_partial, or a null
/// k or v with seq_len > 0; heads, dq, dv or keys_per_chunk 0; dq or dv above 256; seq_len above
/// 2^31 − 1 (a warp's 32-bit key steps would wrap); num_chunks
/// not a positive multiple of 4 up to 4096; num_chunks × keys_per_chunk short of seq_len (keys
/// would be dropped); heads above 65535 (the grid's y); o_partial or ml_partial sharing a byte
/// with q, k, v or each other; `kernel` not k3_mla_sdpa_split_f32.
void k3_mla_sdpa_split_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaSplitArgs& a, Stream stream = 0);

/// The combine kernel's arguments.
struct K3SdpaCombineArgs {
  DevicePtr o_partial, ml_partial;  // as written by the split kernel
  DevicePtr g;                      // [heads, dv] f32 gate logits (may be null without the gate)
  DevicePtr out;                    // [heads, dv] f32
  std::uint32_t heads = 0, dv = 0, num_chunks = 0;
  bool use_gate = false;
};
/// k3_mla_sdpa_combine_f32: out[h] = Σ_c e^(m_c − M)·O_c / Σ_c e^(m_c − M)·l_c over the chunks
/// with keys (M their largest m_c; none: zeros), × sigmoid(g[h]) elementwise when use_gate.
/// Grid [heads, ⌈dv/32⌉] (a block per 32 dims of a head), block 256; launched early, it waits
/// for the split kernel before it reads the partials. Errors (`invalid_argument`): a null
/// o_partial, ml_partial or out, or a null g with use_gate; heads or dv 0; heads past 2^31 − 1;
/// dv past 65535 × 32 (the grid's y); num_chunks not a positive multiple of 4 up to 4096; out
/// sharing a byte with o_partial, ml_partial or (with the gate) g; `kernel` not
/// k3_mla_sdpa_combine_f32.
void k3_mla_sdpa_combine_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaCombineArgs& a, Stream stream = 0);

/// The K3 SDPA: the split path (split + combine, its workspace from `ws`) when
/// k3_split_unsupported is empty, else the seed kernel. Errors: the seed launcher's checks (for
/// both paths), then the launchers'.
DecodePath k3_sdpa(GpuBackend& gpu, const K3MlaDecodeKernels& kernels, const K3SdpaArgs& a, DecodeWorkspace& ws,
                   Stream stream = 0);

}  // namespace metrale
