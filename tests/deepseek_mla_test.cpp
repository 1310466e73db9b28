// The DeepSeek decode step on the emulator against the float64 reference step,
// several sequences at once, and its all-or-nothing guarantee under injected
// faults at every backend call it makes.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "metrale/deepseek_mla.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/reference.hpp"
#include "support.hpp"

using namespace metrale;

namespace {

// Small MLA dimensions with a 48-wide cache row (NVFP4 needs a multiple of 16).
constexpr MlaDims kDims{40, 8, 16, 8};
constexpr std::uint32_t kHeads = 3;

struct SeqData {
  std::uint32_t tokens;
  std::vector<float> q_nope, q_rope, kv_latent, k_rope;
};

// Values k/8 with |k| ≤ 16 are exact in BF16 and in E4M3 at scale 1, so without rotation an FP8
// cache holds them losslessly.
float grid_value(std::mt19937_64& rng) { return static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8.0f; }

SeqData make_seq(std::uint32_t tokens, std::mt19937_64& rng, bool grid) {
  std::uniform_real_distribution<float> uni(-1, 1);
  auto fill = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = grid ? grid_value(rng) : uni(rng);
    return v;
  };
  return {tokens, fill(kHeads * kDims.nope), fill(kHeads * kDims.rope), fill(std::size_t{tokens} * kDims.kv_lora),
          fill(std::size_t{tokens} * kDims.rope)};
}

std::vector<Bf16> random_weights(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uni(-0.25f, 0.25f);
  std::vector<Bf16> w(n);
  for (auto& x : w) x = Bf16::from_float(uni(rng));
  return w;
}

std::vector<float> floats(std::span<const Bf16> v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = v[i].to_float();
  return f;
}

std::vector<double> slice(const std::vector<float>& v, std::size_t at, std::size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n)};
}

struct Fixture {
  std::mt19937_64 rng{42};
  std::vector<Bf16> w_uk = random_weights(std::size_t{kHeads} * kDims.nope * kDims.kv_lora, rng);
  std::vector<Bf16> w_uv = random_weights(std::size_t{kHeads} * kDims.v_head * kDims.kv_lora, rng);
  DeepseekMlaConfig cfg{kHeads, kDims, 1.0f / std::sqrt(24.0f), 10000.0f, true};
  std::vector<SeqData> seqs;

  PagedCacheConfig cache_cfg(KvFormat f, std::uint32_t block_size) const {
    PagedCacheConfig c;
    c.format = f, c.num_blocks = 64, c.block_size = block_size, c.kv_cache_dim = kDims.cache_dim();
    c.free_list_seed = 99;
    return c;
  }

  // Prefill every sequence but its last token, interleaving the sequences' tokens.
  std::vector<SeqId> prefill(PagedKvCache& cache, DeepseekMlaDecoder& dec) const {
    std::vector<SeqId> ids;
    for (std::size_t s = 0; s < seqs.size(); ++s) ids.push_back(cache.add_sequence());
    std::vector<SeqId> tok_seq;
    std::vector<float> kv, kr;
    std::vector<std::uint32_t> pos;
    for (std::uint32_t t = 0;; ++t) {
      bool any = false;
      for (std::size_t s = 0; s < seqs.size(); ++s) {
        if (t + 1 >= seqs[s].tokens) continue;
        any = true;
        tok_seq.push_back(ids[s]);
        pos.push_back(t);
        kv.insert(kv.end(), seqs[s].kv_latent.begin() + t * kDims.kv_lora,
                  seqs[s].kv_latent.begin() + (t + 1) * kDims.kv_lora);
        kr.insert(kr.end(), seqs[s].k_rope.begin() + t * kDims.rope, seqs[s].k_rope.begin() + (t + 1) * kDims.rope);
      }
      if (!any) break;
    }
    dec.append_kv(tok_seq, kv, kr, pos);
    return ids;
  }

  DeepseekMlaDecoder::StepOutput step(DeepseekMlaDecoder& dec, const std::vector<SeqId>& ids,
                                      std::vector<float>& buf_q_nope, std::vector<float>& buf_q_rope,
                                      std::vector<float>& buf_kv, std::vector<float>& buf_kr,
                                      std::vector<std::uint32_t>& pos) const {
    buf_q_nope.clear(), buf_q_rope.clear(), buf_kv.clear(), buf_kr.clear(), pos.clear();
    for (const auto& s : seqs) {
      buf_q_nope.insert(buf_q_nope.end(), s.q_nope.begin(), s.q_nope.end());
      buf_q_rope.insert(buf_q_rope.end(), s.q_rope.begin(), s.q_rope.end());
      buf_kv.insert(buf_kv.end(), s.kv_latent.end() - kDims.kv_lora, s.kv_latent.end());
      buf_kr.insert(buf_kr.end(), s.k_rope.end() - kDims.rope, s.k_rope.end());
      pos.push_back(s.tokens - 1);
    }
    return dec.step({ids, buf_q_nope, buf_q_rope, buf_kv, buf_kr, pos});
  }

  DeepseekMlaDecoder::StepOutput run(GpuBackend& gpu, KvFormat f, std::uint32_t block_size) const {
    PagedKvCache cache(gpu, cache_cfg(f, block_size));
    DeepseekMlaDecoder dec(gpu, cfg, w_uk, w_uv, cache);
    const auto ids = prefill(cache, dec);
    std::vector<float> a, b, c, d;
    std::vector<std::uint32_t> p;
    return step(dec, ids, a, b, c, d, p);
  }

  ref::DeepseekStepResult reference(std::size_t s, const std::vector<float>& wk, const std::vector<float>& wv) const {
    ref::DeepseekStepProblem p;
    p.heads = kHeads, p.tokens = seqs[s].tokens, p.kv_lora = kDims.kv_lora, p.rope = kDims.rope, p.nope = kDims.nope;
    p.v_head = kDims.v_head, p.softmax_scale = cfg.softmax_scale, p.rope_theta = cfg.rope_theta, p.rotate = cfg.rotate;
    p.q_nope = seqs[s].q_nope, p.q_rope = seqs[s].q_rope, p.kv_latent = seqs[s].kv_latent, p.k_rope = seqs[s].k_rope;
    p.w_uk = wk, p.w_uv = wv;
    return ref::deepseek_step(p);
  }

  // Each sequence's outputs against the float64 step within `tol` (rel_l2).
  void check(const DeepseekMlaDecoder::StepOutput& out, double tol_q, double tol) const {
    const auto wk = floats(w_uk), wv = floats(w_uv);
    const std::size_t cd = kDims.cache_dim();
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      INFO("sequence " << s << " of " << seqs.size() << ", " << seqs[s].tokens << " tokens");
      const auto r = reference(s, wk, wv);
      CHECK(test::rel_l2(slice(out.q_absorbed, s * kHeads * cd, kHeads * cd), r.q_absorbed) <= tol_q);
      CHECK(test::rel_l2(slice(out.o_latent, s * kHeads * kDims.kv_lora, kHeads * kDims.kv_lora), r.o_latent) <= tol);
      CHECK(test::rel_l2(slice(out.attn_out, s * kHeads * kDims.v_head, kHeads * kDims.v_head), r.attn_out) <= tol);
    }
  }
};

}  // namespace

TEST_CASE("decode step with a lossless FP8 cache matches the float64 step to BF16 rounding", "[deepseek_mla]") {
  Fixture fx;
  fx.cfg.rotate = false;  // rotation would leave the E4M3 grid
  for (std::uint32_t t : {1u, 2u, 7u, 19u}) fx.seqs.push_back(make_seq(t, fx.rng, true));
  emu::EmulatorBackend gpu;
  const auto out = fx.run(gpu, KvFormat::fp8, GENERATE(1u, 3u, 16u));
  // BF16 rounding of q_absorbed, o and attn_out is all that separates them (≈ 2^-9 relative each).
  fx.check(out, 4e-3, 8e-3);
}

TEST_CASE("decode step with rotation over FP8 and NVFP4 caches, several sequences", "[deepseek_mla]") {
  Fixture fx;
  for (std::uint32_t t : {1u, 5u, 33u}) fx.seqs.push_back(make_seq(t, fx.rng, false));
  const KvFormat f = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  emu::EmulatorBackend gpu;
  const auto out = fx.run(gpu, f, 4);
  // Uniform random latents quantise worse than the model's (NVFP4 ≈ 0.1–0.2 here, 0.11 on real data).
  fx.check(out, 4e-3, f == KvFormat::fp8 ? 5e-2 : 0.25);

  SECTION("a batch gives each sequence exactly what it gets alone") {
    for (std::size_t s = 0; s < fx.seqs.size(); ++s) {
      Fixture one = fx;
      one.seqs = {fx.seqs[s]};
      emu::EmulatorBackend gpu1;
      const auto alone = one.run(gpu1, f, 4);
      const std::size_t qn = kHeads * kDims.cache_dim(), an = kHeads * kDims.v_head;
      CHECK(std::equal(alone.q_absorbed.begin(), alone.q_absorbed.end(),
                       out.q_absorbed.begin() + static_cast<std::ptrdiff_t>(s * qn)));
      CHECK(std::equal(alone.attn_out.begin(), alone.attn_out.end(),
                       out.attn_out.begin() + static_cast<std::ptrdiff_t>(s * an)));
    }
  }
}

TEST_CASE("a decode step that fails at any backend call leaves the cache as it was", "[deepseek_mla][faults]") {
  Fixture fx;
  for (std::uint32_t t : {3u, 9u}) fx.seqs.push_back(make_seq(t, fx.rng, false));
  const KvFormat f = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const bool persistent = GENERATE(false, true);
  emu::EmulatorBackend gpu;
  PagedKvCache cache(gpu, fx.cache_cfg(f, 2));
  DeepseekMlaDecoder dec(gpu, fx.cfg, fx.w_uk, fx.w_uv, cache);
  const auto ids = fx.prefill(cache, dec);
  const auto live_before = gpu.live_allocations().size();
  const auto free_before = cache.free_blocks();
  std::vector<std::uint32_t> lens_before;
  for (SeqId id : ids) lens_before.push_back(cache.seq_len(id));

  std::vector<float> a, b, c, d;
  std::vector<std::uint32_t> p;
  emu::EmulatorBackend clean_gpu;
  const auto want = fx.run(clean_gpu, f, 2);
  const std::uint64_t before = gpu.calls();
  {
    // Count the calls one step makes, on a throwaway copy of the state.
    emu::EmulatorBackend count_gpu;
    PagedKvCache count_cache(count_gpu, fx.cache_cfg(f, 2));
    DeepseekMlaDecoder count_dec(count_gpu, fx.cfg, fx.w_uk, fx.w_uv, count_cache);
    const auto count_ids = fx.prefill(count_cache, count_dec);
    const auto start = count_gpu.calls();
    fx.step(count_dec, count_ids, a, b, c, d, p);
    const auto n = count_gpu.calls() - start;
    REQUIRE(n > 10);
    for (std::uint64_t nth = 1; nth <= n; ++nth) {
      INFO("failing call " << nth << " of " << n << (persistent ? " and every later one" : " once"));
      gpu.inject_fault({std::nullopt, nth, persistent});
      bool threw = false;
      try {
        fx.step(dec, ids, a, b, c, d, p);
      } catch (const Error& e) {
        threw = true;
        CHECK_THAT(e.what(), Catch::Matchers::Contains("injected fault"));
      }
      gpu.clear_faults();
      CHECK(gpu.live_allocations().size() == live_before);  // no temporary survives
      if (threw) {
        CHECK(cache.free_blocks() == free_before);
        for (std::size_t s = 0; s < ids.size(); ++s) CHECK(cache.seq_len(ids[s]) == lens_before[s]);
      } else {  // only a failed free can go unnoticed: the step then completed
        for (std::size_t s = 0; s < ids.size(); ++s) CHECK(cache.seq_len(ids[s]) == lens_before[s] + 1);
        return;
      }
    }
  }
  CHECK(gpu.calls() > before);
  // After every failure, the step still gives exactly the clean result.
  const auto out = fx.step(dec, ids, a, b, c, d, p);
  CHECK(out.attn_out == want.attn_out);
  CHECK(out.q_absorbed == want.q_absorbed);
}
