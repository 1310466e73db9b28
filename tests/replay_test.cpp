// The golden model cases (HF transformers' DeepseekV3Attention) through the
// whole decode chain on the emulator, and the float64 reference against them.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrale/emu/emulator.hpp"
#include "metrale/model_case.hpp"
#include "metrale/reference.hpp"
#include "support.hpp"

using namespace metrale;

namespace {

const char* const kCases[] = {"dsv3_h16_t37.safetensors", "dsv3_h8_t300_theta50k.safetensors",
                              "k3_nope_gate_h8_t65.safetensors"};

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

// rel_l2 by hand: ‖(3, 4)‖ / ‖(6, 8)‖ = 0.5; against an all-zero reference any difference is an
// infinite error (the adversarial trial, forty-sixth session: the absolute norm, 5e-3 here, had
// passed under a 0.05 tolerance), an all-zero output none.
TEST_CASE("a replay metric's rel_l2 against a reference and an all-zero one", "[replay]") {
  const std::vector<float> ref{6, 8}, out{9, 12}, zeros{0, 0}, small{3e-3f, 4e-3f};
  const CaseMetric half = compare("t", out, ref, 0.6);
  CHECK(half.rel_l2 == Approx(0.5));
  CHECK(half.max_abs == Approx(4));
  CHECK(half.pass);
  CHECK_FALSE(compare("t", out, ref, 0.4).pass);
  const CaseMetric zero_ref = compare("t", small, zeros, 0.05);
  CHECK(std::isinf(zero_ref.rel_l2));
  CHECK_FALSE(zero_ref.pass);
  const CaseMetric both_zero = compare("t", zeros, zeros, 0.05);
  CHECK(both_zero.rel_l2 == 0);
  CHECK(both_zero.pass);
}

TEST_CASE("the float64 reference step reproduces HF's tensors", "[replay][reference]") {
  for (const char* name : kCases) {
    INFO(name);
    const auto f = SafeTensors::read(test::golden(name));
    const auto H = static_cast<std::uint32_t>(f.meta_i64("heads")),
               T = static_cast<std::uint32_t>(f.meta_i64("tokens"));
    const auto q_nope = f.at("q_nope").to_f32(), q_rope = f.at("q_rope").to_f32();
    const auto kv = f.at("kv_latent").to_f32(), k_rope = f.at("k_rope").to_f32();
    const auto w_uk = f.at("w_uk").to_f32(), w_uv = f.at("w_uv").to_f32();
    ref::DeepseekStepProblem p;
    p.heads = H, p.tokens = T, p.softmax_scale = f.meta_f64("softmax_scale"), p.rope_theta = f.meta_f64("rope_theta");
    p.rotate = f.meta("rope") != "none";
    p.q_nope = q_nope, p.q_rope = q_rope, p.kv_latent = kv, p.k_rope = k_rope, p.w_uk = w_uk, p.w_uv = w_uv;
    const auto r = ref::deepseek_step(p);
    // The file's tensors are float32 roundings of a float64 computation, so only float32 noise remains.
    CHECK(test::rel_l2(r.q_absorbed, as_double(f.at("q_absorbed").to_f32())) < 1e-6);
    CHECK(test::rel_l2(r.o_latent, as_double(f.at("o_latent").to_f32())) < 1e-6);
    // attn_out is HF's own output (cos/sin in float32): the file states how far the derivation is from it.
    CHECK(test::rel_l2(r.attn_out, as_double(f.at("attn_out").to_f32())) <
          10 * f.meta_f64("relative_error_vs_hf") + 1e-6);
  }
}

// One latent pool for K and V (PagedCacheConfig::latent): each token's row stored once, V = K, one
// FP8 scale (K's) for both. The golden metrics hold as with two pools (o's rope dims, now P·K_rope,
// are not among them: W_UV reads the latent's), and the pool is half the bytes.
TEST_CASE("replay of every golden case over one latent pool, both cache formats", "[replay][latent]") {
  const char* name = GENERATE(kCases[0], kCases[1], kCases[2]);
  const KvFormat format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  INFO(name << " " << to_string(format));
  emu::EmulatorBackend gpu;
  const auto file = SafeTensors::read(test::golden(name));
  const auto latent = replay_deepseek_case(gpu, file, name, {format, 16, true});
  const auto separate = replay_deepseek_case(gpu, file, name, {format, 16, false});
  CHECK(latent.latent);
  REQUIRE(latent.metrics.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& m = latent.metrics[i];
    INFO(m.name << " rel_l2 " << m.rel_l2 << " (two pools: " << separate.metrics[i].rel_l2 << ") tolerance "
                << m.tolerance);
    CHECK(m.pass);
    CHECK(m.rel_l2 <= replay_tolerance(m.name, format));
  }
  // q_absorbed comes before the cache: the same bits either way.
  CHECK(latent.metrics[0].rel_l2 == separate.metrics[0].rel_l2);
  CHECK(gpu.live_allocations().empty());
}

TEST_CASE("replay of every golden case, both cache formats, block sizes 1, 16, 64", "[replay]") {
  const char* name = GENERATE(kCases[0], kCases[1], kCases[2]);
  const KvFormat format = GENERATE(KvFormat::fp8, KvFormat::nvfp4);
  const std::uint32_t block_size = GENERATE(1u, 16u, 64u);
  INFO(name << " " << to_string(format) << " block_size " << block_size);
  emu::EmulatorBackend gpu;
  const auto r = replay_deepseek_case(gpu, SafeTensors::read(test::golden(name)), name, {format, block_size});
  REQUIRE(r.metrics.size() == 3);
  for (const auto& m : r.metrics) {
    INFO(m.name << " rel_l2 " << m.rel_l2 << " max_abs " << m.max_abs << " tolerance " << m.tolerance);
    CHECK(m.pass);
    CHECK(m.rel_l2 <= replay_tolerance(m.name, format));
  }
  CHECK(r.pass);
  CHECK(gpu.live_allocations().empty());
}

// The FP8 calibration had floored the largest magnitude at 1e-30 (the adversarial trial,
// forty-eighth session): KV values near 1e-35 quantised against a scale a thousand times too large.
TEST_CASE("replay of KV values near 1e-35 over an fp8 cache keeps the unscaled case's errors", "[replay]") {
  emu::EmulatorBackend gpu;
  const auto file = SafeTensors::read(test::golden(kCases[0]));
  const auto base = replay_deepseek_case(gpu, file, "case", {KvFormat::fp8, 16});
  const auto small = replay_deepseek_case(gpu, test::scaled_case(file, 115), "case", {KvFormat::fp8, 16});
  REQUIRE(small.metrics.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO(small.metrics[i].name << " rel_l2 " << small.metrics[i].rel_l2 << " unscaled " << base.metrics[i].rel_l2);
    CHECK(small.metrics[i].rel_l2 == Approx(base.metrics[i].rel_l2).epsilon(1e-3));
  }
  CHECK(small.pass);
  CHECK(small.notes.empty());
}

// NVFP4 has no tensor scale (SPEC §3): a group whose largest magnitude is at most 6 × 2^-10 gets
// scale 0 and is stored as zeros. A replay says so beside its FAIL.
TEST_CASE("replay over an nvfp4 cache notes the groups it stores as zeros", "[replay]") {
  emu::EmulatorBackend gpu;
  const auto file = SafeTensors::read(test::golden(kCases[0]));
  const auto base = replay_deepseek_case(gpu, file, "case", {KvFormat::nvfp4, 16});
  CHECK(base.pass);
  CHECK(base.notes.empty());
  // Every kv_latent value of the case is below 96 in magnitude and every rotated k_rope value too
  // (a pair's norm, at most √2 × the largest), so times 2^-14 every group is lost.
  const auto largest = [&file](const char* name) {
    float m = 0;
    for (float v : file.at(name).to_f32()) m = std::max(m, std::fabs(v));
    return m;
  };
  REQUIRE(largest("kv_latent") < 96);
  REQUIRE(std::sqrt(2.0f) * largest("k_rope") < 96);
  // The cache's rows (kv_lora 512, rope 64, 576 wide): K = [latent ‖ rope], 36 groups of 16; V =
  // [latent ‖ 0…], 32 groups that are not all zero.
  const auto T = static_cast<std::size_t>(file.meta_i64("tokens"));
  const auto lost = replay_deepseek_case(gpu, test::scaled_case(file, 14), "case", {KvFormat::nvfp4, 16});
  REQUIRE(lost.notes.size() == 1);
  CHECK_THAT(lost.notes[0],
             Catch::Contains(fmt::format("stores {0} of the {0} nonzero groups of 16 values of its K and "
                                         "V rows as zeros",
                                         T * (36 + 32))));
  CHECK_FALSE(lost.pass);
  CHECK(lost.metrics[1].rel_l2 == Approx(1.0));  // o_latent all zeros
}

TEST_CASE("metrale replay --json prints the documented object and exits 0", "[replay][cli]") {
  const std::string cmd = std::string(METRALE_CLI) + " replay " +
                          test::golden("dsv3_h8_t300_theta50k.safetensors").string() + " --kv-cache fp8 --backend emu --json";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  REQUIRE(pipe);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe.get()) != nullptr) out += buf.data();
  const int status = pclose(pipe.release());
  REQUIRE(status == 0);
  const auto j = nlohmann::json::parse(out);
  CHECK(j["case"] == "dsv3_h8_t300_theta50k");
  CHECK(j["backend"] == "emu");
  CHECK(j["kv_cache"] == "fp8");
  CHECK(j["block_size"] == 16);
  CHECK(j["pass"] == true);
  CHECK(j["notes"] == nlohmann::json::array());  // a golden case's values lose nothing
  for (const char* m : {"q_absorbed", "o_latent", "attn_out"}) {
    INFO(m);
    CHECK(j["metrics"][m]["rel_l2"].get<double>() < 5e-2);
    CHECK(j["metrics"][m]["rel_l2"].get<double>() <= j["metrics"][m]["rel_l2_tolerance"].get<double>());
    CHECK(j["metrics"][m]["pass"] == true);
    CHECK(j["metrics"][m]["max_abs"].get<double>() >= 0.0);
  }
}
