// KV capacity (issue 5): stateful tests (rc::state) of the paged cache under the DeepSeek decoder
// and of MlaDeviceKv, each against a simple model. Random sequences of add-sequence, append,
// decode step, free, download and truncate; appends sized to fill a sequence or the pool exactly
// and one past it (capacity_exceeded, nothing changed: tables, lengths, free blocks, rows, live
// allocations, backend calls for the K3 KV); a block-table entry beyond the pool, which the
// emulator reports as a device_fault naming the kernel, the block (0, s) of the sequence and the
// parameter k_cache; and caches whose pools put rows past 2^31 bytes (the emulator maps them
// lazily, so a 4 GiB pool costs only the pages the rows touch).
#include <rapidcheck.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <span>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "arb.hpp"
#include "metrale/buffer.hpp"
#include "metrale/deepseek_mla.hpp"
#include "metrale/formats.hpp"
#include "metrale/mla_decode.hpp"
#include "props.hpp"

namespace metrale::props {

namespace {

// ---- the paged cache under the DeepSeek decoder --------------------------------------------------------

struct Token {
  std::vector<float> latent, k_rope;  // BF16 values, as the decoder stores them
};

std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = Bf16::from_float(x).to_float();
  return v;
}

struct CacheModel {
  PagedCacheConfig cfg;  // max_blocks_per_seq resolved
  MlaDims dims;
  std::uint32_t heads = 1;
  SeqId next_id = 0;
  std::map<SeqId, std::vector<Token>> seqs;

  std::uint64_t blocks(std::uint64_t len) const { return (len + cfg.block_size - 1) / cfg.block_size; }
  std::uint64_t used() const {
    std::uint64_t n = 0;
    for (const auto& [id, t] : seqs) n += blocks(t.size());
    return n;
  }
  // A batch fits when no sequence outgrows its table and the new blocks fit the free ones.
  bool fits(const std::vector<SeqId>& tokens) const {
    std::map<SeqId, std::uint64_t> extra;
    for (SeqId s : tokens) ++extra[s];
    std::uint64_t need = 0;
    for (const auto& [s, k] : extra) {
      const std::uint64_t len = seqs.at(s).size();
      if (blocks(len + k) > cfg.max_blocks_per_seq) return false;
      need += blocks(len + k) - blocks(len);
    }
    return need <= cfg.num_blocks - used();
  }
  // Tokens sequence `s` alone can still take.
  std::uint64_t room(SeqId s) const {
    const std::uint64_t len = seqs.at(s).size(), bs = cfg.block_size;
    const std::uint64_t free_blocks = cfg.num_blocks - used();
    const std::uint64_t table_room = std::uint64_t{cfg.max_blocks_per_seq} * bs - len;
    const std::uint64_t pool_room = free_blocks * bs + (blocks(len) * bs - len);
    return std::min(table_room, pool_room);
  }
  std::vector<SeqId> ids() const {
    std::vector<SeqId> v;
    for (const auto& [id, t] : seqs) v.push_back(id);
    return v;
  }
};

struct CacheSut {
  emu::EmulatorBackend gpu{emulator_options()};
  std::optional<PagedKvCache> cache;
  std::optional<DeepseekMlaDecoder> dec;
  std::set<std::uint64_t> base;  // the pools and the weights

  explicit CacheSut(const CacheModel& m) {
    cache.emplace(gpu, m.cfg);
    const auto w_uk = arb_floats(std::size_t{m.heads} * m.dims.nope * m.dims.kv_lora);
    const auto w_uv = arb_floats(std::size_t{m.heads} * m.dims.v_head * m.dims.kv_lora);
    std::vector<Bf16> wk(w_uk.size()), wv(w_uv.size());
    std::transform(w_uk.begin(), w_uk.end(), wk.begin(), Bf16::from_float);
    std::transform(w_uv.begin(), w_uv.end(), wv.begin(), Bf16::from_float);
    dec.emplace(gpu, DeepseekMlaConfig{m.heads, m.dims, 0.25f, 1e4f, /*rotate*/ false}, wk, wv, *cache);
    base = live_serials(gpu);
  }
  ~CacheSut() {
    dec.reset();
    cache.reset();
  }
  struct Tables {
    std::vector<SeqId> seqs;
    std::vector<std::uint32_t> lens;
    std::vector<std::vector<std::int32_t>> tables;
    std::uint32_t free_blocks = 0;
    bool operator==(const Tables&) const = default;
  };
  Tables tables() const {
    Tables t{cache->sequences(), {}, {}, cache->free_blocks()};
    for (SeqId s : t.seqs) {
      t.lens.push_back(cache->seq_len(s));
      const auto bt = cache->block_table(s);
      t.tables.emplace_back(bt.begin(), bt.end());
    }
    return t;
  }
  // After every command: the tables agree with the model, no block is in two tables, and nothing
  // but the pools and the weights is allocated.
  void check(const CacheModel& m) const {
    const Tables t = tables();
    RC_ASSERT(t.seqs == m.ids());
    std::set<std::int32_t> seen;
    for (std::size_t i = 0; i < t.seqs.size(); ++i) {
      RC_ASSERT(t.lens[i] == m.seqs.at(t.seqs[i]).size());
      RC_ASSERT(t.tables[i].size() == m.blocks(t.lens[i]));
      for (std::int32_t b : t.tables[i]) {
        RC_ASSERT(b >= 0 && static_cast<std::uint32_t>(b) < m.cfg.num_blocks);
        RC_ASSERT(seen.insert(b).second);
      }
    }
    RC_ASSERT(t.free_blocks == m.cfg.num_blocks - m.used());
    RC_ASSERT(live_serials(gpu) == base);
  }
};

using CacheCmd = rc::state::Command<CacheModel, CacheSut>;

template <class F>
void require_capacity_exceeded(CacheSut& sut, const std::string& what, F&& body) {
  const auto before = sut.tables();
  try {
    body();
  } catch (const Error& e) {
    if (e.code() != Errc::capacity_exceeded)
      RC_FAIL(fmt::format("{}: {} instead of capacity_exceeded: {}", what, to_string(e.code()), e.what()));
    if (!(sut.tables() == before)) RC_FAIL(what + ": the refused batch changed the cache");
    return;
  }
  RC_FAIL(what + ": accepted past capacity");
}

struct AddSequence final : CacheCmd {
  void apply(CacheModel& m) const override { m.seqs[m.next_id++]; }
  void run(const CacheModel& m, CacheSut& sut) const override {
    RC_ASSERT(sut.cache->add_sequence() == m.next_id);
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "add_sequence"; }
};

struct FreeSequence final : CacheCmd {
  SeqId id = 0;
  explicit FreeSequence(const CacheModel& m) {
    if (!m.seqs.empty()) id = *rc::gen::elementOf(m.ids());
  }
  void checkPreconditions(const CacheModel& m) const override { RC_PRE(m.seqs.count(id) != 0u); }
  void apply(CacheModel& m) const override { m.seqs.erase(id); }
  void run(const CacheModel& m, CacheSut& sut) const override {
    sut.cache->free_sequence(id);
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "free_sequence " << id; }
};

// append_kv of a batch: runs of tokens of live sequences, a run often sized to fill its sequence
// (or the pool) exactly, or one past it.
struct Append final : CacheCmd {
  std::vector<SeqId> tokens;
  std::vector<float> latent, k_rope;
  explicit Append(const CacheModel& m) {
    if (m.seqs.empty()) return;
    for (auto runs = *in_range(1, 4); runs > 0; --runs) {
      const SeqId s = *rc::gen::elementOf(m.ids());
      const std::uint64_t room = m.room(s);
      std::uint64_t n = 0;
      switch (*in_range(0, 4)) {
        case 0: n = room; break;
        case 1: n = room + 1; break;
        default: n = *in_range<std::uint64_t>(0, 2 * m.cfg.block_size + 1);
      }
      tokens.insert(tokens.end(), std::min<std::uint64_t>(n, 64), s);  // big pools: a few tokens at a time
    }
    latent = bf16_values(arb_floats(tokens.size() * m.dims.kv_lora));
    k_rope = bf16_values(arb_floats(tokens.size() * m.dims.rope));
  }
  void checkPreconditions(const CacheModel& m) const override {
    for (SeqId s : tokens) RC_PRE(m.seqs.count(s) != 0u);
  }
  void apply(CacheModel& m) const override {
    if (!m.fits(tokens)) return;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      m.seqs[tokens[i]].push_back(
          {{latent.begin() + i * m.dims.kv_lora, latent.begin() + (i + 1) * m.dims.kv_lora},
           {k_rope.begin() + i * m.dims.rope, k_rope.begin() + (i + 1) * m.dims.rope}});
  }
  void run(const CacheModel& m, CacheSut& sut) const override {
    std::map<SeqId, std::uint32_t> len;
    std::vector<std::uint32_t> pos;
    for (SeqId s : tokens) pos.push_back(static_cast<std::uint32_t>(m.seqs.at(s).size()) + len[s]++);
    auto append = [&] { sut.dec->append_kv(tokens, latent, k_rope, pos); };
    if (m.fits(tokens)) {
      append();
    } else {
      require_capacity_exceeded(sut, fmt::format("append of {} tokens", tokens.size()), append);
    }
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << fmt::format("append_kv {}", tokens); }
};

// One decode step over distinct live sequences: each gains a token (or, past capacity, none).
struct Step final : CacheCmd {
  std::vector<SeqId> seqs;
  std::vector<float> q_nope, q_rope, latent, k_rope;
  explicit Step(const CacheModel& m) {
    for (SeqId s : m.ids())
      if (*rc::gen::arbitrary<bool>()) seqs.push_back(s);
    const std::size_t n = seqs.size();
    q_nope = arb_floats(n * m.heads * m.dims.nope);
    q_rope = arb_floats(n * m.heads * m.dims.rope);
    latent = bf16_values(arb_floats(n * m.dims.kv_lora));
    k_rope = bf16_values(arb_floats(n * m.dims.rope));
  }
  void checkPreconditions(const CacheModel& m) const override {
    RC_PRE(!seqs.empty());
    for (SeqId s : seqs) RC_PRE(m.seqs.count(s) != 0u);
  }
  void apply(CacheModel& m) const override {
    if (!m.fits(seqs)) return;
    for (std::size_t i = 0; i < seqs.size(); ++i)
      m.seqs[seqs[i]].push_back(
          {{latent.begin() + i * m.dims.kv_lora, latent.begin() + (i + 1) * m.dims.kv_lora},
           {k_rope.begin() + i * m.dims.rope, k_rope.begin() + (i + 1) * m.dims.rope}});
  }
  void run(const CacheModel& m, CacheSut& sut) const override {
    std::vector<std::uint32_t> pos;
    for (SeqId s : seqs) pos.push_back(static_cast<std::uint32_t>(m.seqs.at(s).size()));
    auto step = [&] { return sut.dec->step({seqs, q_nope, q_rope, latent, k_rope, pos}); };
    if (m.fits(seqs)) {
      for (float x : step().attn_out) RC_ASSERT(std::isfinite(x));
    } else {
      require_capacity_exceeded(sut, fmt::format("step over {}", seqs), step);
    }
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << fmt::format("step {}", seqs); }
};

// The cache's rows of one sequence against the model's tokens, encoded as the stores encode
// (no rotation: K = [latent ‖ k_rope], V = [latent ‖ 0]).
struct Download final : CacheCmd {
  SeqId id = 0;
  explicit Download(const CacheModel& m) {
    if (!m.seqs.empty()) id = *rc::gen::elementOf(m.ids());
  }
  void checkPreconditions(const CacheModel& m) const override { RC_PRE(m.seqs.count(id) != 0u); }
  void run(const CacheModel& m, CacheSut& sut) const override {
    const auto& c = m.cfg;
    const std::uint32_t w = m.dims.cache_dim();
    const auto table = sut.cache->block_table(id);
    const auto& toks = m.seqs.at(id);
    for (std::size_t j = 0; j < toks.size(); ++j) {
      std::vector<float> k(w, 0.0f), v(w, 0.0f);
      std::copy(toks[j].latent.begin(), toks[j].latent.end(), k.begin());
      std::copy(toks[j].latent.begin(), toks[j].latent.end(), v.begin());
      std::copy(toks[j].k_rope.begin(), toks[j].k_rope.end(), k.begin() + m.dims.kv_lora);
      const std::uint64_t b = static_cast<std::uint64_t>(table[j / c.block_size]), i = j % c.block_size;
      for (int which = 0; which < 2; ++which) {
        const DevicePtr pool = which == 0 ? sut.cache->k_pool() : sut.cache->v_pool();
        const auto& x = which == 0 ? k : v;
        std::vector<std::uint8_t> want, got;
        if (c.format == KvFormat::fp8) {
          const float scale = which == 0 ? c.k_scale : c.v_scale;
          for (float e : x) want.push_back(e4m3_encode(e / scale));
          got = download<std::uint8_t>(sut.gpu, pool + (b * c.block_size + i) * sut.cache->cache_stride(), w);
        } else {
          std::vector<std::uint8_t> scales;
          for (std::uint32_t g = 0; g < w / 16; ++g) {
            std::array<std::uint8_t, 8> packed{};
            std::uint8_t scale = 0;
            nvfp4_encode_group(std::span<const float, 16>(x.data() + 16 * g, 16), packed, scale);
            want.insert(want.end(), packed.begin(), packed.end());
            scales.push_back(scale);
          }
          want.insert(want.end(), scales.begin(), scales.end());
          const DevicePtr blk = pool + b * sut.cache->block_stride_bytes();
          got = download<std::uint8_t>(sut.gpu, blk + i * w / 2, w / 2);
          const auto s = download<std::uint8_t>(sut.gpu, blk + sut.cache->data_section_bytes() + i * w / 16, w / 16);
          got.insert(got.end(), s.begin(), s.end());
        }
        if (got != want)
          RC_FAIL(fmt::format("sequence {} token {}: the {} row in block {} slot {} is not the stored one", id, j,
                              which == 0 ? "K" : "V", b, i));
      }
    }
    sut.check(m);
  }
  void show(std::ostream& os) const override { os << "download " << id; }
};

// A decode whose block table has one used entry beyond the pool (or negative): the emulator must
// fault at the first block of that sequence, naming the entry and k_cache.
struct BadTableEntry final : CacheCmd {
  SeqId id = 0;
  std::uint64_t column = 0;
  std::int32_t entry = 0;
  explicit BadTableEntry(const CacheModel& m) {
    std::vector<SeqId> candidates;
    for (const auto& [s, t] : m.seqs)
      if (!t.empty()) candidates.push_back(s);
    if (candidates.empty()) return;
    id = *rc::gen::elementOf(candidates);
    column = *in_range<std::uint64_t>(0, m.blocks(m.seqs.at(id).size()));
    const auto past = static_cast<std::int32_t>(m.cfg.num_blocks);
    entry = *rc::gen::element(past, past + *in_range(1, 1000), std::numeric_limits<std::int32_t>::max(), -1,
                              -*in_range(2, 1000), std::numeric_limits<std::int32_t>::min());
  }
  void checkPreconditions(const CacheModel& m) const override {
    RC_PRE(m.seqs.count(id) != 0u);
    RC_PRE(column < m.blocks(m.seqs.at(id).size()));
  }
  void run(const CacheModel& m, CacheSut& sut) const override {
    const auto ids = m.ids();
    const auto s = static_cast<std::uint32_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
    const auto& c = m.cfg;
    const std::uint32_t cd = m.dims.cache_dim();
    std::string message;
    try {
      auto t = sut.cache->upload_tables(ids);
      upload<std::int32_t>(sut.gpu, std::vector<std::int32_t>{entry},
                           t.block_tables.ptr() + (std::uint64_t{s} * c.max_blocks_per_seq + column) * 4);
      std::vector<Bf16> q(std::size_t{t.num_seqs} * m.heads * cd, Bf16::from_float(0.5f));
      const auto dq = DeviceBuffer::from_host<Bf16>(sut.gpu, q);
      const DeviceBuffer o(sut.gpu, q.size() * sizeof(Bf16));
      const PagedDecodeCommon common{dq.ptr(),        sut.cache->k_pool(),   sut.cache->v_pool(),
                                     o.ptr(),         t.block_tables.ptr(),  t.seq_lens.ptr(),
                                     c.max_blocks_per_seq, m.heads, 1, cd, cd, c.block_size, 0.125f, t.num_seqs};
      const auto k = MlaAbsorbedKernels::resolve(sut.gpu);
      if (c.format == KvFormat::fp8) {
        mla_paged_decode_fp8(sut.gpu, k.paged_decode_fp8,
                             {common, c.k_scale, c.v_scale, sut.cache->cache_stride(), 0, {}, {}, 0});
      } else {
        mla_paged_decode_nvfp4(sut.gpu, k.paged_decode_nvfp4,
                               {common, sut.cache->block_stride_bytes(), sut.cache->data_section_bytes()});
      }
      sut.gpu.synchronize(0);
    } catch (const Error& e) {
      if (e.code() != Errc::device_fault) RC_FAIL(fmt::format("{} instead of device_fault: {}", to_string(e.code()), e.what()));
      message = e.what();
    }
    if (message.empty()) RC_FAIL(fmt::format("table entry {} of sequence {} read without a fault", entry, id));
    for (const std::string& needle :
         {std::string(c.format == KvFormat::fp8 ? "mla_paged_decode_fp8" : "mla_paged_decode_nvfp4"),
          fmt::format("block (0,{},0)", s), fmt::format("block_tables[{}][{}] = {} puts key ", s, column, entry),
          std::string(" outside k_cache: its "), std::string("pool size disagree) (allocation #")})
      if (message.find(needle) == std::string::npos)
        RC_FAIL(fmt::format("the fault does not say \"{}\": {}", needle, message));
    sut.check(m);  // the temporaries are freed and the cache is as it was
  }
  void show(std::ostream& os) const override {
    os << fmt::format("decode with table[{}][{}] = {}", id, column, entry);
  }
};

void run_cache_machine(const CacheModel& m0) {
  note_input(fmt::format("{} num_blocks {} block_size {} max_blocks_per_seq {} cache_stride {} kv_lora {} rope {} "
                         "heads {}",
                         to_string(m0.cfg.format), m0.cfg.num_blocks, m0.cfg.block_size, m0.cfg.max_blocks_per_seq,
                         m0.cfg.cache_stride, m0.dims.kv_lora, m0.dims.rope, m0.heads));
  CacheSut sut(m0);
  rc::state::check(m0, sut,
                   rc::state::gen::execOneOfWithArgs<AddSequence, AddSequence, FreeSequence, Append, Append, Step, Step,
                                                     Download, BadTableEntry>());
}

CacheModel arb_cache_model() {
  CacheModel m;
  m.dims.rope = 8;
  m.dims.kv_lora = *rc::gen::element(8u, 24u);
  m.dims.nope = *in_range<std::uint32_t>(1, 5);
  m.dims.v_head = *in_range<std::uint32_t>(1, 5);
  m.heads = *in_range<std::uint32_t>(1, 3);
  m.cfg.format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  m.cfg.num_blocks = *in_range<std::uint32_t>(1, 9);
  m.cfg.block_size = *in_range<std::uint32_t>(1, 5);
  m.cfg.max_blocks_per_seq = *in_range<std::uint32_t>(1, m.cfg.num_blocks + 1);
  m.cfg.kv_cache_dim = m.dims.cache_dim();
  m.cfg.free_list_seed = *in_range<std::uint64_t>(0, 1000);
  m.cfg.k_scale = arb_scale(0.01f, 0.5f);
  m.cfg.v_scale = arb_scale(0.01f, 0.5f);
  if (m.cfg.format == KvFormat::fp8 && *rc::gen::arbitrary<bool>()) m.cfg.cache_stride = m.dims.cache_dim() + 16;
  return m;
}

void paged_cache_machine() { run_cache_machine(arb_cache_model()); }

// Pools past 2^31 bytes: FP8 rows of a 1 GiB pitch in one-token blocks (the first block handed
// out, the last, starts past 3 GiB); NVFP4 blocks of 2^24 tokens (453 MiB each: the scales of the
// last of 5 blocks lie past 2 GiB).
void big_pool_machine() {
  CacheModel m;
  m.dims.rope = 8;
  m.dims.kv_lora = 40;
  m.dims.nope = 4;
  m.dims.v_head = 4;
  m.heads = 2;
  m.cfg.format = *rc::gen::element(KvFormat::fp8, KvFormat::nvfp4);
  m.cfg.kv_cache_dim = m.dims.cache_dim();
  if (m.cfg.format == KvFormat::fp8) {
    m.cfg.num_blocks = 4, m.cfg.block_size = 1, m.cfg.cache_stride = (1ull << 30) + (1ull << 20);
  } else {
    m.cfg.num_blocks = 5, m.cfg.block_size = 1u << 24;
  }
  m.cfg.max_blocks_per_seq = m.cfg.num_blocks;
  m.cfg.k_scale = arb_scale(0.01f, 0.5f);
  m.cfg.v_scale = arb_scale(0.01f, 0.5f);
  run_cache_machine(m);
}

// ---- MlaDeviceKv ------------------------------------------------------------------------------------------

struct KvModel {
  MlaConfig cfg;
  MlaKv kv;  // K rows as appended (decode: rotated by the float64 reference)
  std::size_t cap = 0;
};

struct KvSut {
  emu::EmulatorBackend gpu{emulator_options()};
  K3MlaDecodeKernels kernels = K3MlaDecodeKernels::resolve(gpu);
  std::optional<MlaDeviceKv> kv;
  explicit KvSut(const KvModel& m) { kv.emplace(MlaDeviceKv::alloc(gpu, m.cap, m.cfg.k_row(), m.cfg.v_row())); }
  ~KvSut() { kv.reset(); }

  // The device rows against the model's: V exactly, K within the FP32 rotation's error.
  void check(const KvModel& m) const {
    RC_ASSERT(kv->seq_len() == m.kv.seq_len);
    RC_ASSERT(kv->cap() == m.cap);
    RC_ASSERT(gpu.live_allocations().size() == (m.cap == 0 ? 0u : 2u));
    const MlaKv got = kv->download();
    RC_ASSERT(got.v == m.kv.v);
    RC_ASSERT(got.k.size() == m.kv.k.size());
    for (std::size_t i = 0; i < got.k.size(); ++i)
      if (std::fabs(got.k[i] - m.kv.k[i]) > 1e-5f)
        RC_FAIL(fmt::format("K value {} is {}, the model's {}", i, got.k[i], m.kv.k[i]));
  }
};

using KvCmd = rc::state::Command<KvModel, KvSut>;

template <class F>
void require_full(KvSut& sut, const KvModel& m, F&& body) {
  const auto calls = sut.gpu.calls();
  try {
    body();
  } catch (const Error& e) {
    if (e.code() != Errc::capacity_exceeded)
      RC_FAIL(fmt::format("{} instead of capacity_exceeded: {}", to_string(e.code()), e.what()));
    // (cap 0: freed)
    const std::string cap = m.cap == 0 ? std::string("no buffers (it was freed") : fmt::format("cap {} full", m.cap);
    if (std::string(e.what()).find(cap) == std::string::npos) RC_FAIL(fmt::format("\"{}\" not in {}", cap, e.what()));
    RC_ASSERT(sut.gpu.calls() == calls);  // refused before any backend call
    return;
  }
  RC_FAIL(fmt::format("an append at seq_len {} = cap {} was accepted", m.kv.seq_len, m.cap));
}

struct Decode final : KvCmd {
  std::vector<float> q, k, v, g;
  explicit Decode(const KvModel& m)
      : q(arb_floats(m.cfg.k_row())),
        k(arb_floats(m.cfg.k_row())),
        v(arb_floats(m.cfg.v_row())),
        g(m.cfg.mla_use_output_gate ? arb_floats(m.cfg.v_row()) : std::vector<float>{}) {}
  void apply(KvModel& m) const override {
    if (m.kv.seq_len >= m.cap) return;
    auto qr = q, kr = k;
    mla_decode_token(qr, kr, v, g, m.kv, m.cfg, static_cast<std::uint32_t>(m.kv.seq_len), 1e4f);
  }
  void run(const KvModel& m, KvSut& sut) const override {
    const auto pos = static_cast<std::uint32_t>(m.kv.seq_len);
    auto decode = [&] {
      return launch_k3_mla_decode_token_on_device(sut.gpu, sut.kernels, q, k, v, g, *sut.kv, m.cfg, pos, 1e4f);
    };
    if (m.kv.seq_len >= m.cap) {
      require_full(sut, m, decode);
    } else {
      const auto out = decode();
      MlaKv ref = m.kv;
      auto qr = q, kr = k;
      const auto want = mla_decode_token(qr, kr, v, g, ref, m.cfg, pos, 1e4f);
      RC_ASSERT(out.size() == want.size());
      for (std::size_t i = 0; i < out.size(); ++i)
        if (std::fabs(out[i] - want[i]) > 1e-4f)
          RC_FAIL(fmt::format("out[{}] = {}, the reference {}", i, out[i], want[i]));
    }
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "decode"; }
};

struct AppendRow final : KvCmd {
  std::vector<float> k, v;
  explicit AppendRow(const KvModel& m) : k(arb_floats(m.cfg.k_row())), v(arb_floats(m.cfg.v_row())) {}
  void apply(KvModel& m) const override {
    if (m.kv.seq_len < m.cap) m.kv.append(k, v);
  }
  void run(const KvModel& m, KvSut& sut) const override {
    {
      const auto row = DeviceBuffer::from_host<float>(sut.gpu, k);
      auto append = [&] { sut.kv->append_from_device(row.ptr(), v); };
      if (m.kv.seq_len >= m.cap) {
        require_full(sut, m, append);
      } else {
        append();
      }
    }
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "append_from_device"; }
};

struct Truncate final : KvCmd {
  std::size_t len = 0;
  explicit Truncate(const KvModel& m) : len(*in_range<std::size_t>(0, m.kv.seq_len + 2)) {}
  void apply(KvModel& m) const override {
    if (len <= m.kv.seq_len) m.kv.truncate(len);
  }
  void run(const KvModel& m, KvSut& sut) const override {
    if (len <= m.kv.seq_len) {
      sut.kv->truncate(len);
    } else {
      const auto before = sut.kv->seq_len();
      try {
        sut.kv->truncate(len);
        RC_FAIL("truncate past seq_len accepted");
      } catch (const Error& e) {
        RC_ASSERT(e.code() == Errc::invalid_argument);
      }
      RC_ASSERT(sut.kv->seq_len() == before);
    }
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "truncate " << len; }
};

struct FreeKv final : KvCmd {
  void apply(KvModel& m) const override {
    m.kv = {};
    m.cap = 0;
  }
  void run(const KvModel& m, KvSut& sut) const override {
    sut.kv->free();
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "free"; }
};

// A new KV holding the model's history with room for `extra` more tokens.
struct Reupload final : KvCmd {
  std::size_t extra = 0;
  explicit Reupload(const KvModel&) : extra(*in_range<std::size_t>(0, 3)) {}
  void apply(KvModel& m) const override { m.cap = std::max<std::size_t>(m.kv.seq_len + extra, 1); }
  void run(const KvModel& m, KvSut& sut) const override {
    sut.kv.reset();
    sut.kv.emplace(
        MlaDeviceKv::alloc_and_upload(sut.gpu, m.kv, m.kv.seq_len + extra, m.cfg.k_row(), m.cfg.v_row()));
    sut.check(nextState(m));
  }
  void show(std::ostream& os) const override { os << "alloc_and_upload, room for " << extra << " more"; }
};

void device_kv_machine() {
  KvModel m;
  m.cfg = arb_k3_config();
  m.cap = *in_range<std::size_t>(1, 5);
  note_input(fmt::format("heads {} nope {} rope {} v {} use_nope {} gate {} cap {}", m.cfg.heads,
                         m.cfg.qk_nope_head_dim, m.cfg.qk_rope_head_dim, m.cfg.v_head_dim, m.cfg.mla_use_nope,
                         m.cfg.mla_use_output_gate, m.cap));
  KvSut sut(m);
  rc::state::check(m, sut,
                   rc::state::gen::execOneOfWithArgs<Decode, Decode, Decode, AppendRow, Truncate, FreeKv, Reupload,
                                                     Reupload>());
}

}  // namespace

std::vector<Property> capacity_properties() {
  return {{"the paged cache under the DeepSeek decoder follows its model to capacity and past it",
           paged_cache_machine},
          {"paged caches with rows past 2^31 bytes follow the model", big_pool_machine, /*record*/ false},
          {"MlaDeviceKv follows its model to capacity and past it", device_kv_machine}};
}

}  // namespace metrale::props
