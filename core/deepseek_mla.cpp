#include "metrale/deepseek_mla.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>

#include "metrale/error.hpp"
#include "validate.hpp"

namespace metrale {

namespace {

constexpr std::uint64_t kBf16 = sizeof(Bf16);

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::vector<Bf16> to_bf16(std::span<const float> x) {
  std::vector<Bf16> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), Bf16::from_float);
  return out;
}

std::vector<float> to_f32(std::span<const Bf16> x) {
  std::vector<float> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), [](Bf16 b) { return b.to_float(); });
  return out;
}

void expect_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want) fail(Errc::invalid_argument, "deepseek mla: {} has {} values, expected {}", what, got, want);
}

// What a cache row holds without saturating (SPEC §3, number formats), for a row of `scale`:
// FP8 is E4M3 (largest 448) times the scale; an NVFP4 group's E4M3 scale (≤ 448) times E2M1's
// largest, 6. `rounds_to` is where rounding to nearest stops reaching the largest value (E4M3
// 464, E2M1 7); past it the store clips. The rows enter as BF16, whose largest value bounds both.
struct CacheRange {
  double largest, rounds_to;
  std::string formula;
};

CacheRange cache_range(const PagedCacheConfig& cc, const char* scale_name, float scale) {
  constexpr double kBf16Max = 0x1.FEp127;
  if (cc.format == KvFormat::nvfp4) return {448.0 * 6.0, 448.0 * 7.0, "an NVFP4 group's largest, E4M3 448 x E2M1 6"};
  return {std::min(448.0 * scale, kBf16Max), std::min(464.0 * scale, kBf16Max),
          fmt::format("E4M3's 448 x {} {}", scale_name, scale)};
}

// The first value of `x` past what the cache holds refused. Rotated (`pairs`), a pair (2i, 2i+1)
// may land on either axis: its length is what must fit.
void require_storable(const char* what, std::span<const float> x, const CacheRange& range, bool pairs,
                      KvFormat format) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double magnitude = pairs ? std::hypot(double{x[i]}, double{x[i ^ 1]}) : std::abs(double{x[i]});
    if (magnitude > range.rounds_to)
      fail(Errc::invalid_argument,
           "deepseek mla: {}[{}] is {}{}, more than the {} cache holds: its largest value is {:.6g} ({}), and past "
           "{:.6g} the store saturates",
           what, i, x[i], pairs ? fmt::format(" (its rotation pair's length {:.6g})", magnitude) : "",
           to_string(format), range.largest, range.formula, range.rounds_to);
  }
}

}  // namespace

DeepseekMlaDecoder::DeepseekMlaDecoder(GpuBackend& gpu, DeepseekMlaConfig cfg, std::span<const Bf16> w_uk,
                                       std::span<const Bf16> w_uv, PagedKvCache& cache)
    : gpu_(gpu), cfg_(cfg), cache_(cache), k_(MlaAbsorbedKernels::resolve(gpu)), fast_(MlaFastKernels::resolve(gpu)) {
  if (&cache.backend() != &gpu)  // its pool addresses mean nothing (or something else) on this backend
    fail(Errc::invalid_argument,
         "deepseek mla: the paged cache lives on another backend ({} at {}) than the decoder's ({} at {})",
         cache.backend().name(), static_cast<const void*>(&cache.backend()), gpu.name(),
         static_cast<const void*>(&gpu));
  const MlaDims& d = cfg_.dims;
  // The store's assemble kernel takes a rope part of at least one value (DeepSeek's is 64).
  if (cfg_.heads == 0 || d.kv_lora == 0 || d.rope == 0 || d.nope == 0 || d.v_head == 0)
    fail(Errc::invalid_argument, "deepseek mla: heads {}, kv_lora {}, rope {}, nope {} and v_head {} must all be > 0",
         cfg_.heads, d.kv_lora, d.rope, d.nope, d.v_head);
  // hd() and cache_dim() are u32 sums: a wrapped one would pass the checks below with the wrong width.
  constexpr std::uint64_t kU32Max = std::numeric_limits<std::uint32_t>::max();
  if (std::uint64_t{d.kv_lora} + d.rope > kU32Max)
    fail(Errc::invalid_argument, "deepseek mla: kv_lora {} + rope {} exceeds {}", d.kv_lora, d.rope, kU32Max);
  if (std::uint64_t{d.nope} + d.rope > kU32Max)
    fail(Errc::invalid_argument, "deepseek mla: nope {} + rope {} exceeds {}", d.nope, d.rope, kU32Max);
  // The kernels' own limits, here rather than at the first append: one GEMV block row per head
  // (grid y), one assemble thread per cache value.
  if (cfg_.heads > detail::kMaxGridYZ)
    fail(Errc::invalid_argument, "deepseek mla: heads {} exceeds {} (the GEMV's grid)", cfg_.heads, detail::kMaxGridYZ);
  if (d.cache_dim() > kMaxKvCacheDim)
    fail(Errc::invalid_argument, "deepseek mla: kv_lora {} + rope {} = {} exceeds the kernels' kv_cache_dim limit {}",
         d.kv_lora, d.rope, d.cache_dim(), kMaxKvCacheDim);
  if (cfg_.rotate && d.rope % 2 != 0)
    fail(Errc::invalid_argument, "deepseek mla: rope {} is odd; rotation turns pairs (2i, 2i+1)", d.rope);
  const detail::Validator v{"deepseek mla"};
  v.positive_finite("softmax_scale", cfg_.softmax_scale);
  // The decode kernels' logits are base 2 in FP32 (softmax_scale × log2(e), times k_scale on FP8):
  // said here, before the prefill, in the config's names (the adversarial trial, forty-fifth
  // session: replay named the launcher's inv_sqrt_d, after the prefill).
  v.logit_scale("softmax_scale", cfg_.softmax_scale);
  if (cfg_.rotate)  // at position 1 here; each step's positions in the rope launches
    if (const auto why = detail::rope_theta_problem(cfg_.rope_theta, d.rope, 1))
      fail(Errc::invalid_argument, "deepseek mla: rope_{}", *why);
  // heads ≤ 2^16 and kv_lora ≤ 2^10 (above): these products stay below 2^58.
  expect_size("w_uk", w_uk.size(), std::size_t{cfg_.heads} * d.nope * d.kv_lora);
  expect_size("w_uv", w_uv.size(), std::size_t{cfg_.heads} * d.v_head * d.kv_lora);
  const PagedCacheConfig& cc = cache.config();
  if (cc.kv_cache_dim != d.cache_dim() || cc.num_kv_heads != 1)
    fail(Errc::invalid_argument,
         "deepseek mla: cache has num_kv_heads {} and kv_cache_dim {}, expected 1 and kv_lora + rope = {}",
         cc.num_kv_heads, cc.kv_cache_dim, d.cache_dim());
  if (cc.format == KvFormat::fp8) v.fp8_logit_scale("softmax_scale", cfg_.softmax_scale, cc.k_scale);
  std::vector<Bf16> w_uk_t(w_uk.size());  // [H, nope, kv_lora] -> [H, kv_lora, nope]
  for (std::size_t h = 0; h < cfg_.heads; ++h)
    for (std::size_t i = 0; i < d.nope; ++i)
      for (std::size_t j = 0; j < d.kv_lora; ++j)
        w_uk_t[(h * d.kv_lora + j) * d.nope + i] = w_uk[(h * d.nope + i) * d.kv_lora + j];
  w_uk_t_ = DeviceBuffer::from_host<Bf16>(gpu_, w_uk_t);
  w_uv_ = DeviceBuffer::from_host(gpu_, w_uv);
}

void DeepseekMlaDecoder::mark(const char* stage) {
  gpu_.synchronize(0);
  const double t = now_ms();
  times_.emplace_back(stage, t - last_mark_);
  last_mark_ = t;
}

void DeepseekMlaDecoder::check_new_tokens(std::size_t n, std::span<const float> kv_latent,
                                          std::span<const float> k_rope,
                                          std::span<const std::uint32_t> positions) const {
  const MlaDims& d = cfg_.dims;
  expect_size("kv_latent", kv_latent.size(), n * d.kv_lora);
  expect_size("k_rope", k_rope.size(), n * d.rope);
  expect_size("positions", positions.size(), n);
  if (cfg_.rotate)  // the rope launches would refuse one part-way through the step
    for (std::size_t i = 0; i < n; ++i)
      if (const auto why = detail::rope_theta_problem(cfg_.rope_theta, d.rope, positions[i]))
        fail(Errc::invalid_argument, "deepseek mla: positions[{}]: {}", i, *why);
  // The rows enter the cache, where a NaN would poison every later step of the sequence and a
  // value past the format's range would be clipped without a word: refused before anything is
  // reserved. kv_latent goes into the K row and (unless latent) the V row, k_rope into K alone.
  detail::require_finite("deepseek mla: kv_latent", kv_latent, "a token stored in the cache must be finite");
  detail::require_finite("deepseek mla: k_rope", k_rope, "a token stored in the cache must be finite");
  const PagedCacheConfig& cc = cache_.config();
  const bool v_smaller = !cc.latent && cc.v_scale < cc.k_scale;
  require_storable("kv_latent", kv_latent,
                   v_smaller ? cache_range(cc, "v_scale", cc.v_scale) : cache_range(cc, "k_scale", cc.k_scale), false,
                   cc.format);
  require_storable("k_rope", k_rope, cache_range(cc, "k_scale", cc.k_scale), cfg_.rotate, cc.format);
}

void DeepseekMlaDecoder::check_step_output(const StepOutput& out) const {
  // A score is softmax_scale x q_absorbed . K over FP32; |K| is at most the cache's largest value,
  // so below this bound on every row no score can overflow (to +inf, a NaN output; to -inf, a
  // key silently dropped).
  // (A q_absorbed that overflowed BF16 is named as such first: its bound below would be NaN or inf.)
  constexpr std::string_view why = "the step overflowed its BF16 outputs; it was not applied";
  detail::require_finite("deepseek mla: q_absorbed", out.q_absorbed, why);
  const PagedCacheConfig& cc = cache_.config();
  const double k_largest = cache_range(cc, "k_scale", cc.k_scale).largest;
  const std::uint32_t H = cfg_.heads, cd = cfg_.dims.cache_dim();
  for (std::size_t r = 0; r < out.q_absorbed.size() / cd; ++r) {
    double l1 = 0.0;
    for (std::size_t i = 0; i < cd; ++i) l1 += std::abs(double{out.q_absorbed[r * cd + i]});
    const double bound = double{cfg_.softmax_scale} * l1 * k_largest;
    if (!(bound <= 0x1p126))
      fail(Errc::invalid_argument,
           "deepseek mla: sequence {} head {}: softmax_scale {} x |q_absorbed|_1 {:.6g} x the cache's largest value "
           "{:.6g} = {:.6g} reaches 2^126, so its attention scores could overflow FP32; the step was not applied",
           r / H, r % H, cfg_.softmax_scale, l1, k_largest, bound);
  }
  detail::require_finite("deepseek mla: o_latent", out.o_latent, why);
  detail::require_finite("deepseek mla: attn_out", out.attn_out, why);
}

SlotReservation DeepseekMlaDecoder::stage_kv(std::span<const SeqId> seqs, std::span<const float> kv_latent,
                                             std::span<const float> k_rope, std::span<const std::uint32_t> positions) {
  const MlaDims& d = cfg_.dims;
  const std::size_t n = seqs.size();
  SlotReservation slots = cache_.reserve(seqs);  // capacity first: fail before any work
  if (n == 0) return slots;
  const std::uint32_t cd = d.cache_dim(), nt = static_cast<std::uint32_t>(n);

  const auto latent = DeviceBuffer::from_host<Bf16>(gpu_, to_bf16(kv_latent));    // [n, kv_lora]
  const auto rope = DeviceBuffer::from_host<Bf16>(gpu_, to_bf16(k_rope));         // [n, rope]
  const DeviceBuffer k_rows(gpu_, n * cd * kBf16), v_rows(gpu_, n * cd * kBf16);  // [n, cd]
  const auto slot_mapping = DeviceBuffer::from_host(gpu_, slots.slot_mapping());
  for (std::size_t i = 0; i < n; ++i) {
    const DevicePtr k_rope_i = rope.ptr() + i * d.rope * kBf16;
    if (cfg_.rotate) rope_pairs_bf16(gpu_, k_.rope_pairs_bf16, {k_rope_i, 1, d.rope, positions[i], cfg_.rope_theta});
    mla_cache_assemble(gpu_, k_.cache_assemble,
                       {latent.ptr() + i * d.kv_lora * kBf16, k_rope_i, k_rows.ptr() + i * cd * kBf16,
                        v_rows.ptr() + i * cd * kBf16, d.kv_lora, d.rope, cd});
  }
  // A latent pool holds the K row alone: V's store writes the same bytes again.
  const DevicePtr v_src = cache_.config().latent ? k_rows.ptr() : v_rows.ptr();
  const CacheStoreCommon common{k_rows.ptr(),       v_src, cache_.k_pool(),    cache_.v_pool(),
                                slot_mapping.ptr(), nt,    cache_.row_width(), cache_.config().block_size};
  if (cache_.config().format == KvFormat::fp8) {
    mla_paged_cache_store_fp8(gpu_, k_.paged_cache_store_fp8,
                              {common, cache_.cache_stride(), cache_.config().k_scale, cache_.config().v_scale});
  } else {
    mla_paged_cache_store_nvfp4(gpu_, k_.paged_cache_store_nvfp4,
                                {common, cache_.block_stride_bytes(), cache_.data_section_bytes()});
  }
  gpu_.synchronize(0);
  return slots;
}

void DeepseekMlaDecoder::append_kv(std::span<const SeqId> seqs, std::span<const float> kv_latent,
                                   std::span<const float> k_rope, std::span<const std::uint32_t> positions) {
  check_new_tokens(seqs.size(), kv_latent, k_rope, positions);
  times_.clear();
  last_mark_ = now_ms();
  SlotReservation slots = stage_kv(seqs, kv_latent, k_rope, positions);
  mark("kv append (rope, assemble, store)");  // its synchronize can fail too: commit after it
  slots.commit();
}

void DeepseekMlaDecoder::attend(DevicePtr q_absorbed, DevicePtr o, std::span<const SeqId> seqs) {
  const auto tables = cache_.upload_tables(seqs, -1, PagedKvCache::TableWidth::fitted);
  const PagedCacheConfig& cc = cache_.config();
  const std::uint32_t cd = cfg_.dims.cache_dim();
  const PagedDecodeCommon common{q_absorbed,
                                 cache_.k_pool(),
                                 cache_.v_pool(),
                                 o,
                                 tables.block_tables.ptr(),
                                 tables.seq_lens.ptr(),
                                 tables.max_blocks_per_seq,
                                 cfg_.heads,
                                 1,
                                 cd,
                                 cd,
                                 cc.block_size,
                                 cfg_.softmax_scale,
                                 tables.num_seqs};
  // The dispatchers: the split path (mla_fast, or mla_wgmma on sm_90 above 32 heads and up to 16) where it
  // applies, else the seed kernel. Its workspace lives for this step only, so a step leaves no
  // allocation behind (and a failed one nothing at all).
  DecodeWorkspace ws;
  if (cc.format == KvFormat::fp8) {
    const PagedDecodeFp8Args a{common, cc.k_scale, cc.v_scale, cache_.cache_stride(), 0, {}, {}, 0};
    paged_decode_fp8(gpu_, k_, fast_, a, ws);
  } else {
    paged_decode_nvfp4(gpu_, k_, fast_, {common, cache_.block_stride_bytes(), cache_.data_section_bytes()}, ws);
  }
  gpu_.synchronize(0);  // the workspace is freed when this returns
}

DeepseekMlaDecoder::StepOutput DeepseekMlaDecoder::step(const StepInput& in) {
  const MlaDims& d = cfg_.dims;
  const std::uint32_t H = cfg_.heads, cd = d.cache_dim(), hd = d.hd();
  const std::size_t S = in.seqs.size();
  if (S > detail::kMaxGridYZ)  // the decode's grid; named before any stage runs
    fail(Errc::invalid_argument, "deepseek mla: {} sequences in one decode step exceed {} (the decode's grid)", S,
         detail::kMaxGridYZ);
  if (std::set<SeqId>(in.seqs.begin(), in.seqs.end()).size() != S)
    fail(Errc::invalid_argument, "deepseek mla: a sequence is listed twice in one decode step");
  expect_size("q_nope", in.q_nope.size(), S * H * d.nope);
  expect_size("q_rope", in.q_rope.size(), S * H * d.rope);
  detail::require_finite("deepseek mla: q_nope", in.q_nope, "a query must be finite");
  detail::require_finite("deepseek mla: q_rope", in.q_rope, "a query must be finite");
  check_new_tokens(S, in.kv_latent, in.k_rope, in.positions);  // before the q stages, which index positions
  times_.clear();
  last_mark_ = now_ms();
  if (S == 0) return {};

  // q_full [S, H, nope + rope] = [q_nope ‖ q_rope], as the model's BF16 activations.
  std::vector<Bf16> q_full(S * H * hd);
  for (std::size_t r = 0; r < S * H; ++r) {
    for (std::size_t i = 0; i < d.nope; ++i) q_full[r * hd + i] = Bf16::from_float(in.q_nope[r * d.nope + i]);
    for (std::size_t i = 0; i < d.rope; ++i) q_full[r * hd + d.nope + i] = Bf16::from_float(in.q_rope[r * d.rope + i]);
  }
  const auto q_full_d = DeviceBuffer::from_host<Bf16>(gpu_, q_full);
  const DeviceBuffer q_abs(gpu_, S * H * cd * kBf16), q_rope(gpu_, S * H * d.rope * kBf16);
  const DeviceBuffer o(gpu_, S * H * cd * kBf16), attn(gpu_, S * H * d.v_head * kBf16);
  mark("upload");

  const auto nq = static_cast<std::uint32_t>(S * H);
  // The GEMVs start early (their weights streaming in while the kernel ahead finishes): no kernel
  // of the step writes W_UK or W_UV.
  for (std::size_t s = 0; s < S; ++s)
    batched_gemv(gpu_, k_, fast_,
                 {q_full_d.ptr() + s * H * hd * kBf16, w_uk_t_.ptr(), q_abs.ptr() + s * H * cd * kBf16, d.kv_lora,
                  d.nope, H, hd, cd},
                 0, GemvStart::early);
  mark("absorb q (gemv W_UK)");
  mla_q_rope_scatter(gpu_, k_.q_rope_scatter,
                     {q_full_d.ptr(), q_abs.ptr(), q_rope.ptr(), nq, hd, d.nope, d.rope, d.kv_lora, cd});
  if (cfg_.rotate) {
    for (std::size_t s = 0; s < S; ++s)
      rope_pairs_bf16(gpu_, k_.rope_pairs_bf16,
                      {q_rope.ptr() + s * H * d.rope * kBf16, H, d.rope, in.positions[s], cfg_.rope_theta});
    mla_q_rope_writeback(gpu_, k_.q_rope_writeback, {q_rope.ptr(), q_abs.ptr(), nq, d.rope, d.kv_lora, cd});
  }
  mark("rope q (scatter, rope, writeback)");

  SlotReservation slots = stage_kv(in.seqs, in.kv_latent, in.k_rope, in.positions);
  mark("kv append (rope, assemble, store)");
  attend(q_abs.ptr(), o.ptr(), in.seqs);
  mark("paged decode");
  for (std::size_t s = 0; s < S; ++s)
    batched_gemv(gpu_, k_, fast_,
                 {o.ptr() + s * H * cd * kBf16, w_uv_.ptr(), attn.ptr() + s * H * d.v_head * kBf16, d.v_head, d.kv_lora,
                  H, cd, d.v_head},
                 0, GemvStart::early);
  mark("up-project (gemv W_UV)");

  StepOutput out;
  out.q_absorbed = to_f32(q_abs.to_host<Bf16>());
  const auto o_full = to_f32(o.to_host<Bf16>());
  out.o_latent.resize(S * H * d.kv_lora);
  for (std::size_t r = 0; r < S * H; ++r)
    std::copy_n(o_full.begin() + static_cast<std::ptrdiff_t>(r * cd), d.kv_lora,
                out.o_latent.begin() + static_cast<std::ptrdiff_t>(r * d.kv_lora));
  out.attn_out = to_f32(attn.to_host<Bf16>());
  mark("download");
  check_step_output(out);
  slots.commit();  // the step succeeded: the new tokens stay in the cache
  return out;
}

}  // namespace metrale
