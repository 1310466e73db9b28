#include "metrale/model_case.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "metrale/error.hpp"
#include "metrale/formats.hpp"
#include "metrale/k3_fast.hpp"
#include "metrale/mla_decode.hpp"

namespace metrale {

CaseMetric compare(std::string name, std::span<const float> out, std::span<const float> ref, double tolerance) {
  if (out.size() != ref.size())
    fail(Errc::internal, "compare {}: {} values against a reference of {}", name, out.size(), ref.size());
  double num = 0, den = 0, max_abs = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double diff = double{out[i]} - double{ref[i]};
    num += diff * diff;
    den += double{ref[i]} * ref[i];
    max_abs = std::isnan(diff) ? diff : std::max(max_abs, std::fabs(diff));
    if (std::isnan(max_abs)) break;
  }
  // Against an all-zero reference any difference is an infinite relative error (the adversarial
  // trial, forty-sixth session: the absolute norm had been printed as rel_l2, and passed a wrong
  // all-zero expectation wherever the output was small).
  const double rel_l2 = den > 0 ? std::sqrt(num / den) : num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  CaseMetric m{std::move(name), std::isnan(num) ? num : rel_l2, max_abs, tolerance, false};
  m.pass = std::isfinite(m.rel_l2) && std::isfinite(m.max_abs) && m.rel_l2 <= tolerance;
  return m;
}

double replay_tolerance(std::string_view metric, KvFormat format) {
  if (metric == "q_absorbed") return 1e-2;  // BF16 activations and GEMV output, independent of the cache
  return format == KvFormat::fp8 ? 5e-2 : 0.16;
}

bool is_model_case(const SafeTensors& file) { return file.has("q_nope") && file.metadata.count("heads") != 0; }

bool is_format_tables(const SafeTensors& file) { return file.has("fp8_e4m3fn_decode"); }

namespace {

struct CaseDims {
  std::uint32_t heads, tokens;
  MlaDims dims;
};

std::uint32_t meta_u32(const SafeTensors& f, std::string_view key) {
  const std::int64_t v = f.meta_i64(key);
  if (v <= 0 || v > 1'000'000)
    fail(Errc::invalid_argument, "metadata {} = {} is out of range (1 to 1,000,000)", key, v);
  return static_cast<std::uint32_t>(v);
}

// Errors (`invalid_argument`) unless tensor `name` has exactly `shape`.
const Tensor& shaped(const SafeTensors& f, std::string_view name, std::initializer_list<std::size_t> shape) {
  const Tensor& t = f.at(name);
  if (!std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end(),
                  [](std::int64_t a, std::size_t b) { return a >= 0 && static_cast<std::uint64_t>(a) == b; }))
    fail(Errc::invalid_argument, "tensor {} has shape {}, expected [{}]", name,
         excerpt(fmt::format("[{}]", fmt::join(t.shape, ", "))),  // (a header may give a million dims)
         fmt::join(shape, ", "));
  return t;
}

// The tensor `name` as floats, checked to have `shape` and finite values (a model case's inputs
// and references are real activations; errors name the first element that is not).
std::vector<float> tensor(const SafeTensors& f, std::string_view name, std::initializer_list<std::size_t> shape) {
  const Tensor& t = shaped(f, name, shape);
  auto v = with_context(fmt::format("tensor {}", name), [&] { return t.to_f32(); });
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) fail(Errc::invalid_argument, "tensor {} element {} is {}", name, i, v[i]);
  return v;
}

// The BF16 tensor `name` (the DeepSeek decoder's weights are BF16, as the model's), checked to have
// `shape` and finite values.
std::vector<Bf16> bf16_tensor(const SafeTensors& f, std::string_view name, std::initializer_list<std::size_t> shape) {
  const Tensor& t = shaped(f, name, shape);
  if (t.dtype != Dtype::bf16) fail(Errc::invalid_argument, "tensor {} is {}, expected BF16", name, to_string(t.dtype));
  auto v = t.values<Bf16>();
  for (std::size_t i = 0; i < v.size(); ++i)  // (a NaN weight is the file's error, not a failed comparison)
    if (!std::isfinite(v[i].to_float()))
      fail(Errc::invalid_argument, "tensor {} element {} is {}", name, i, v[i].to_float());
  return v;
}

// The metadata value `key` as a float. Errors: `invalid_argument` naming the key and the file's
// value when it does not fit one (a cast would make it inf, or be undefined, or 0).
float meta_float(const SafeTensors& f, std::string_view key) {
  const double v = f.meta_f64(key);
  if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max())
    fail(Errc::invalid_argument, "metadata {} = {} is beyond a float's range", key, excerpt(f.meta(key)));
  if (v != 0 && std::fabs(v) < std::numeric_limits<float>::denorm_min())  // a cast would make it 0
    fail(Errc::invalid_argument, "metadata {} = {} is below a float's range (it would be 0)", key,
         excerpt(f.meta(key)));
  return static_cast<float>(v);
}

// A case's `position` metadata, when present, is its last token's: tokens − 1.
void check_position(const SafeTensors& f, std::uint32_t tokens) {
  if (f.metadata.count("position") == 0) return;
  const std::int64_t pos = f.meta_i64("position");
  if (pos != std::int64_t{tokens} - 1)
    fail(Errc::invalid_argument, "metadata position = {} but the case's last token is at tokens − 1 = {}", pos,
         std::int64_t{tokens} - 1);
}

}  // namespace

void check_model_case_header(const SafeTensors& header) {
  const std::size_t H = meta_u32(header, "heads"), T = meta_u32(header, "tokens");
  const std::size_t kv = meta_u32(header, "kv_lora_rank"), rope = meta_u32(header, "qk_rope_head_dim");
  const std::size_t nope = meta_u32(header, "qk_nope_head_dim"), dv = meta_u32(header, "v_head_dim");
  (void)header.meta("rope");  // (each replay names the layouts it takes)
  (void)meta_float(header, "softmax_scale"), (void)meta_float(header, "rope_theta");
  check_position(header, static_cast<std::uint32_t>(T));
  (void)shaped(header, "q_nope", {H, nope}), (void)shaped(header, "q_rope", {H, rope});
  (void)shaped(header, "kv_latent", {T, kv}), (void)shaped(header, "k_rope", {T, rope});
  (void)shaped(header, "w_uk", {H, nope, kv}), (void)shaped(header, "w_uv", {H, dv, kv});
  const auto optional = [&](std::string_view name, std::initializer_list<std::size_t> shape) {
    if (header.has(name)) (void)shaped(header, name, shape);
  };
  optional("q_absorbed", {H, kv + rope}), optional("o_latent", {H, kv});
  for (const char* name : {"attn_out", "gate", "attn_out_gated"}) optional(name, {H, dv});
}

namespace {

// The K3 replay holds every token's K and V rows per head, on the host and on the device: a
// bound on their size keeps a small file with large metadata from asking for terabytes. At the
// bound each copy is 1 GiB (FP32): the projected rows (host) and the decoder's history (host or
// device), and for a gated case that also holds attn_out the history copied for the ungated run
// of the last token (host) and its upload (device): 2–4 GiB in all.
constexpr std::uint64_t kMaxKimiReplayKvValues = std::uint64_t{1} << 28;

// Each token of the K3 replay attends to all before it: T(T + 1)/2 keys a head in all, each
// costing its dims and a fixed part (about 64 values' worth on the emulator). A bound on that
// keeps a small file of many narrow tokens from asking for hours: on the emulator 64,000
// one-dim tokens took 6.5 minutes, a million would take days, and at the bound a replay takes
// some minutes; a device is given 16 times as much (its host KV path uploads the history every
// token: some minutes there too).
constexpr double kKimiKeyCost = 64;
constexpr double kMaxKimiReplayWorkEmu = 0x1p37, kMaxKimiReplayWorkDevice = 0x1p41;
// Steps the split SDPA does not take (heads wider than kK3SplitMaxDim, say) run the seed kernel,
// whose port costs the emulator about 20 times as much a key and dim (2026-12-07, 2 cores: 2,000
// tokens of one 640-dim head 40 s, 100 of one 67,002-dim head 6.7 s, against 8,000 one-dim tokens
// on the split path 3.4 s; the adversarial trial, forty-sixth session: 2,000 tokens of 67,002 dims
// passed the bound and would have run for 40 minutes).
constexpr double kKimiSeedPathCostEmu = 20;

float amax(std::span<const float> x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

struct Stored {
  std::size_t nonzero = 0, zeros = 0;  // of the values (FP8) or the 16-value groups (NVFP4) that are not 0
};
// FP8: a value's E4M3 code (value / scale) is 0 at most 2^-10 × scale in magnitude.
void count_fp8(std::span<const float> row, float scale, Stored& s) {
  for (float x : row)
    if (x != 0.0f) ++s.nonzero, s.zeros += e4m3_decode(e4m3_encode(x / scale)) == 0.0f ? 1 : 0;
}
// NVFP4: a group whose E4M3 scale (its largest magnitude / 6) rounds to 0 stores zeros (SPEC §3).
void count_nvfp4(std::span<const float> row, Stored& s) {
  std::array<float, kNvfp4Group> group{};
  std::array<std::uint8_t, kNvfp4Group / 2> packed{};
  for (std::size_t i = 0; i < row.size(); i += kNvfp4Group) {
    group.fill(0.0f);
    std::copy_n(row.begin() + static_cast<std::ptrdiff_t>(i), std::min(kNvfp4Group, row.size() - i), group.begin());
    if (amax(group) == 0.0f) continue;
    ++s.nonzero;
    std::uint8_t scale = 0;
    nvfp4_encode_group(group, packed, scale);
    s.zeros += e4m3_decode(scale) == 0.0f ? 1 : 0;
  }
}
// Of the K and V rows as the paged cache holds them (the decoder's BF16 values, K = [kv_latent ‖
// k_rope ‖ 0…] and V = [kv_latent ‖ 0…], kv_cache_dim wide; one latent pool holds K alone), the
// nonzero values or groups and those it stores as zeros. Where the rope rotates a pair, both its
// values are taken at the pair's norm, the most either can reach, so what is counted as stored as
// zeros is. A row at a time: a case's tokens are bounded by its file alone.
Stored stored_zeros(std::size_t tokens, std::span<const float> kv_latent, std::span<const float> k_rope,
                    const MlaDims& d, bool rotate, const PagedCacheConfig& pc) {
  Stored s;
  std::vector<float> k(d.cache_dim(), 0.0f), v(d.cache_dim(), 0.0f);
  const auto count = [&](std::span<const float> row, float scale) {
    pc.format == KvFormat::fp8 ? count_fp8(row, scale, s) : count_nvfp4(row, s);
  };
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t i = 0; i < d.kv_lora; ++i) k[i] = v[i] = bf16_round(kv_latent[t * d.kv_lora + i]);
    for (std::size_t i = 0; i < d.rope; ++i) {
      const float x = bf16_round(k_rope[t * d.rope + i]);
      const std::size_t mate = i ^ 1;  // the pair (2i, 2i + 1)
      k[d.kv_lora + i] = rotate && mate < d.rope ? std::hypot(x, bf16_round(k_rope[t * d.rope + mate])) : x;
    }
    count(k, pc.k_scale);
    if (!pc.latent) count(v, pc.v_scale);
  }
  return s;
}

}  // namespace

ReplayResult replay_deepseek_case(GpuBackend& gpu, const SafeTensors& file, std::string case_name,
                                  const ReplayOptions& options) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  const CaseDims c{meta_u32(file, "heads"), meta_u32(file, "tokens"),
                   MlaDims{meta_u32(file, "kv_lora_rank"), meta_u32(file, "qk_rope_head_dim"),
                           meta_u32(file, "qk_nope_head_dim"), meta_u32(file, "v_head_dim")}};
  const std::string& rope = file.meta("rope");
  if (rope != "pairs(2i,2i+1)" && rope != "none")
    fail(Errc::unsupported, "rope layout '{}' (expected pairs(2i,2i+1) or none)", excerpt(rope));
  const DeepseekMlaConfig cfg{c.heads, c.dims, meta_float(file, "softmax_scale"), meta_float(file, "rope_theta"),
                              rope != "none"};
  const MlaDims& d = c.dims;
  // Said in the file's names (the adversarial trial, forty-sixth session: the cache's "nvfp4 row
  // width 17 is not a multiple of 16").
  if (const std::uint64_t width = std::uint64_t{d.kv_lora} + d.rope;
      options.kv_cache == KvFormat::nvfp4 && width % 16 != 0)
    fail(Errc::invalid_argument,
         "kv_lora_rank {} + qk_rope_head_dim {} = {} is not a multiple of 16, the NVFP4 cache's scale groups; "
         "--kv-cache fp8 takes it",
         d.kv_lora, d.rope, width);
  const std::size_t H = c.heads, T = c.tokens;
  check_position(file, c.tokens);
  const auto q_nope = tensor(file, "q_nope", {H, d.nope}), q_rope = tensor(file, "q_rope", {H, d.rope});
  const auto kv_latent = tensor(file, "kv_latent", {T, d.kv_lora}), k_rope = tensor(file, "k_rope", {T, d.rope});
  const auto w_uk = bf16_tensor(file, "w_uk", {H, d.nope, d.kv_lora});
  const auto w_uv = bf16_tensor(file, "w_uv", {H, d.v_head, d.kv_lora});

  PagedCacheConfig pc;
  pc.format = options.kv_cache;
  pc.block_size = options.block_size;
  if (pc.block_size == 0) fail(Errc::invalid_argument, "block size is 0");
  pc.num_blocks = static_cast<std::uint32_t>((T + pc.block_size - 1) / pc.block_size + 1);
  pc.kv_cache_dim = d.cache_dim();
  pc.free_list_seed = 0x5EED;  // non-contiguous physical blocks, as in a long-running server
  // Per-tensor FP8 calibration: the largest K value (a rotated pair can grow by √2) and V value map to 448.
  const bool rotate = rope != "none";
  const float latent_max = amax(kv_latent);
  // (A k_rope value whose rotation can pass FP32's range had the cache refuse the scale, "k_scale
  // inf", a name the file does not hold: adversarial trial, forty-fourth session.)
  const float rope_amax = amax(k_rope);
  const double rope_max = (rotate ? std::sqrt(2.0) : 1.0) * rope_amax;
  if (rope_max > std::numeric_limits<float>::max())
    fail(Errc::invalid_argument,
         "tensor k_rope holds {} in magnitude; rotated, a pair can grow by √2 to {:.6g}, past FP32's range, so no "
         "cache scale covers it",
         rope_amax, rope_max);
  const double k_max = std::max<double>(latent_max, rope_max);
  if (options.kv_cache == KvFormat::fp8) {
    // The scale (largest magnitude / 448) an FP32 normal number, else it keeps fewer than 24 bits
    // (the adversarial trial, forty-eighth session: a fixed floor of 1e-30 on the largest
    // magnitude had taken kv_latent values of 1e-36 to 93% error, read as a FAIL).
    const double least = double{kE4m3Max} * std::numeric_limits<float>::min();
    const auto resolvable = [least](double max, const char* rows, const std::string& from) {
      if (max > 0 && max < least)
        fail(Errc::invalid_argument,
             "the {} rows' largest magnitude is {:.6g} ({}), below {:.6g} (448 × FP32's smallest normal number), so "
             "an fp8 cache's scale for them (largest / 448) would be subnormal",
             rows, max, from, least);
    };
    resolvable(k_max, "K",
               fmt::format("kv_latent's {:.6g}; k_rope's {:.6g}{}", latent_max, rope_amax,
                           rotate ? " × √2, as the rotation can grow a pair" : ""));
    if (!options.latent) resolvable(latent_max, "V", "kv_latent's");
  }
  // An all-zero tensor takes scale 1/448: any scale stores its zeros exactly.
  pc.k_scale = static_cast<float>((k_max > 0 ? k_max : 1.0) / kE4m3Max);
  pc.v_scale = options.latent ? pc.k_scale : (latent_max > 0 ? latent_max : 1.0f) / kE4m3Max;
  pc.latent = options.latent;

  ReplayResult r{
      std::move(case_name), gpu.name(), options.kv_cache, options.block_size, options.latent, {}, {}, false, {}};
  {
    // Values the cache stores as zeros, said beside the result (the adversarial trial,
    // forty-eighth session: KV values of about 1e-3 over an nvfp4 cache gave o all zeros, read
    // as a kernel's FAIL). NVFP4 has no tensor scale (SPEC §3), so any group lost is noted; an
    // fp8 cache's scale follows the tensor, and rounds its smallest values to 0 in any real case
    // (a few in a million), so more than 1% are noted.
    const Stored kept = stored_zeros(T, kv_latent, k_rope, d, rotate, pc);
    const bool fp8 = options.kv_cache == KvFormat::fp8;
    const std::string pools = options.latent ? "its one pool's rows (V = K)" : "its K and V rows";
    if (fp8 && kept.zeros * 100 > kept.nonzero)
      r.notes.push_back(fmt::format(
          "the fp8 cache stores {} of the {} nonzero values of {} as zeros: each is at most 2^-10 times its pool's "
          "scale (K {:.6g}{}), half the smallest E4M3 step",
          kept.zeros, kept.nonzero, pools, pc.k_scale, options.latent ? "" : fmt::format(", V {:.6g}", pc.v_scale)));
    if (!fp8 && kept.zeros > 0)
      r.notes.push_back(fmt::format(
          "the nvfp4 cache stores {} of the {} nonzero groups of 16 values of {} as zeros: their largest magnitude "
          "is at most 6 × 2^-10 ≈ 0.00586, where the group's E4M3 scale (amax / 6) rounds to 0 (SPEC §3)",
          kept.zeros, kept.nonzero, pools));
  }
  auto since = [](clock::time_point a) { return std::chrono::duration<double, std::milli>(clock::now() - a).count(); };
  r.stages.emplace_back("load case", since(t0));

  t0 = clock::now();
  PagedKvCache cache(gpu, pc);
  DeepseekMlaDecoder decoder(gpu, cfg, w_uk, w_uv, cache);
  const SeqId seq = cache.add_sequence();
  r.stages.emplace_back("upload weights", since(t0));

  // Tokens 0..T-2: the prompt, through the same kernels.
  std::vector<SeqId> seqs(T - 1, seq);
  std::vector<std::uint32_t> pos(T - 1);
  for (std::uint32_t t = 0; t + 1 < T; ++t) pos[t] = t;
  decoder.append_kv(seqs, std::span(kv_latent).first((T - 1) * d.kv_lora), std::span(k_rope).first((T - 1) * d.rope),
                    pos);
  r.stages.emplace_back("prefill " + std::to_string(T - 1) + " tokens", decoder.stage_times().back().second);

  const std::uint32_t last = static_cast<std::uint32_t>(T - 1);
  const auto out = decoder.step({std::span(&seq, 1), q_nope, q_rope, std::span(kv_latent).last(d.kv_lora),
                                 std::span(k_rope).last(d.rope), std::span(&last, 1)});
  for (const auto& stage : decoder.stage_times()) r.stages.emplace_back("decode: " + stage.first, stage.second);

  const KvFormat f = options.kv_cache;
  r.metrics.push_back(compare("q_absorbed", out.q_absorbed, tensor(file, "q_absorbed", {H, d.cache_dim()}),
                              replay_tolerance("q_absorbed", f)));
  r.metrics.push_back(
      compare("o_latent", out.o_latent, tensor(file, "o_latent", {H, d.kv_lora}), replay_tolerance("o_latent", f)));
  r.metrics.push_back(
      compare("attn_out", out.attn_out, tensor(file, "attn_out", {H, d.v_head}), replay_tolerance("attn_out", f)));
  r.pass = std::all_of(r.metrics.begin(), r.metrics.end(), [](const CaseMetric& m) { return m.pass; });
  return r;
}

namespace {

// Σ_j w[j] · x[j] in float64, rounded to FP32 once.
float dot_f64(std::span<const float> w, std::span<const float> x) {
  double acc = 0;
  for (std::size_t j = 0; j < x.size(); ++j) acc += double{w[j]} * x[j];
  return static_cast<float>(acc);
}

// Every token's per-head K3 rows from the latent (golden README): K [T, H, nope + rope] =
// [w_uk[h] · c_t ‖ k_rope_t], V [T, H, dv] = w_uv[h] · c_t.
struct KimiRows {
  std::vector<float> k, v;
};
KimiRows project_kimi_rows(const MlaConfig& cfg, std::size_t T, std::size_t kv_lora, std::span<const float> kv_latent,
                           std::span<const float> k_rope, std::span<const float> w_uk, std::span<const float> w_uv) {
  const std::size_t H = cfg.heads, nope = cfg.qk_nope_head_dim, rp = cfg.qk_rope_head_dim, dq = cfg.qk_head_dim(),
                    dv = cfg.v_head_dim;
  KimiRows r{std::vector<float>(T * H * dq), std::vector<float>(T * H * dv)};
  for (std::size_t t = 0; t < T; ++t) {
    const auto c = kv_latent.subspan(t * kv_lora, kv_lora);
    for (std::size_t h = 0; h < H; ++h) {
      float* k_row = &r.k[(t * H + h) * dq];
      for (std::size_t i = 0; i < nope; ++i) k_row[i] = dot_f64(w_uk.subspan((h * nope + i) * kv_lora, kv_lora), c);
      std::copy_n(k_rope.begin() + static_cast<std::ptrdiff_t>(t * rp), rp, k_row + nope);
      for (std::size_t i = 0; i < dv; ++i)
        r.v[(t * H + h) * dv + i] = dot_f64(w_uv.subspan((h * dv + i) * kv_lora, kv_lora), c);
    }
  }
  return r;
}

}  // namespace

ReplayResult replay_kimi_case(GpuBackend& gpu, const SafeTensors& file, std::string case_name, bool device_path,
                              const std::function<void(std::uint32_t done, std::uint32_t tokens)>& progress) {
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point a) { return std::chrono::duration<double, std::milli>(clock::now() - a).count(); };
  auto t0 = clock::now();
  const std::uint32_t H = meta_u32(file, "heads"), T = meta_u32(file, "tokens"),
                      kv_lora = meta_u32(file, "kv_lora_rank");
  const std::string& rope = file.meta("rope");
  if (rope != "pairs(2i,2i+1)" && rope != "none")
    fail(Errc::unsupported, "rope layout '{}' (expected pairs(2i,2i+1) or none)", excerpt(rope));
  const bool gated = file.has("gate");
  // An expectation of the gated output without the gate could not be checked: refused, not passed over.
  if (!gated && file.has("attn_out_gated"))
    fail(Errc::invalid_argument,
         "the case has attn_out_gated but no gate tensor, so its gated output cannot be checked");
  const MlaConfig cfg{.heads = H,
                      .qk_nope_head_dim = meta_u32(file, "qk_nope_head_dim"),
                      .qk_rope_head_dim = meta_u32(file, "qk_rope_head_dim"),
                      .v_head_dim = meta_u32(file, "v_head_dim"),
                      .mla_use_nope = rope == "none",
                      .mla_use_output_gate = gated};
  const std::size_t nope = cfg.qk_nope_head_dim, rp = cfg.qk_rope_head_dim, dq = cfg.qk_head_dim(), dv = cfg.v_head_dim;
  const std::uint64_t kv_values = std::uint64_t{T} * H * (std::uint64_t{dq} + dv);
  if (kv_values > kMaxKimiReplayKvValues)
    fail(Errc::invalid_argument,
         "tokens {} x heads {} x (qk_head_dim {} + v_head_dim {}) = {} K/V values exceed the replay's limit of {}", T,
         H, dq, dv, kv_values, kMaxKimiReplayKvValues);
  const bool emulator = gpu.name() == "emu";
  // (the dispatcher's own rule, at the longest step; the diff review, forty-sixth session)
  K3SdpaArgs longest;
  longest.seq_len = static_cast<std::uint32_t>(T), longest.heads = static_cast<std::uint32_t>(H);
  longest.dq = static_cast<std::uint32_t>(dq), longest.dv = static_cast<std::uint32_t>(dv);
  const auto why_seed = k3_split_unsupported(longest);
  const double seed_path = emulator && why_seed ? kKimiSeedPathCostEmu : 1;
  const double keys = 0.5 * T * (T + 1.0), work = keys * H * (static_cast<double>(dq) + dv + kKimiKeyCost) * seed_path;
  const double most = emulator ? kMaxKimiReplayWorkEmu : kMaxKimiReplayWorkDevice;
  if (work > most)
    fail(Errc::invalid_argument,
         "tokens {} attend to {:.4g} keys in all (each token to those before it); x heads {} x (qk_head_dim {} + "
         "v_head_dim {} + {} for a key's fixed cost){} = {:.4g}, past the replay's work limit of {:.4g} on {} (some "
         "minutes of work); replay fewer tokens or heads",
         T, keys, H, dq, dv, kKimiKeyCost,
         seed_path > 1 ? fmt::format(" x {} (the seed kernel: {})", seed_path, *why_seed) : "", work, most,
         emulator ? "the emulator" : "a device");
  const double scale = file.meta_f64("softmax_scale"), kernel_scale = 1.0 / std::sqrt(static_cast<double>(dq));
  if (std::fabs(scale / kernel_scale - 1.0) > 1e-6)
    fail(Errc::unsupported, "softmax_scale {} is not 1/sqrt(qk_head_dim {}) = {}, the K3 kernel's scale", scale, dq,
         kernel_scale);
  const auto theta = meta_float(file, "rope_theta");
  check_position(file, T);
  const std::size_t kv = kv_lora, tokens = T;
  const auto q_nope = tensor(file, "q_nope", {H, nope}), q_rope = tensor(file, "q_rope", {H, rp});
  const auto kv_latent = tensor(file, "kv_latent", {tokens, kv});
  const auto k_rope = tensor(file, "k_rope", {tokens, rp});
  const auto w_uk = tensor(file, "w_uk", {H, nope, kv}), w_uv = tensor(file, "w_uv", {H, dv, kv});
  const auto gate = gated ? tensor(file, "gate", {H, dv}) : std::vector<float>{};
  const std::string metric = gated ? "attn_out_gated" : "attn_out";
  const auto want = tensor(file, metric, {H, dv});
  // A gated case that holds the ungated output too has it checked as well (it had been ignored).
  const bool also_ungated = gated && file.has("attn_out");
  const auto want_ungated = also_ungated ? tensor(file, "attn_out", {H, dv}) : std::vector<float>{};
  ReplayResult r{std::move(case_name), gpu.name(), KvFormat::fp8, 0, false, {}, {}, false, {}};
  r.stages.emplace_back("load case", since(t0));

  t0 = clock::now();
  const KimiRows rows = project_kimi_rows(cfg, T, kv_lora, kv_latent, k_rope, w_uk, w_uv);
  r.stages.emplace_back("project K and V per head (host, float64)", since(t0));

  t0 = clock::now();
  const char* where = device_path ? "device KV" : "host KV";
  K3MlaDecoder dec(gpu, cfg, T, device_path ? MlaKvPlacement::device : MlaKvPlacement::host);
  r.stages.emplace_back(fmt::format("set up decoder ({})", where), since(t0));
  auto k_of = [&](std::size_t t) { return std::span(rows.k).subspan(t * H * dq, H * dq); };
  auto v_of = [&](std::size_t t) { return std::span(rows.v).subspan(t * H * dv, H * dv); };

  // The prompt: the earlier tokens' outputs are not compared, so their q and gate are zeros.
  t0 = clock::now();
  std::vector<float> q(H * dq, 0.0f);
  const std::vector<float> no_gate(gate.size(), 0.0f);
  for (std::uint32_t t = 0; t + 1 < T; ++t) {
    dec.decode(q, k_of(t), v_of(t), no_gate, t, theta);
    if (progress) progress(t + 1, T);
  }
  if (T > 1) r.stages.emplace_back(fmt::format("decode tokens 0..{} ({})", T - 2, where), since(t0));
  MlaKv prompt = also_ungated ? dec.history() : MlaKv{};  // the last token runs twice over it

  t0 = clock::now();
  for (std::size_t h = 0; h < H; ++h) {
    std::copy_n(q_nope.begin() + static_cast<std::ptrdiff_t>(h * nope), nope,
                q.begin() + static_cast<std::ptrdiff_t>(h * dq));
    std::copy_n(q_rope.begin() + static_cast<std::ptrdiff_t>(h * rp), rp,
                q.begin() + static_cast<std::ptrdiff_t>(h * dq + nope));
  }
  const auto out = dec.decode(q, k_of(T - 1), v_of(T - 1), gate, T - 1, theta);
  if (progress) progress(T, T);
  r.stages.emplace_back(fmt::format("decode token {} ({})", T - 1, where), since(t0));

  r.metrics.push_back(compare(metric, out, want, kKimiReplayTolerance));
  if (also_ungated) {  // the last token again without the gate, over a copy of the prompt's history
    t0 = clock::now();
    MlaConfig ungated = cfg;
    ungated.mla_use_output_gate = false;
    std::vector<float> k(k_of(T - 1).begin(), k_of(T - 1).end());
    const auto plain = launch_k3_mla_decode_token(gpu, K3MlaDecodeKernels::resolve(gpu), q, k, v_of(T - 1), {}, prompt,
                                                  ungated, T - 1, theta);
    r.stages.emplace_back(fmt::format("decode token {} again without the gate (host KV)", T - 1), since(t0));
    r.metrics.push_back(compare("attn_out", plain, want_ungated, kKimiReplayTolerance));
  }
  r.pass = std::all_of(r.metrics.begin(), r.metrics.end(), [](const CaseMetric& m) { return m.pass; });
  return r;
}

}  // namespace metrale
