// Kimi K3 MLA decode (SPEC §4; seed 002): host history, CPU reference,
// launchers of module `mla_decode`, the device-resident KV and the two decode
// paths. See mla_decode.hpp for the invariants and how they hold.
#include "metrale/mla_decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "metrale/error.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/launch.hpp"
#include "validate.hpp"

namespace metrale {

using detail::Validator;

namespace {

constexpr std::uint32_t kRopeBlock = 128;  // one thread per head
constexpr std::uint32_t kSdpaBlock = 32;   // one warp per head
constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kF32 = sizeof(float);

/// Runs `undo` when destroyed unless dismissed: rolls a KV append back when a
/// decode fails after it.
template <class F>
class Rollback {
 public:
  explicit Rollback(F undo) : undo_(std::move(undo)) {}
  Rollback(const Rollback&) = delete;
  Rollback& operator=(const Rollback&) = delete;
  ~Rollback() {
    if (armed_) undo_();
  }
  void dismiss() { armed_ = false; }

 private:
  F undo_;
  bool armed_ = true;
};

void expect_len(const char* what, std::size_t got, std::uint32_t heads, const char* dim_name, std::uint32_t dim) {
  const std::size_t want = std::size_t{heads} * dim;
  if (got != want)
    fail(Errc::invalid_argument, "k3 mla: {} has {} values, expected heads {} x {} {} = {}", what, got, heads, dim_name,
         dim, want);
}

// The seed's rank checks of one token's inputs. g may be empty without the gate.
void check_token(const MlaConfig& cfg, std::size_t q, std::size_t k, std::size_t v, std::size_t g) {
  validate(cfg);
  expect_len("q", q, cfg.heads, "qk_head_dim", cfg.qk_head_dim());
  expect_len("k", k, cfg.heads, "qk_head_dim", cfg.qk_head_dim());
  expect_len("v", v, cfg.heads, "v_head_dim", cfg.v_head_dim);
  if (cfg.mla_use_output_gate || g != 0) expect_len("g", g, cfg.heads, "v_head_dim", cfg.v_head_dim);
}

// The token's K and V rows enter the history, where a NaN or an infinity would poison every later
// token's output, and q and g make this one's: refused before anything is stored, naming the
// first such element.
void check_token_values(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                        std::span<const float> g) {
  detail::require_finite("k3 mla: q", q, "a query must be finite");
  detail::require_finite("k3 mla: k", k, "a row of the history must be finite");
  detail::require_finite("k3 mla: v", v, "a row of the history must be finite");
  detail::require_finite("k3 mla: g", g, "a gate must be finite");
}

// out is a softmax-weighted mean of finite V rows (times a sigmoid): a value that is not finite
// means a score overflowed FP32. Checked before the token is kept.
void check_output(std::span<const float> out) {
  detail::require_finite("k3 mla: out", out,
                         "its attention scores overflowed FP32 (q . k / sqrt(dq)); the token was not added");
}

void check_history_len(std::size_t seq_len) {
  if (seq_len >= kU32Max)
    fail(Errc::invalid_argument, "k3 mla: history of {} tokens cannot grow past {}", seq_len, kU32Max);
}

// A host history that the config's rows fit, with room for one more token.
void check_host_history(const MlaKv& kv, const MlaConfig& cfg) {
  if (kv.k.size() != kv.seq_len * cfg.k_row() || kv.v.size() != kv.seq_len * cfg.v_row())
    fail(Errc::invalid_argument, "k3 mla: host KV of {} tokens holds {} K and {} V values, the config needs {} and {}",
         kv.seq_len, kv.k.size(), kv.v.size(), kv.seq_len * cfg.k_row(), kv.seq_len * cfg.v_row());
  check_history_len(kv.seq_len);
}

std::size_t bytes_of(std::size_t rows, std::size_t row, const char* what) {
  if (row != 0 && rows > std::numeric_limits<std::size_t>::max() / kF32 / row)
    fail(Errc::invalid_argument, "k3 mla: {} of {} rows x {} floats exceeds the address space", what, rows, row);
  return rows * row * kF32;
}

K3RopeArgs rope_args(const MlaConfig& cfg, DevicePtr q, DevicePtr k_new, std::uint32_t pos, float theta) {
  return {q, k_new, cfg.heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, pos, theta, cfg.mla_use_nope};
}

K3SdpaArgs sdpa_args(const MlaConfig& cfg, DevicePtr q, DevicePtr k, DevicePtr v, DevicePtr g, DevicePtr out,
                     std::size_t seq_len) {
  return {.q = q,
          .k = k,
          .v = v,
          .g = g,
          .out = out,
          .seq_len = static_cast<std::uint32_t>(seq_len),
          .heads = cfg.heads,
          .dq = cfg.qk_head_dim(),
          .dv = cfg.v_head_dim,
          .use_gate = cfg.mla_use_output_gate};
}

// Unless NoPE, rotate the rope slice of each head of x [heads, dq] in place, in float64.
void rope_reference(std::span<float> x, const MlaConfig& cfg, std::uint32_t pos, double theta) {
  if (cfg.mla_use_nope) return;
  const std::uint32_t dq = cfg.qk_head_dim(), rope = cfg.qk_rope_head_dim;
  for (std::size_t h = 0; h < cfg.heads; ++h) {
    for (std::uint32_t i = 0; i < rope / 2; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / rope);
      float& a = x[h * dq + cfg.qk_nope_head_dim + 2 * i];
      float& b = x[h * dq + cfg.qk_nope_head_dim + 2 * i + 1];
      const double a0 = a, b0 = b;
      a = static_cast<float>(a0 * std::cos(angle) - b0 * std::sin(angle));
      b = static_cast<float>(b0 * std::cos(angle) + a0 * std::sin(angle));
    }
  }
}

}  // namespace

void validate(const MlaConfig& cfg) {
  if (cfg.heads == 0) fail(Errc::invalid_argument, "k3 mla: heads is 0");
  const std::uint64_t dq = std::uint64_t{cfg.qk_nope_head_dim} + cfg.qk_rope_head_dim;
  if (dq == 0)
    fail(Errc::invalid_argument, "k3 mla: qk_head_dim is 0 (qk_nope_head_dim 0 + qk_rope_head_dim 0); dq must be > 0");
  if (dq > kU32Max)
    fail(Errc::invalid_argument, "k3 mla: qk_nope_head_dim {} + qk_rope_head_dim {} exceeds {}", cfg.qk_nope_head_dim,
         cfg.qk_rope_head_dim, kU32Max);
  if (cfg.v_head_dim == 0) fail(Errc::invalid_argument, "k3 mla: v_head_dim is 0");
  if (!cfg.mla_use_nope && cfg.qk_rope_head_dim % 2 != 0)
    fail(Errc::invalid_argument,
         "k3 mla: qk_rope_head_dim {} is odd; the rotation turns pairs (2i, 2i+1) (under NoPE nothing is rotated)",
         cfg.qk_rope_head_dim);
}

// ---- MlaKv ------------------------------------------------------------------------

void MlaKv::append(std::span<const float> k_row, std::span<const float> v_row) {
  if (k_row.empty() || v_row.empty())
    fail(Errc::invalid_argument, "k3 mla: cannot append a K row of {} and a V row of {} values", k_row.size(),
         v_row.size());
  if (k.size() != seq_len * k_row.size() || v.size() != seq_len * v_row.size())
    fail(Errc::invalid_argument,
         "k3 mla: host KV of {} tokens holds {} K and {} V values; rows of {} and {} values do not fit it", seq_len,
         k.size(), v.size(), k_row.size(), v_row.size());
  // The rows copied first: they may lie in k or v themselves (the last token again), which the
  // reserve below would free. Then both reserved: the inserts cannot throw, so a failed append
  // changes nothing.
  const std::vector<float> k_new(k_row.begin(), k_row.end()), v_new(v_row.begin(), v_row.end());
  k.reserve(k.size() + k_new.size());
  v.reserve(v.size() + v_new.size());
  k.insert(k.end(), k_new.begin(), k_new.end());
  v.insert(v.end(), v_new.begin(), v_new.end());
  ++seq_len;
}

void MlaKv::truncate(std::size_t len) {
  if (len > seq_len) fail(Errc::invalid_argument, "k3 mla: cannot truncate a host KV of {} tokens to {}", seq_len, len);
  if (len == seq_len) return;
  // The fields are public: rows of k.size() / seq_len values only if the sizes divide.
  if (k.size() % seq_len != 0 || v.size() % seq_len != 0)
    fail(Errc::invalid_argument, "k3 mla: host KV of {} tokens holds {} K and {} V values, not whole rows", seq_len,
         k.size(), v.size());
  k.resize(k.size() / seq_len * len);
  v.resize(v.size() / seq_len * len);
  seq_len = len;
}

// ---- the CPU reference --------------------------------------------------------------

std::vector<float> mla_decode_token(std::span<float> q, std::span<float> k, std::span<const float> v,
                                    std::span<const float> g, MlaKv& kv, const MlaConfig& cfg, std::uint32_t pos,
                                    float theta) {
  // The launchers' checks, all before q and k are rotated in place: an error changes nothing.
  check_token(cfg, q.size(), k.size(), v.size(), g.size());
  check_token_values(q, k, v, g);
  check_host_history(kv, cfg);
  if (!cfg.mla_use_nope)
    if (const auto why = detail::rope_theta_problem(theta, cfg.qk_rope_head_dim, pos))
      fail(Errc::invalid_argument, "k3 mla: {}", *why);
  rope_reference(q, cfg, pos, theta);
  rope_reference(k, cfg, pos, theta);
  kv.append(k, v);
  const std::size_t H = cfg.heads, dq = cfg.qk_head_dim(), dv = cfg.v_head_dim, T = kv.seq_len;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dq));
  std::vector<float> out(H * dv);
  std::vector<double> logit(T), acc(dv);
  for (std::size_t h = 0; h < H; ++h) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < T; ++j) {
      double dot = 0;
      for (std::size_t d = 0; d < dq; ++d) dot += double{q[h * dq + d]} * kv.k[(j * H + h) * dq + d];
      logit[j] = dot * scale;
      m = std::max(m, logit[j]);
    }
    double denom = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::size_t j = 0; j < T; ++j) {
      const double p = std::exp(logit[j] - m);
      denom += p;
      for (std::size_t d = 0; d < dv; ++d) acc[d] += p * kv.v[(j * H + h) * dv + d];
    }
    for (std::size_t d = 0; d < dv; ++d) {
      double o = acc[d] / denom;
      if (cfg.mla_use_output_gate) o /= 1.0 + std::exp(-double{g[h * dv + d]});
      out[h * dv + d] = static_cast<float>(o);
    }
  }
  return out;
}

// ---- launchers ----------------------------------------------------------------------

K3MlaDecodeKernels K3MlaDecodeKernels::resolve(GpuBackend& gpu) {
  return {gpu.kernel(kMlaDecodeModule, "k3_mla_maybe_rope_f32"), gpu.kernel(kMlaDecodeModule, "k3_mla_sdpa_gate_f32"),
          gpu.kernel(kK3FastModule, "k3_mla_sdpa_split_f32"), gpu.kernel(kK3FastModule, "k3_mla_sdpa_combine_f32")};
}

void k3_mla_maybe_rope_f32(GpuBackend& gpu, KernelHandle kernel, const K3RopeArgs& a, Stream stream) {
  const Validator v{"k3_mla_maybe_rope_f32"};
  v.non_null({{"q", a.q}, {"k_new", a.k_new}});
  v.positive({{"heads", a.heads}});
  v.at_most("nope + rope", std::uint64_t{a.nope} + a.rope, kU32Max);
  if (!a.use_nope) {  // under NoPE the kernel touches neither
    v.check(a.rope % 2 == 0, "rope {} is odd (pairs (2i, 2i+1): its last dim would stay unrotated)", a.rope);
    v.rope_theta(a.theta, a.rope, a.pos);
    const std::uint64_t bytes = detail::saturating_product({a.heads, std::uint64_t{a.nope} + a.rope, 4});
    v.disjoint({"k_new", a.k_new, bytes}, {{"q", a.q, bytes}});
  }
  KernelLaunch(gpu, kernel)
      .grid({div_ceil(a.heads, kRopeBlock), 1, 1})
      .block({kRopeBlock, 1, 1})
      .arg_ptr(a.q)
      .arg_ptr(a.k_new)
      .arg_u32(a.heads)
      .arg_u32(a.nope)
      .arg_u32(a.rope)
      .arg_u32(a.pos)
      .arg_f32(a.theta)
      .arg_u32(a.use_nope ? 1 : 0)
      .launch(stream);
}

void validate(const K3SdpaArgs& a) {
  const Validator v{"k3_mla_sdpa_gate_f32"};
  v.non_null({{"q", a.q}, {"out", a.out}});
  if (a.seq_len > 0) v.non_null({{"k", a.k}, {"v", a.v}});
  if (a.use_gate) v.non_null({{"g", a.g}});
  v.positive({{"heads", a.heads}, {"dq", a.dq}, {"dv", a.dv}});
  v.at_most("heads", a.heads, detail::kMaxGridX);
  using detail::saturating_product;
  v.disjoint({"out", a.out, saturating_product({a.heads, a.dv, 4})},
             {{"q", a.q, saturating_product({a.heads, a.dq, 4})},
              {"k", a.k, saturating_product({a.seq_len, a.heads, a.dq, 4})},
              {"v", a.v, saturating_product({a.seq_len, a.heads, a.dv, 4})},
              {"g", a.use_gate ? a.g : DevicePtr{}, saturating_product({a.heads, a.dv, 4})}});
}

void k3_mla_sdpa_gate_f32(GpuBackend& gpu, KernelHandle kernel, const K3SdpaArgs& a, Stream stream) {
  validate(a);
  detail::validate_entry(Validator{"k3_mla_sdpa_gate_f32"}, gpu, kernel, {"k3_mla_sdpa_gate_f32"});
  KernelLaunch(gpu, kernel)
      .grid({a.heads, 1, 1})
      .block({kSdpaBlock, 1, 1})
      .arg_ptr(a.q)
      .arg_ptr(a.k)
      .arg_ptr(a.v)
      .arg_ptr(a.g)
      .arg_ptr(a.out)
      .arg_u32(a.seq_len)
      .arg_u32(a.heads)
      .arg_u32(a.dq)
      .arg_u32(a.dv)
      .arg_u32(a.use_gate ? 1 : 0)
      .launch(stream);
}

// ---- MlaDeviceKv --------------------------------------------------------------------

MlaDeviceKv MlaDeviceKv::alloc(GpuBackend& gpu, std::size_t cap, std::size_t k_row, std::size_t v_row) {
  if (k_row == 0 || v_row == 0)
    fail(Errc::invalid_argument, "k3 mla: resident rows of {} K and {} V values; both must be > 0", k_row, v_row);
  cap = std::max<std::size_t>(cap, 1);
  const std::size_t k_bytes = bytes_of(cap, k_row, "device K"), v_bytes = bytes_of(cap, v_row, "device V");
  return with_context(fmt::format("k3 mla: allocate a device KV of {} tokens", cap), [&] {
    DeviceBuffer k(gpu, k_bytes);
    DeviceBuffer v(gpu, v_bytes);  // on failure k's destructor frees it
    return MlaDeviceKv(gpu, std::move(k), std::move(v), cap, k_row, v_row);
  });
}

MlaDeviceKv MlaDeviceKv::alloc_and_upload(GpuBackend& gpu, const MlaKv& host, std::size_t cap, std::size_t k_row,
                                          std::size_t v_row) {
  if (host.k.size() != host.seq_len * k_row || host.v.size() != host.seq_len * v_row)
    fail(Errc::invalid_argument,
         "k3 mla: host KV of {} tokens holds {} K and {} V values, expected {} x {} = {} and {} x {} = {}",
         host.seq_len, host.k.size(), host.v.size(), host.seq_len, k_row, host.seq_len * k_row, host.seq_len, v_row,
         host.seq_len * v_row);
  if (std::max<std::size_t>(cap, 1) < host.seq_len)
    fail(Errc::invalid_argument, "k3 mla: device KV cap {} < history of {} tokens", cap, host.seq_len);
  MlaDeviceKv kv = alloc(gpu, cap, k_row, v_row);  // freed by its destructor if an upload fails
  with_context(fmt::format("k3 mla: upload a history of {} tokens", host.seq_len), [&] {
    upload<float>(gpu, host.k, kv.k());
    upload<float>(gpu, host.v, kv.v());
  });
  kv.seq_len_ = host.seq_len;
  return kv;
}

void MlaDeviceKv::validate_cfg(const MlaConfig& cfg) const {
  if (k_row_ != cfg.k_row() || v_row_ != cfg.v_row())
    fail(Errc::invalid_argument,
         "k3 mla: resident KV rows are K {} and V {} values, the config needs K {} (heads {} x qk_head_dim {}) and "
         "V {} (heads {} x v_head_dim {})",
         k_row_, v_row_, cfg.k_row(), cfg.heads, cfg.qk_head_dim(), cfg.v_row(), cfg.heads, cfg.v_head_dim);
}

MlaKv MlaDeviceKv::download() const {
  MlaKv host;
  host.k = metrale::download<float>(*gpu_, k(), seq_len_ * k_row_);
  host.v = metrale::download<float>(*gpu_, v(), seq_len_ * v_row_);
  host.seq_len = seq_len_;
  return host;
}

namespace {
// An append's room: `capacity_exceeded` when `kv` is full, or has no buffers (cap 0: freed or moved from).
void require_room(const MlaDeviceKv& kv) {
  if (kv.cap() == 0) fail(Errc::capacity_exceeded, "k3 mla: the device KV has no buffers (it was freed or moved from)");
  if (kv.seq_len() >= kv.cap()) fail(Errc::capacity_exceeded, "k3 mla: device KV cap {} full", kv.cap());
}
}  // namespace

void MlaDeviceKv::free() {
  k_.reset();
  v_.reset();
  seq_len_ = 0;
  cap_ = 0;
}

void MlaDeviceKv::append_from_device(DevicePtr k_new, std::span<const float> v_row) {
  require_room(*this);
  if (v_row.size() != v_row_)
    fail(Errc::invalid_argument, "k3 mla: V row has {} values, the device KV's rows have {}", v_row.size(), v_row_);
  gpu_->copy_d2d(k_new, k() + seq_len_ * k_row_ * kF32, k_row_ * kF32);
  upload(*gpu_, v_row, v() + seq_len_ * v_row_ * kF32);
  ++seq_len_;  // only once both rows are in
}

void MlaDeviceKv::truncate(std::size_t len) {
  if (len > seq_len_)
    fail(Errc::invalid_argument, "k3 mla: cannot truncate a device KV of {} tokens to {}", seq_len_, len);
  seq_len_ = len;
}

// ---- one decode token -------------------------------------------------------------

std::vector<float> launch_k3_mla_decode_token(GpuBackend& gpu, const K3MlaDecodeKernels& kernels, std::span<float> q,
                                              std::span<float> k, std::span<const float> v, std::span<const float> g,
                                              MlaKv& kv, const MlaConfig& cfg, std::uint32_t pos, float theta,
                                              Stream stream) {
  check_token(cfg, q.size(), k.size(), v.size(), g.size());
  check_token_values(q, k, v, g);
  check_host_history(kv, cfg);
  return with_context(fmt::format("k3 mla decode (host KV) at position {}", pos), [&] {
    const auto dq = with_context("upload q", [&] { return DeviceBuffer::from_host<float>(gpu, q); });
    const auto dk = with_context("upload k", [&] { return DeviceBuffer::from_host<float>(gpu, k); });
    with_context("rope", [&] {
      k3_mla_maybe_rope_f32(gpu, kernels.rope, rope_args(cfg, dq.ptr(), dk.ptr(), pos, theta), stream);
      gpu.synchronize(stream);
    });
    const auto q_rot = with_context("download q", [&] { return dq.to_host<float>(); });
    const auto k_rot = with_context("download k", [&] { return dk.to_host<float>(); });

    const std::size_t old_len = kv.seq_len;
    kv.append(k_rot, v);
    Rollback undo([&kv, old_len] { kv.truncate(old_len); });
    const auto hk = with_context("upload K history", [&] { return DeviceBuffer::from_host<float>(gpu, kv.k); });
    const auto hv = with_context("upload V history", [&] { return DeviceBuffer::from_host<float>(gpu, kv.v); });
    const auto dg = with_context("upload g", [&] { return DeviceBuffer::from_host<float>(gpu, g); });
    const auto out = with_context("allocate out", [&] { return DeviceBuffer(gpu, cfg.v_row() * kF32); });
    DecodeWorkspace ws;
    with_context("attend", [&] {
      k3_sdpa(gpu, kernels, sdpa_args(cfg, dq.ptr(), hk.ptr(), hv.ptr(), dg.ptr(), out.ptr(), kv.seq_len), ws, stream);
      gpu.synchronize(stream);
    });
    auto result = with_context("download out", [&] { return out.to_host<float>(); });
    check_output(result);
    undo.dismiss();
    std::copy(q_rot.begin(), q_rot.end(), q.begin());
    std::copy(k_rot.begin(), k_rot.end(), k.begin());
    return result;
  });
}

std::vector<float> launch_k3_mla_decode_token_on_device(GpuBackend& gpu, const K3MlaDecodeKernels& kernels,
                                                        std::span<const float> q, std::span<const float> k,
                                                        std::span<const float> v, std::span<const float> g,
                                                        MlaDeviceKv& kv, const MlaConfig& cfg, std::uint32_t pos,
                                                        float theta, Stream stream) {
  check_token(cfg, q.size(), k.size(), v.size(), g.size());
  check_token_values(q, k, v, g);
  kv.validate_cfg(cfg);
  if (&kv.backend() != &gpu) fail(Errc::invalid_argument, "k3 mla: the device KV was allocated on another backend");
  require_room(kv);
  check_history_len(kv.seq_len());
  return with_context(fmt::format("k3 mla decode (device KV) at position {}", pos), [&] {
    const auto dq = with_context("upload q", [&] { return DeviceBuffer::from_host<float>(gpu, q); });
    const auto dk = with_context("upload k", [&] { return DeviceBuffer::from_host<float>(gpu, k); });
    with_context("rope", [&] {
      k3_mla_maybe_rope_f32(gpu, kernels.rope, rope_args(cfg, dq.ptr(), dk.ptr(), pos, theta), stream);
      // The append's copy is not ordered on `stream`: wait for the rotated k.
      gpu.synchronize(stream);
    });

    const std::size_t old_len = kv.seq_len();
    with_context("append", [&] { kv.append_from_device(dk.ptr(), v); });
    Rollback undo([&kv, old_len] { kv.truncate(old_len); });
    const auto dg = with_context("upload g", [&] { return DeviceBuffer::from_host<float>(gpu, g); });
    const auto out = with_context("allocate out", [&] { return DeviceBuffer(gpu, cfg.v_row() * kF32); });
    DecodeWorkspace ws;
    with_context("attend", [&] {
      k3_sdpa(gpu, kernels, sdpa_args(cfg, dq.ptr(), kv.k(), kv.v(), dg.ptr(), out.ptr(), kv.seq_len()), ws, stream);
      gpu.synchronize(stream);
    });
    auto result = with_context("download out", [&] { return out.to_host<float>(); });
    check_output(result);
    undo.dismiss();
    return result;
  });
}

// ---- the decoder entry point -----------------------------------------------------

MlaKvPlacement mla_kv_placement_from_env() {
  const char* env = std::getenv("K3_CUDA_MLA");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "1") == 0) return MlaKvPlacement::device;
  if (std::strcmp(env, "0") == 0) return MlaKvPlacement::host;
  fail(Errc::invalid_argument, "K3_CUDA_MLA '{}' is not 0 (host KV) or 1 (device KV)", printable(env));
}

namespace {

std::variant<MlaKv, MlaDeviceKv> make_kv(GpuBackend& gpu, const MlaConfig& cfg, std::size_t max_tokens,
                                         MlaKvPlacement placement) {
  validate(cfg);
  if (placement != MlaKvPlacement::host && placement != MlaKvPlacement::device)
    fail(Errc::invalid_argument, "k3 mla: placement {} is neither host (0) nor device (1)",
         static_cast<int>(placement));
  if (placement == MlaKvPlacement::host) return MlaKv{};
  return MlaDeviceKv::alloc(gpu, max_tokens, cfg.k_row(), cfg.v_row());
}

}  // namespace

K3MlaDecoder::K3MlaDecoder(GpuBackend& gpu, const MlaConfig& cfg, std::size_t max_tokens, MlaKvPlacement placement)
    : gpu_(gpu), cfg_(cfg), kernels_(K3MlaDecodeKernels::resolve(gpu)), kv_(make_kv(gpu, cfg, max_tokens, placement)) {}

std::vector<float> K3MlaDecoder::decode(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                        std::span<const float> g, std::uint32_t pos, float theta) {
  if (auto* device = std::get_if<MlaDeviceKv>(&kv_))
    return launch_k3_mla_decode_token_on_device(gpu_, kernels_, q, k, v, g, *device, cfg_, pos, theta);
  std::vector<float> q_rot(q.begin(), q.end()), k_rot(k.begin(), k.end());
  return launch_k3_mla_decode_token(gpu_, kernels_, q_rot, k_rot, v, g, std::get<MlaKv>(kv_), cfg_, pos, theta);
}

std::size_t K3MlaDecoder::seq_len() const {
  if (const auto* device = std::get_if<MlaDeviceKv>(&kv_)) return device->seq_len();
  return std::get<MlaKv>(kv_).seq_len;
}

MlaKv K3MlaDecoder::history() const {
  if (const auto* device = std::get_if<MlaDeviceKv>(&kv_)) return device->download();
  return std::get<MlaKv>(kv_);
}

}  // namespace metrale
