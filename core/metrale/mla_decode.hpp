// Kimi K3 MLA decode, module `mla_decode` (SPEC §4; seed 002 `mla_cuda.rs`).
// FP32 throughout. Per head h, one decode token computes
//
//   q, k_new ─k3_mla_maybe_rope_f32─► rotated (unless NoPE) ─► K history gains k_new, V history gains v
//   out[h] = softmax(q[h]·K[:, h]ᵀ / √qk_head_dim) · V[:, h]  (× sigmoid(g[h]) with the output gate)
//                                     ─k3_sdpa─► the split path (module k3_fast) or the seed's
//                                                k3_mla_sdpa_gate_f32
//
// Two KV placements: a host `MlaKv` (the history is uploaded for every token)
// and a device-resident `MlaDeviceKv` (one row appended per token, attention
// reads it in place). `K3MlaDecoder` picks the device one unless K3_CUDA_MLA=0.
//
// Invariants (SPEC §4), each held by construction:
// - every temporary device buffer is a `DeviceBuffer`, freed by its destructor
//   on success and on every error; a failed free is ignored;
// - `MlaDeviceKv::alloc` / `alloc_and_upload` build the object from owned
//   buffers, so a failure frees whatever was allocated;
// - a decode that fails leaves the KV as it was (same length, same rows): the
//   append is rolled back by a guard unless the decode completes;
// - a full `MlaDeviceKv` rejects the append with `capacity_exceeded` before any
//   backend call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"

namespace metrale {

inline constexpr const char* kMlaDecodeModule = "mla_decode";

/// The attention shape of one Kimi K3 MLA layer (seed 002 `MlaConfig`).
struct MlaConfig {
  std::uint32_t heads = 0;
  std::uint32_t qk_nope_head_dim = 0;
  std::uint32_t qk_rope_head_dim = 0;
  std::uint32_t v_head_dim = 0;
  bool mla_use_nope = false;         // true: no rotation anywhere (NoPE)
  bool mla_use_output_gate = false;  // true: out *= sigmoid(g)

  /// nope + rope: the width of one head's q and k, and the √ of the softmax scale's denominator.
  std::uint32_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// heads × qk_head_dim and heads × v_head_dim: one token's K and V row, in floats.
  std::size_t k_row() const { return std::size_t{heads} * qk_head_dim(); }
  std::size_t v_row() const { return std::size_t{heads} * v_head_dim; }
};

/// Errors (`invalid_argument`, prefixed "k3 mla:"): heads 0; qk_head_dim 0
/// ("dq must be > 0"); v_head_dim 0; nope + rope past 2^32 − 1; an odd qk_rope_head_dim unless
/// mla_use_nope (the rotation turns pairs (2i, 2i+1): SPEC §4, `k3_mla_maybe_rope_f32`).
void validate(const MlaConfig& cfg);

/// One sequence's K and V history on the host (seed 002 `MlaKv`).
struct MlaKv {
  std::size_t seq_len = 0;
  std::vector<float> k;  // [seq_len, heads * qk_head_dim] f32
  std::vector<float> v;  // [seq_len, heads * v_head_dim] f32

  /// Append one token's rows. Errors (`invalid_argument`, the KV unchanged):
  /// an empty row; rows whose widths disagree with the history's
  /// (k.size() != seq_len × k_row.size(), likewise for v).
  void append(std::span<const float> k_row, std::span<const float> v_row);
  /// Keep the first `len` tokens. Errors (`invalid_argument`, the KV unchanged):
  /// len > seq_len; k or v not a whole number of seq_len rows.
  void truncate(std::size_t len);
  bool operator==(const MlaKv&) const = default;
};

/// The CPU reference of one decode token (seed 002's host `mla_decode_token`),
/// independent of the kernels: unless cfg.mla_use_nope, rotate dims [nope,
/// nope + rope) of each head of `q` and `k` in place (pairs (2i, 2i+1), angle =
/// pos · theta^(−2i/rope), an odd last dim unrotated); append (k, v) to `kv`;
/// return out [heads, v_head_dim] = softmax over the history of q·k / √qk_head_dim
/// times V, times sigmoid(g) when cfg.mla_use_output_gate. Float64 arithmetic,
/// FP32 storage. q, k [heads, qk_head_dim]; v, g [heads, v_head_dim] (g may be
/// empty without the gate). Errors: as `launch_k3_mla_decode_token`'s checks
/// of its inputs (when rotating: theta not finite or ≤ 0, a position past 2^24), all made
/// before q and k are rotated, so on error q, k and `kv` are unchanged.
std::vector<float> mla_decode_token(std::span<float> q, std::span<float> k, std::span<const float> v,
                                    std::span<const float> g, MlaKv& kv, const MlaConfig& cfg, std::uint32_t pos,
                                    float theta);

// ---- launchers ----------------------------------------------------------------

/// Handles of both kernels of the module, looked up once.
struct K3MlaDecodeKernels {
  KernelHandle rope, sdpa;            // module mla_decode (the seed's)
  KernelHandle sdpa_split, sdpa_combine;  // module k3_fast (the split path, core/metrale/k3_fast.hpp)
  /// Errors: `not_found` naming the module and the missing entry.
  static K3MlaDecodeKernels resolve(GpuBackend& gpu);
};

/// Unless use_nope, rotate dims [nope, nope + rope) of each head's q and k_new
/// row in place: pairs (2i, 2i+1) for i < rope/2, a' = a cos − b sin,
/// b' = b cos + a sin, angle = pos · theta^(−2i/rope), FP32 math (SPEC §4).
struct K3RopeArgs {
  DevicePtr q;      // [heads, nope + rope] f32, in place
  DevicePtr k_new;  // [heads, nope + rope] f32, in place
  std::uint32_t heads = 0, nope = 0, rope = 0, pos = 0;
  float theta = 10000.0f;
  bool use_nope = false;
};
/// Grid ⌈heads/128⌉, block 128 (one thread per head). Errors
/// (`invalid_argument`): null q or k_new; heads 0; nope + rope past 2^32 − 1;
/// when rotating: an odd rope (its last dim would have no partner), theta not finite or ≤ 0 (or
/// so small that an angle overflows FP32), pos past 2^24 (FP32 holds no larger position
/// exactly), or q and k_new sharing a byte.
void k3_mla_maybe_rope_f32(GpuBackend& gpu, KernelHandle kernel, const K3RopeArgs& a, Stream stream = 0);

/// out[h, :] = Σ_j softmax_j(q[h]·k[j, h] / √dq) · v[j, h, :], times sigmoid(g[h, :])
/// elementwise when use_gate; seq_len 0 writes zeros.
struct K3SdpaArgs {
  DevicePtr q;    // [heads, dq] f32
  DevicePtr k;    // [seq_len, heads, dq] f32 (may be null when seq_len is 0)
  DevicePtr v;    // [seq_len, heads, dv] f32 (may be null when seq_len is 0)
  DevicePtr g;    // [heads, dv] f32 gate logits (may be null without the gate)
  DevicePtr out;  // [heads, dv] f32
  std::uint32_t seq_len = 0, heads = 0, dq = 0, dv = 0;
  bool use_gate = false;
};
/// The seed kernel's rules for `a`, which the split path (k3_sdpa) keeps too. Errors
/// (`invalid_argument`, prefixed "k3_mla_sdpa_gate_f32:"): null q or out; null k or v with
/// seq_len > 0; null g with use_gate; heads, dq or dv 0; heads past the grid limit 2^31 − 1;
/// out sharing a byte with q, k, v or (with the gate) g.
void validate(const K3SdpaArgs& a);
/// Grid heads, block 32 (one warp per head). Errors (`invalid_argument`): those of
/// validate(a); `kernel` not k3_mla_sdpa_gate_f32.
void k3_mla_sdpa_gate_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaArgs& a, Stream stream = 0);

// ---- device-resident KV ---------------------------------------------------------

/// One sequence's K and V on the device, room for `cap` tokens (seed 002
/// `MlaDeviceKv`): K [cap, k_row] f32, V [cap, v_row] f32, the first seq_len
/// rows valid. Owns its buffers (freed by the destructor or `free`). Move-only.
class MlaDeviceKv {
 public:
  /// An empty KV for `cap` tokens; cap 0 becomes 1, so a KV always has room
  /// for the token being decoded. Errors: `invalid_argument` for a k_row or
  /// v_row of 0 or a size past 2^64 bytes; the backend's (nothing stays
  /// allocated).
  static MlaDeviceKv alloc(GpuBackend& gpu, std::size_t cap, std::size_t k_row, std::size_t v_row);
  /// A KV holding `host`'s history, room for `cap` tokens (cap 0 becomes 1).
  /// Errors (`invalid_argument`): host.k / host.v not seq_len × k_row /
  /// v_row values; cap < host.seq_len; as `alloc`; the backend's (nothing stays
  /// allocated).
  static MlaDeviceKv alloc_and_upload(GpuBackend& gpu, const MlaKv& host, std::size_t cap, std::size_t k_row,
                                      std::size_t v_row);

  /// A moved-from KV is empty with cap 0, as after `free`.
  MlaDeviceKv(MlaDeviceKv&& o) noexcept
      : gpu_(o.gpu_),
        k_(std::move(o.k_)),
        v_(std::move(o.v_)),
        seq_len_(std::exchange(o.seq_len_, 0)),
        cap_(std::exchange(o.cap_, 0)),
        k_row_(o.k_row_),
        v_row_(o.v_row_) {}
  MlaDeviceKv& operator=(MlaDeviceKv&& o) noexcept {
    if (this != &o) {
      gpu_ = o.gpu_;
      k_ = std::move(o.k_);
      v_ = std::move(o.v_);
      seq_len_ = std::exchange(o.seq_len_, 0);
      cap_ = std::exchange(o.cap_, 0);
      k_row_ = o.k_row_;
      v_row_ = o.v_row_;
    }
    return *this;
  }

  /// Errors (`invalid_argument`): the resident rows are not cfg.k_row() and
  /// cfg.v_row() wide (the message names all four numbers and the config).
  void validate_cfg(const MlaConfig& cfg) const;
  /// The first seq_len rows as a host history (no copy when empty). Errors:
  /// the backend's.
  MlaKv download() const;
  /// Free both buffers now (a failed free is ignored); the KV is then empty
  /// with cap 0 and rejects appends.
  void free();

  /// Append one row: K copied device to device from `k_new` (k_row floats), V
  /// from the host. Errors: `capacity_exceeded` when seq_len == cap (cap 0: freed or moved from);
  /// `invalid_argument` when v_row.size() != v_row(); the backend's. On error
  /// seq_len is unchanged.
  void append_from_device(DevicePtr k_new, std::span<const float> v_row);
  /// Keep the first `len` rows (rollback). Errors: `invalid_argument` when len > seq_len.
  void truncate(std::size_t len);

  DevicePtr k() const { return k_.ptr(); }
  DevicePtr v() const { return v_.ptr(); }
  std::size_t seq_len() const { return seq_len_; }
  std::size_t cap() const { return cap_; }
  std::size_t k_row() const { return k_row_; }
  std::size_t v_row() const { return v_row_; }
  GpuBackend& backend() const { return *gpu_; }

 private:
  MlaDeviceKv(GpuBackend& gpu, DeviceBuffer k, DeviceBuffer v, std::size_t cap, std::size_t k_row, std::size_t v_row)
      : gpu_(&gpu), k_(std::move(k)), v_(std::move(v)), cap_(cap), k_row_(k_row), v_row_(v_row) {}

  GpuBackend* gpu_;
  DeviceBuffer k_, v_;
  std::size_t seq_len_ = 0, cap_ = 0, k_row_ = 0, v_row_ = 0;
};

// ---- one decode token -------------------------------------------------------------

/// One decode token against a host history (seed 002): q and k go to the
/// device, are rotated there (unless NoPE) and come back; (k, v) is appended
/// to `kv`; the whole history is uploaded and attended. Returns out [heads,
/// v_head_dim] f32. q, k [heads, qk_head_dim] f32 receive the rotated values on
/// success only, so a retry after an error is exact. g [heads, v_head_dim]
/// (may be empty without the gate). Errors: `invalid_argument` for the config
/// (`validate`), a q/k/v/g length (naming it and the expected heads × dim), a
/// NaN or infinity in q, k, v or g (named by index), a
/// history whose K/V sizes are not seq_len rows of the config's widths, more
/// than 2^32 − 1 tokens, an output that is not finite (scores past FP32's
/// range; checked before the row is kept); the rope launcher's (theta, a rotated position past
/// 2^24) and the backend's, with context "k3 mla decode (host KV) at position P: <stage>". On any error `kv` is
/// unchanged and no temporary stays allocated.
std::vector<float> launch_k3_mla_decode_token(GpuBackend& gpu, const K3MlaDecodeKernels& kernels, std::span<float> q,
                                              std::span<float> k, std::span<const float> v, std::span<const float> g,
                                              MlaKv& kv, const MlaConfig& cfg, std::uint32_t pos, float theta,
                                              Stream stream = 0);

/// One decode token against a device-resident history (seed 002): q and k are
/// rotated on the device, k's row is appended device to device, v's from the
/// host, attention reads the KV in place, and only out [heads, v_head_dim] f32
/// is copied back. Shapes as for `launch_k3_mla_decode_token` (q, k are not
/// modified). Errors: `capacity_exceeded` when kv is full (before any backend
/// call); `invalid_argument` for the config, a q/k/v/g length, a NaN or
/// infinity in q, k, v or g, an output that is not finite, a resident KV
/// whose rows do not fit the config (`validate_cfg`), a KV of another backend;
/// the rope launcher's (theta, a rotated position past 2^24) and the backend's,
/// with context "k3 mla decode (device KV) at position P: <stage>". On any error kv.seq_len() and its rows are
/// unchanged and no temporary stays allocated.
std::vector<float> launch_k3_mla_decode_token_on_device(GpuBackend& gpu, const K3MlaDecodeKernels& kernels,
                                                        std::span<const float> q, std::span<const float> k,
                                                        std::span<const float> v, std::span<const float> g,
                                                        MlaDeviceKv& kv, const MlaConfig& cfg, std::uint32_t pos,
                                                        float theta, Stream stream = 0);

// ---- the decoder entry point -----------------------------------------------------

/// Where a decoder keeps its KV.
enum class MlaKvPlacement { host, device };

/// `host` when the environment has K3_CUDA_MLA=0, `device` when it is 1, empty or unset (seed
/// 002: device unless K3_CUDA_MLA=0). Errors: `invalid_argument` for any other value (a typo
/// such as `off` would otherwise pick the device path silently).
MlaKvPlacement mla_kv_placement_from_env();

/// One sequence decoded token by token on either path, its history owned.
class K3MlaDecoder {
 public:
  /// `max_tokens` bounds the device KV (0 becomes 1); the host KV grows
  /// freely. Errors: `invalid_argument` for the config or a placement other than the enum's two;
  /// `not_found` for a missing kernel; the device KV's allocation errors.
  K3MlaDecoder(GpuBackend& gpu, const MlaConfig& cfg, std::size_t max_tokens,
               MlaKvPlacement placement = mla_kv_placement_from_env());

  /// The next token at position `pos` (see the two launchers for shapes and
  /// errors; on error the history is unchanged). Returns out [heads, v_head_dim] f32.
  std::vector<float> decode(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                            std::span<const float> g, std::uint32_t pos, float theta);

  MlaKvPlacement placement() const {
    return std::holds_alternative<MlaKv>(kv_) ? MlaKvPlacement::host : MlaKvPlacement::device;
  }
  std::size_t seq_len() const;
  /// The history (downloaded from the device KV). Errors: the backend's.
  MlaKv history() const;
  const MlaConfig& config() const { return cfg_; }

 private:
  GpuBackend& gpu_;
  MlaConfig cfg_;
  K3MlaDecodeKernels kernels_;
  std::variant<MlaKv, MlaDeviceKv> kv_;
};

}  // namespace metrale
