// PagedKvCache (SPEC §3 "Paged layout"): config validation, the block
// allocator, all-or-nothing slot reservations and the uploaded tables, on the
// emulator. Expected tables and slots come from the rules written out here:
// with free_list_seed 0 the k-th block handed out is num_blocks − 1 − k, and
// slot = table[len / block_size] * block_size + len % block_size. The
// properties at the end run random operations against a small model and a twin
// cache that never sees a failed or dropped reservation, so any state a failure
// leaves behind (free-list order included) shows up as a difference.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <rapidcheck/catch.h>

#include "metrale/buffer.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/paged_cache.hpp"
#include "support.hpp"

namespace metrale {
// The cache's friend for tests: the next sequence id, to reach the wrap without 2^32 calls.
struct PagedKvCacheTestPeer {
  static void set_next_seq(PagedKvCache& c, SeqId id) { c.next_seq_ = id; }
};
}  // namespace metrale

namespace {

using namespace metrale;
using test::require_error;

// Everything observable about a cache's sequences and its free-block count.
struct Snapshot {
  std::vector<SeqId> seqs;
  std::vector<std::uint32_t> lens;
  std::vector<std::vector<std::int32_t>> tables;
  std::uint32_t free_blocks = 0, used_blocks = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const PagedKvCache& c) {
  Snapshot s;
  s.seqs = c.sequences();
  for (SeqId id : s.seqs) {
    s.lens.push_back(c.seq_len(id));
    const auto t = c.block_table(id);
    s.tables.emplace_back(t.begin(), t.end());
  }
  s.free_blocks = c.free_blocks();
  s.used_blocks = c.used_blocks();
  return s;
}

std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  return os << fmt::format("seqs {} lens {} tables {} free {} used {}", s.seqs, s.lens, s.tables, s.free_blocks,
                           s.used_blocks);
}

emu::EmulatorOptions test_options() {
  emu::EmulatorOptions o;
  o.threads = 1;  // the cache launches nothing
  return o;
}

// A small FP8 cache: rows of 16 values, so pools stay tiny.
PagedCacheConfig small_config(std::uint32_t num_blocks, std::uint32_t block_size, std::uint32_t max_blocks = 0,
                              std::uint64_t seed = 0) {
  PagedCacheConfig cfg;
  cfg.num_blocks = num_blocks;
  cfg.block_size = block_size;
  cfg.kv_cache_dim = 16;
  cfg.max_blocks_per_seq = max_blocks;
  cfg.free_list_seed = seed;
  return cfg;
}

std::uint32_t blocks_for(std::uint64_t len, std::uint32_t block_size) {
  return static_cast<std::uint32_t>((len + block_size - 1) / block_size);
}

// The order the free list hands blocks out, observed without changing the cache: one new
// sequence per free block takes one block each, then the reservation is dropped and the
// (empty) sequences are freed. Sequence ids move on; nothing else does.
std::vector<std::int32_t> free_list_order(PagedKvCache& c) {
  std::vector<SeqId> probes;
  for (std::uint32_t i = 0; i < c.free_blocks(); ++i) probes.push_back(c.add_sequence());
  std::vector<std::int32_t> order;
  {
    const auto r = c.reserve(probes);
    for (SeqId s : probes) order.push_back(c.block_table(s)[0]);
  }
  for (SeqId s : probes) c.free_sequence(s);
  return order;
}

// The allocator of SPEC + config doc for a cache with free_list_seed 0 that has never freed a
// block: tokens in order; a token at a block boundary takes the next block in descending order.
struct DescendingModel {
  std::uint32_t block_size;
  std::int32_t next;  // the next block handed out
  std::map<SeqId, std::uint32_t> lens;
  std::map<SeqId, std::vector<std::int32_t>> tables;

  DescendingModel(std::uint32_t num_blocks, std::uint32_t bs)
      : block_size(bs), next(static_cast<std::int32_t>(num_blocks) - 1) {}

  std::vector<std::int32_t> reserve(std::span<const SeqId> tokens) {
    std::vector<std::int32_t> slots;
    for (SeqId s : tokens) {
      auto& len = lens[s];
      auto& table = tables[s];
      if (len % block_size == 0) table.push_back(next--);
      const auto bs = static_cast<std::int32_t>(block_size);
      slots.push_back(table[len / block_size] * bs + static_cast<std::int32_t>(len % block_size));
      ++len;
    }
    return slots;
  }
};

std::vector<std::int32_t> to_vector(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// ---- configuration --------------------------------------------------------------

TEST_CASE("paged cache: config validation names the field", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  PagedCacheConfig cfg = small_config(4, 16);
  REQUIRE_NOTHROW(PagedKvCache(gpu, cfg));
  const auto allocs = gpu.calls(emu::Op::alloc);
  auto reject = [&](std::initializer_list<std::string> needles) {
    require_error([&] { PagedKvCache c(gpu, cfg); }, Errc::invalid_argument, needles);
    CHECK(gpu.calls(emu::Op::alloc) == allocs);  // rejected before any pool is allocated
    CHECK(gpu.live_allocations().empty());
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();

  SECTION("num_blocks 0") { cfg.num_blocks = 0; reject({"paged cache", "num_blocks is 0"}); }
  SECTION("block_size 0") { cfg.block_size = 0; reject({"paged cache", "block_size is 0"}); }
  SECTION("num_kv_heads 0") { cfg.num_kv_heads = 0; reject({"paged cache", "num_kv_heads is 0"}); }
  SECTION("kv_cache_dim 0") { cfg.kv_cache_dim = 0; reject({"paged cache", "kv_cache_dim is 0"}); }
  SECTION("slots past INT32_MAX") {
    cfg.num_blocks = 65536;  // 65536 x 32768 = 2^31 slots: slot 2^31 − 1 + 1 does not fit an int32
    cfg.block_size = 32768;
    reject({"num_blocks 65536", "block_size 32768", "int32"});
  }
  SECTION("row width past 32 bits") {
    cfg.num_kv_heads = 65536;  // 65536 x 65536 = 2^32 values: the kernels' row_width is a u32
    cfg.kv_cache_dim = 65536;
    reject({"row width 4294967296", "num_kv_heads 65536", "kv_cache_dim 65536"});
  }
  SECTION("fp8 pool past 2^64 bytes") {
    cfg.num_blocks = 2;  // 2 slots x (2^63 + 8) bytes = 2^64 + 16: would wrap to a 16-byte pool
    cfg.block_size = 1;
    cfg.cache_stride = (std::uint64_t{1} << 63) + 8;
    reject({"cache_stride 9223372036854775816", "2 slots"});
  }
  // Before: accepted, then refused at the first decode by a limit the user never set.
  SECTION("fp8 block_size x cache_stride reaching 2^32") {
    cfg.num_blocks = 1, cfg.block_size = 1u << 22, cfg.cache_stride = 1024;
    reject({"block_size 4194304 x cache_stride 1024 reaches 2^32"});
  }
  SECTION("an nvfp4 block of 2^32 bytes") {
    cfg.format = KvFormat::nvfp4, cfg.num_blocks = 1, cfg.block_size = 1u << 23, cfg.kv_cache_dim = 1024;
    reject({"an nvfp4 block of block_size 8388608 x row width 1024", "reaching 2^32"});
  }
  SECTION("fp8 cache_stride < row width") {
    cfg.num_kv_heads = 2;  // row width 32
    cfg.cache_stride = 31;
    reject({"cache_stride 31", "row width 32"});
  }
  SECTION("fp8 k_scale not finite or not positive") {
    for (const auto& [x, text] : std::vector<std::pair<float, std::string>>{
             {0.0f, "k_scale 0"}, {-1.0f, "k_scale -1"}, {inf, "k_scale inf"}, {nan, "k_scale nan"}}) {
      cfg.k_scale = x;
      reject({text});
    }
  }
  SECTION("fp8 v_scale not finite or not positive") {
    for (const auto& [x, text] : std::vector<std::pair<float, std::string>>{
             {0.0f, "v_scale 0"}, {-1.0f, "v_scale -1"}, {-inf, "v_scale -inf"}, {nan, "v_scale nan"}}) {
      cfg.v_scale = x;
      reject({text});
    }
  }
  SECTION("nvfp4 row width not a multiple of 16") {
    cfg.format = KvFormat::nvfp4;
    cfg.num_kv_heads = 3;
    cfg.kv_cache_dim = 8;  // row width 24
    reject({"nvfp4", "row width 24", "16"});
  }
  SECTION("fp8 latent pool with two scales") {
    cfg.latent = true, cfg.k_scale = 0.5f, cfg.v_scale = 0.25f;
    reject({"a latent pool has one scale", "k_scale 0.5 and v_scale 0.25 differ"});
  }
  // Before: accepted, and every decode over the cache then refused.
  SECTION("fp8 scale times the largest code past FP32's range") {
    cfg.k_scale = 1e38f;
    reject({"k_scale 1e+38 times the largest E4M3 code (448)", "FP32"});
    cfg.k_scale = 1.0f, cfg.v_scale = 7.6e36f;
    reject({"v_scale 7.6e+36"});
    cfg.v_scale = 7.5e35f;  // 448 x 7.5e35 = 3.36e38: still finite
    REQUIRE_NOTHROW(PagedKvCache(gpu, cfg));
  }
  // Before: accepted and run as NVFP4 (any value other than fp8 was taken for it).
  SECTION("a format outside the enum") {
    cfg.format = static_cast<KvFormat>(7);
    reject({"format 7 is neither fp8 (0) nor nvfp4 (1)"});
  }
}

TEST_CASE("paged cache: kv format names", "[paged_cache]") {
  CHECK(parse_kv_format("fp8") == KvFormat::fp8);
  CHECK(parse_kv_format("nvfp4") == KvFormat::nvfp4);
  CHECK(to_string(KvFormat::fp8) == "fp8");
  CHECK(to_string(KvFormat::nvfp4) == "nvfp4");
  require_error([] { parse_kv_format("fp16"); }, Errc::invalid_argument, {"'fp16'"});
}

TEST_CASE("paged cache: defaults and pool sizes", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  SECTION("fp8: cache_stride defaults to the row width rounded up to 16") {
    PagedCacheConfig cfg = small_config(5, 3);
    cfg.num_kv_heads = 3;
    cfg.kv_cache_dim = 7;  // row width 21 -> stride 32
    PagedKvCache c(gpu, cfg);
    CHECK(c.row_width() == 21);
    CHECK(c.cache_stride() == 32);
    CHECK(c.max_blocks_per_seq() == 5);  // 0 = num_blocks
    CHECK(c.pool_bytes() == 5 * 3 * 32);
    CHECK(c.free_blocks() == 5);
    CHECK(c.used_blocks() == 0);
    CHECK(c.k_pool() != c.v_pool());
    const auto live = gpu.live_allocations();
    REQUIRE(live.size() == 2);
    CHECK(live[0].bytes == 5 * 3 * 32);
    CHECK(live[1].bytes == 5 * 3 * 32);
  }
  SECTION("fp8: an explicit cache_stride is kept") {
    PagedCacheConfig cfg = small_config(2, 4, 1);
    cfg.cache_stride = 40;  // ≥ 16, not a multiple of 16
    PagedKvCache c(gpu, cfg);
    CHECK(c.cache_stride() == 40);
    CHECK(c.max_blocks_per_seq() == 1);
    CHECK(c.pool_bytes() == 2 * 4 * 40);
  }
  SECTION("nvfp4: 16-aligned sections") {
    PagedCacheConfig cfg = small_config(7, 3);
    cfg.format = KvFormat::nvfp4;
    cfg.kv_cache_dim = 48;  // 3 x 48 / 2 = 72 data bytes -> 80; + 3 x 48 / 16 = 9 scales -> 89 -> 96
    PagedKvCache c(gpu, cfg);
    CHECK(c.data_section_bytes() == 80);
    CHECK(c.block_stride_bytes() == 96);
    CHECK(c.pool_bytes() == 7 * 96);
  }
  SECTION("latent: one pool for K and V") {
    PagedCacheConfig cfg = small_config(5, 3);
    cfg.latent = true, cfg.k_scale = cfg.v_scale = 0.25f;
    PagedKvCache c(gpu, cfg);
    CHECK(c.v_pool() == c.k_pool());
    const auto live = gpu.live_allocations();
    REQUIRE(live.size() == 1);
    CHECK(live[0].bytes == c.pool_bytes());
  }
  CHECK(gpu.live_allocations().empty());  // the pools went with the cache
}

// ---- the allocator ----------------------------------------------------------------

TEST_CASE("paged cache: add, reserve, commit and free", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  PagedKvCache c(gpu, small_config(6, 4));
  const SeqId a = c.add_sequence(), b = c.add_sequence();
  CHECK(a != b);
  CHECK(c.contains(a));
  CHECK(c.sequences() == std::vector<SeqId>{a, b});
  CHECK(c.seq_len(a) == 0);
  CHECK(c.block_table(a).empty());

  // a takes 5, b takes 4, a's fifth token takes 3: slots 5·4+0..3, 4·4+0..1, 3·4+0.
  const std::vector<SeqId> tokens{a, a, b, a, b, a, a};
  DescendingModel model(6, 4);
  const auto expected = model.reserve(tokens);
  REQUIRE(expected == std::vector<std::int32_t>{20, 21, 16, 22, 17, 23, 12});
  {
    auto r = c.reserve(tokens);
    CHECK(to_vector(r.slot_mapping()) == expected);
    CHECK(c.seq_len(a) == 5);  // reserved tokens count as used until the reservation ends
    CHECK(c.free_blocks() == 3);
    r.commit();
  }
  CHECK(c.seq_len(a) == 5);
  CHECK(c.seq_len(b) == 2);
  CHECK(to_vector(c.block_table(a)) == std::vector<std::int32_t>{5, 3});
  CHECK(to_vector(c.block_table(b)) == std::vector<std::int32_t>{4});
  CHECK(c.free_blocks() == 3);
  CHECK(c.used_blocks() == 3);

  // b fills its block (slots 18, 19) and then takes the next descending block, 2.
  {
    auto r = c.reserve(std::vector<SeqId>{b, b, b});
    CHECK(to_vector(r.slot_mapping()) == std::vector<std::int32_t>{18, 19, 8});
    r.commit();
  }
  CHECK(to_vector(c.block_table(b)) == std::vector<std::int32_t>{4, 2});

  c.free_sequence(a);
  CHECK_FALSE(c.contains(a));
  CHECK(c.sequences() == std::vector<SeqId>{b});
  CHECK(c.free_blocks() == 4);
  CHECK(c.used_blocks() == 2);
  CHECK(to_vector(c.block_table(b)) == std::vector<std::int32_t>{4, 2});

  // A new sequence gets a new id; its blocks come from the free set {0, 1, 3, 5}.
  const SeqId d = c.add_sequence();
  CHECK(d != a);
  CHECK(d != b);
  {
    auto r = c.reserve(std::vector<SeqId>{d, d, d, d, d});
    r.commit();
    const auto t = to_vector(c.block_table(d));
    REQUIRE(t.size() == 2);
    CHECK(t[0] != t[1]);
    for (std::int32_t blk : t) CHECK(std::set<std::int32_t>{0, 1, 3, 5}.count(blk) == 1);
    std::vector<std::int32_t> want;
    for (std::uint32_t j = 0; j < 5; ++j) want.push_back(t[j / 4] * 4 + static_cast<std::int32_t>(j % 4));
    CHECK(to_vector(r.slot_mapping()) == want);
  }
  CHECK(c.free_blocks() == 2);

  // An empty reservation is fine and changes nothing.
  const Snapshot before = snapshot(c);
  {
    auto r = c.reserve(std::span<const SeqId>{});
    CHECK(r.slot_mapping().empty());
    r.commit();
  }
  CHECK(snapshot(c) == before);
}

TEST_CASE("paged cache: sequence ids wrap past 2^32 - 1 and never reuse a live one", "[paged_cache]") {
  // Before: the counter wrapped to a live id, add_sequence returned it (its tokens and blocks
  // included), and freeing the "new" sequence freed the old one.
  emu::EmulatorBackend gpu(test_options());
  PagedKvCache c(gpu, small_config(6, 4));
  const SeqId a = c.add_sequence(), b = c.add_sequence();  // 0, 1
  REQUIRE((a == 0 && b == 1));
  c.reserve(std::vector<SeqId>{a, a}).commit();
  PagedKvCacheTestPeer::set_next_seq(c, std::numeric_limits<SeqId>::max());
  const SeqId last = c.add_sequence();
  CHECK(last == std::numeric_limits<SeqId>::max());
  const SeqId d = c.add_sequence();  // wraps past 0 (a) and 1 (b), both live
  CHECK(d == 2);
  CHECK(c.seq_len(d) == 0);
  c.free_sequence(d);
  CHECK(c.seq_len(a) == 2);  // a untouched
  CHECK(c.contains(b));
}

TEST_CASE("paged cache: free_list_seed 0 hands blocks out in descending order", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  SECTION("seed 0") {
    PagedKvCache c(gpu, small_config(7, 1));
    CHECK(free_list_order(c) == std::vector<std::int32_t>{6, 5, 4, 3, 2, 1, 0});
    const SeqId s = c.add_sequence();
    auto r = c.reserve(std::vector<SeqId>(7, s));
    CHECK(to_vector(r.slot_mapping()) == std::vector<std::int32_t>{6, 5, 4, 3, 2, 1, 0});
    CHECK(to_vector(c.block_table(s)) == std::vector<std::int32_t>{6, 5, 4, 3, 2, 1, 0});
    CHECK(c.free_blocks() == 0);
  }
  SECTION("another seed: a permutation, the same for the same seed") {
    PagedKvCache c1(gpu, small_config(40, 2, 0, 12345));
    PagedKvCache c2(gpu, small_config(40, 2, 0, 12345));
    const auto o1 = free_list_order(c1);
    CHECK(o1 == free_list_order(c2));
    auto sorted = o1;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int32_t> all(40);
    for (std::int32_t i = 0; i < 40; ++i) all[static_cast<std::size_t>(i)] = i;
    CHECK(sorted == all);
  }
}

// Two caches of one config; `twin` gets the same operations except the failing one.
struct Twins {
  emu::EmulatorBackend gpu{test_options()};
  PagedKvCache main, twin;
  explicit Twins(const PagedCacheConfig& cfg) : main(gpu, cfg), twin(gpu, cfg) {}

  SeqId add() {
    const SeqId s = main.add_sequence();
    REQUIRE(twin.add_sequence() == s);
    return s;
  }
  void reserve_both(const std::vector<SeqId>& tokens) {
    auto r1 = main.reserve(tokens);
    auto r2 = twin.reserve(tokens);
    REQUIRE(to_vector(r1.slot_mapping()) == to_vector(r2.slot_mapping()));
    r1.commit();
    r2.commit();
  }
  void free_both(SeqId s) {
    main.free_sequence(s);
    twin.free_sequence(s);
  }
  // The failed reservation left nothing behind: same tables, lens and free count, and the
  // free list hands out the same blocks in the same order.
  void require_same() {
    CHECK(snapshot(main) == snapshot(twin));
    CHECK(free_list_order(main) == free_list_order(twin));
  }
};

TEST_CASE("paged cache: a full pool rejects the next token and changes nothing", "[paged_cache]") {
  Twins t(small_config(4, 3));  // 12 slots
  const SeqId a = t.add(), b = t.add();
  t.reserve_both({a, b, a, a, a, b, b, a, a, b, b, b});  // a: 6 tokens (2 blocks), b: 6 (2 blocks)
  REQUIRE(t.main.free_blocks() == 0);
  REQUIRE(t.main.used_blocks() == 4);
  const Snapshot full = snapshot(t.main);

  for (SeqId s : {a, b}) {
    require_error([&] { t.main.reserve(std::vector<SeqId>{s}); }, Errc::capacity_exceeded,
                  {fmt::format("sequence {}", s), "no free block"});
    CHECK(snapshot(t.main) == full);
  }
  t.require_same();

  // A later reservation after a free gets the same slots as on the twin.
  t.free_both(a);
  const SeqId d = t.add();
  t.reserve_both({d, d, d, d, d});  // 2 blocks: the two a freed
  t.require_same();
}

TEST_CASE("paged cache: max_blocks_per_seq caps a sequence", "[paged_cache]") {
  Twins t(small_config(8, 3, 2));  // 2 blocks of 3 tokens per sequence
  const SeqId a = t.add(), b = t.add();
  t.reserve_both({a, a, a, a, a, a});
  REQUIRE(t.main.seq_len(a) == 6);
  const Snapshot before = snapshot(t.main);
  require_error([&] { t.main.reserve(std::vector<SeqId>{a}); }, Errc::capacity_exceeded,
                {fmt::format("sequence {}", a), "max_blocks_per_seq 2"});
  CHECK(snapshot(t.main) == before);
  CHECK(t.main.free_blocks() == 6);  // the pool still has room: only the table is full
  t.require_same();
  // Another sequence is not affected.
  t.reserve_both({b, b, b, b});
  t.require_same();
}

TEST_CASE("paged cache: a reservation that does not fit entirely changes nothing", "[paged_cache]") {
  Twins t(small_config(6, 2, 3));  // 6 blocks of 2 tokens, 3 per sequence
  const SeqId a = t.add(), b = t.add(), c = t.add();
  t.reserve_both({a});  // a: 1 token in 1 block; 5 blocks free
  const Snapshot before = snapshot(t.main);

  SECTION("the pool runs out part-way") {
    // a +5 tokens (6 in 3 blocks: +2), b 6 tokens (+3), c 2 tokens (+1): 6 new blocks > 5 free,
    // though every sequence stays within 3 blocks and the first tokens fit.
    require_error(
        [&] {
          t.main.reserve(std::vector<SeqId>{a, b, b, c, a, b, b, a, c, b, b, a, a});
        },
        Errc::capacity_exceeded, {"sequence", "no free block", "more blocks than the 5 of 6 that were free"});
  }
  SECTION("one sequence's table is full part-way") {
    // b's seventh token needs a fourth column; the pool has room for it.
    // (Before: "sequence 1 is full at 6 tokens", the count part-way through the reservation.)
    require_error(
        [&] {
          t.main.reserve(std::vector<SeqId>{a, b, b, b, b, c, b, b, b});
        },
        Errc::capacity_exceeded,
        {fmt::format("sequence {} holds 0 tokens and cannot take the 7 this reservation asks for: it is "
                     "full at 6 (max_blocks_per_seq 3 x block_size 2)",
                     b)});
  }
  CHECK(snapshot(t.main) == before);
  t.require_same();
  // No reservation stays open: the next one works.
  t.reserve_both({b, b, a, c});
  t.require_same();
}

TEST_CASE("paged cache: an uncommitted reservation rolls back exactly", "[paged_cache]") {
  Twins t(small_config(10, 4, 0, 99));  // a shuffled free list: order must be restored exactly
  const SeqId a = t.add(), b = t.add(), c = t.add();
  t.reserve_both({a, a, a, b, b, b, b, b});  // a: 3 tokens (1 block), b: 5 tokens (2 blocks)
  const Snapshot before = snapshot(t.main);

  SECTION("destroyed") {
    auto r = t.main.reserve(std::vector<SeqId>{c, a, a, b, c, c, c, c, a, b});
    CHECK(t.main.seq_len(a) == 6);
    CHECK(t.main.seq_len(c) == 5);
    CHECK(t.main.free_blocks() == 10 - 3 - 3);  // a +1 block, c +2
  }
  SECTION("moved, then destroyed") {
    std::optional<SlotReservation> outer;
    {
      auto r = t.main.reserve(std::vector<SeqId>{c, c, c, c, c, b, b, b, b});
      outer.emplace(std::move(r));
    }  // the moved-from reservation rolls nothing back
    CHECK(t.main.seq_len(c) == 5);
    CHECK(t.main.seq_len(b) == 9);
    outer.reset();
  }
  CHECK(snapshot(t.main) == before);
  t.require_same();
}

// A moved cache would leave its reservation and decoders on a dead one (the 35th session's helpers:
// std::terminate, then a use after free through a decoder, after the implicit move).
static_assert(!std::is_move_constructible_v<PagedKvCache> && !std::is_copy_constructible_v<PagedKvCache>);

TEST_CASE("paged cache: a reservation may outlive its cache", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  std::optional<PagedKvCache> cache(std::in_place, gpu, small_config(4, 2));
  const SeqId a = cache->add_sequence();
  auto r = cache->reserve(std::vector<SeqId>{a, a, a});
  const std::vector<std::int32_t> slots(r.slot_mapping().begin(), r.slot_mapping().end());
  cache.reset();  // (AddressSanitizer: the reservation's end below must not reach the freed cache)
  CHECK(std::vector<std::int32_t>(r.slot_mapping().begin(), r.slot_mapping().end()) == slots);
  r.commit();  // commits to nothing
}

TEST_CASE("paged cache: one reservation at a time", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  PagedKvCache c(gpu, small_config(8, 2));
  const SeqId a = c.add_sequence(), b = c.add_sequence();
  {
    auto r = c.reserve(std::vector<SeqId>{a, a, a});
    const Snapshot during = snapshot(c);
    require_error([&] { c.reserve(std::vector<SeqId>{b}); }, Errc::internal, {"outstanding"});
    require_error([&] { c.add_sequence(); }, Errc::internal, {"outstanding"});
    require_error([&] { c.free_sequence(b); }, Errc::internal, {"outstanding"});
    CHECK(snapshot(c) == during);  // the refused calls changed nothing
    r.commit();
  }
  CHECK(c.seq_len(a) == 3);
  auto r = c.reserve(std::vector<SeqId>{b});  // committed: a new reservation may open
  CHECK(r.slot_mapping().size() == 1);
}

TEST_CASE("paged cache: unknown sequences are not_found naming the id", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  PagedKvCache c(gpu, small_config(4, 2));
  const SeqId a = c.add_sequence();
  {
    auto r = c.reserve(std::vector<SeqId>{a, a, a});
    r.commit();
  }
  const Snapshot before = snapshot(c);
  const SeqId missing = 4242;
  require_error([&] { c.seq_len(missing); }, Errc::not_found, {"sequence 4242"});
  require_error([&] { c.block_table(missing); }, Errc::not_found, {"sequence 4242"});
  require_error([&] { c.free_sequence(missing); }, Errc::not_found, {"sequence 4242"});
  require_error([&] { c.reserve(std::vector<SeqId>{a, a, missing}); }, Errc::not_found, {"sequence 4242"});
  const auto live = gpu.live_allocations().size();
  require_error([&] { c.upload_tables(std::vector<SeqId>{a, missing}); }, Errc::not_found, {"sequence 4242"});
  CHECK(gpu.live_allocations().size() == live);
  CHECK(snapshot(c) == before);

  c.free_sequence(a);
  require_error([&] { c.free_sequence(a); }, Errc::not_found, {fmt::format("sequence {}", a)});
  // The failed reserve left no reservation open.
  const SeqId b = c.add_sequence();
  auto r = c.reserve(std::vector<SeqId>{b});
  CHECK(r.slot_mapping().size() == 1);
}

TEST_CASE("paged cache: upload_tables", "[paged_cache]") {
  emu::EmulatorBackend gpu(test_options());
  {
    PagedKvCache c(gpu, small_config(8, 2, 4));
    const SeqId a = c.add_sequence(), b = c.add_sequence(), d = c.add_sequence();
    const std::vector<SeqId> tokens{a, a, a, a, a, d, d};  // a: blocks 7, 6, 5; d: block 4
    {
      auto r = c.reserve(tokens);
      r.commit();
    }
    const std::vector<SeqId> order{d, a, b};
    const std::vector<std::int32_t> lens{2, 5, 0};

    auto check = [&](std::int32_t fill, const PagedKvCache::DeviceTables& t) {
      const std::int32_t f = fill;
      CHECK(t.num_seqs == 3);
      CHECK(t.block_tables.bytes() == 3 * 4 * sizeof(std::int32_t));
      CHECK(download<std::int32_t>(gpu, t.block_tables.ptr(), 12) ==
            std::vector<std::int32_t>{4, f, f, f, 7, 6, 5, f, f, f, f, f});
      CHECK(download<std::int32_t>(gpu, t.seq_lens.ptr(), 3) == lens);
    };
    SECTION("unused columns hold -1 by default") {
      const auto t = c.upload_tables(order);
      check(-1, t);
      CHECK(t.max_blocks_per_seq == 4);
    }
    SECTION("fitted: as wide as the longest of the tables") {
      const auto t = c.upload_tables(order, -1, PagedKvCache::TableWidth::fitted);
      CHECK(t.max_blocks_per_seq == 3);  // a's three blocks
      CHECK(t.block_tables.bytes() == 3 * 3 * sizeof(std::int32_t));
      CHECK(download<std::int32_t>(gpu, t.block_tables.ptr(), 9) ==
            std::vector<std::int32_t>{4, -1, -1, 7, 6, 5, -1, -1, -1});
      CHECK(download<std::int32_t>(gpu, t.seq_lens.ptr(), 3) == lens);
      const auto empty = c.upload_tables(std::vector<SeqId>{b}, -1, PagedKvCache::TableWidth::fitted);
      CHECK(empty.max_blocks_per_seq == 1);  // at least one column: a kernel's capacity is then one block
      CHECK(download<std::int32_t>(gpu, empty.block_tables.ptr(), 1) == std::vector<std::int32_t>{-1});
    }
    SECTION("or INT32_MAX when asked") {
      const std::int32_t big = std::numeric_limits<std::int32_t>::max();
      check(big, c.upload_tables(order, big));
    }
    SECTION("no sequences") {
      const auto before = gpu.live_allocations().size();
      const auto t = c.upload_tables({});
      CHECK(t.num_seqs == 0);
      CHECK(gpu.live_allocations().size() == before);
    }
    SECTION("the default width is num_blocks") {
      PagedKvCache wide(gpu, small_config(3, 5));
      const SeqId s = wide.add_sequence();
      {
        auto r = wide.reserve(std::vector<SeqId>(6, s));  // blocks 2, 1
        r.commit();
      }
      const auto t = wide.upload_tables(std::vector<SeqId>{s});
      CHECK(download<std::int32_t>(gpu, t.block_tables.ptr(), 3) == std::vector<std::int32_t>{2, 1, -1});
      CHECK(download<std::int32_t>(gpu, t.seq_lens.ptr(), 1) == std::vector<std::int32_t>{6});
    }
  }
  CHECK(gpu.live_allocations().empty());  // tables and pools freed
}

// ---- properties -------------------------------------------------------------------

// What the model knows: the live sequences and their lengths.
struct Model {
  std::uint32_t num_blocks, block_size, width;
  std::map<SeqId, std::uint32_t> lens;

  std::uint32_t used() const {
    std::uint32_t n = 0;
    for (const auto& [s, len] : lens) n += blocks_for(len, block_size);
    return n;
  }
  // A reservation fits when no sequence needs more than `width` blocks and the new blocks
  // together fit the free ones.
  bool fits(const std::vector<SeqId>& tokens) const {
    std::map<SeqId, std::uint32_t> extra;
    for (SeqId s : tokens) ++extra[s];
    std::uint64_t new_blocks = 0;
    for (const auto& [s, k] : extra) {
      const std::uint32_t len = lens.at(s);
      const std::uint32_t after = blocks_for(std::uint64_t{len} + k, block_size);
      if (after > width) return false;
      new_blocks += after - blocks_for(len, block_size);
    }
    return new_blocks <= num_blocks - used();
  }
};

// Invariants (a), (b), (d) of a cache against the model, and the twin's agreement.
void check_invariants(PagedKvCache& c, PagedKvCache& twin, const Model& m) {
  const Snapshot s = snapshot(c);
  std::vector<SeqId> ids;
  for (const auto& [id, len] : m.lens) ids.push_back(id);
  RC_ASSERT(s.seqs == ids);
  // (b) block accounting.
  RC_ASSERT(s.used_blocks + s.free_blocks == m.num_blocks);
  RC_ASSERT(s.used_blocks == m.used());
  // (a) every live block in exactly one table, in range, and not on the free list.
  std::set<std::int32_t> live;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    RC_ASSERT(s.lens[i] == m.lens.at(ids[i]));
    RC_ASSERT(s.tables[i].size() == blocks_for(s.lens[i], m.block_size));
    for (std::int32_t b : s.tables[i]) {
      RC_ASSERT(b >= 0);
      RC_ASSERT(static_cast<std::uint32_t>(b) < m.num_blocks);
      RC_ASSERT(live.insert(b).second);
    }
  }
  const auto free_order = free_list_order(c);
  RC_ASSERT(free_order.size() == s.free_blocks);
  for (std::int32_t b : free_order) {
    RC_ASSERT(live.count(b) == 0U);
    RC_ASSERT(b >= 0);
    RC_ASSERT(static_cast<std::uint32_t>(b) < m.num_blocks);
  }
  RC_ASSERT(std::set<std::int32_t>(free_order.begin(), free_order.end()).size() == free_order.size());
  // (d) every live token has its own slot.
  std::set<std::int64_t> slots;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (std::uint32_t j = 0; j < s.lens[i]; ++j) {
      const std::int64_t slot = std::int64_t{s.tables[i][j / m.block_size]} * m.block_size + j % m.block_size;
      RC_ASSERT(slots.insert(slot).second);
    }
  }
  // The twin never saw a failed or dropped reservation: everything must agree, free list too.
  RC_ASSERT(snapshot(twin) == s);
  RC_ASSERT(free_list_order(twin) == free_order);
}

TEST_CASE("paged cache: random operations against a model", "[paged_cache][property]") {
  rc::prop("add, reserve, commit or drop, free", [] {
    const auto num_blocks = *rc::gen::inRange<std::uint32_t>(1, 65);
    const auto block_size = *rc::gen::inRange<std::uint32_t>(1, 18);
    const auto max_blocks = *rc::gen::inRange<std::uint32_t>(0, num_blocks + 1);
    const auto seed = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::arbitrary<std::uint64_t>());
    const PagedCacheConfig cfg = small_config(num_blocks, block_size, max_blocks, seed);
    RC_LOG() << "num_blocks " << num_blocks << " block_size " << block_size << " max_blocks_per_seq " << max_blocks
             << " seed " << seed << "\n";

    emu::EmulatorBackend gpu(test_options());
    {
      PagedKvCache cache(gpu, cfg), twin(gpu, cfg);
      Model m{num_blocks, block_size, max_blocks == 0 ? num_blocks : max_blocks, {}};
      const int steps = *rc::gen::inRange(1, 41);
      for (int step = 0; step < steps; ++step) {
        const int kind = *rc::gen::inRange(0, 10);
        if (kind < 2 || m.lens.empty()) {  // add a sequence
          const SeqId id = cache.add_sequence();
          RC_ASSERT(twin.add_sequence() == id);
          RC_ASSERT(m.lens.count(id) == 0U);
          m.lens[id] = 0;
          RC_LOG() << "add " << id << "\n";
        } else if (kind < 4) {  // free one
          const auto pick = *rc::gen::inRange<std::size_t>(0, m.lens.size());
          const SeqId id = std::next(m.lens.begin(), static_cast<std::ptrdiff_t>(pick))->first;
          cache.free_sequence(id);
          twin.free_sequence(id);
          m.lens.erase(id);
          RC_LOG() << "free " << id << "\n";
        } else {  // reserve: a few runs of tokens of random live sequences, interleaved by runs
          const bool big = *rc::gen::inRange(0, 4) == 0;
          const std::uint32_t max_run = big ? num_blocks * block_size / 2 + block_size : 2 * block_size;
          const auto runs = *rc::gen::inRange(0, 5);
          std::vector<SeqId> tokens;
          for (int i = 0; i < runs; ++i) {
            const auto pick = *rc::gen::inRange<std::size_t>(0, m.lens.size());
            const auto count = *rc::gen::inRange<std::uint32_t>(0, max_run + 1);
            const SeqId id = std::next(m.lens.begin(), static_cast<std::ptrdiff_t>(pick))->first;
            tokens.insert(tokens.end(), count, id);
          }
          const bool commit = *rc::gen::arbitrary<bool>();
          RC_LOG() << "reserve " << tokens.size() << " tokens, " << (commit ? "commit" : "drop") << "\n";
          const Snapshot before = snapshot(cache);
          if (!m.fits(tokens)) {
            // (c) a reservation that cannot fit fails as a whole.
            bool threw = false;
            try {
              auto r = cache.reserve(tokens);
            } catch (const Error& e) {
              RC_ASSERT(e.code() == Errc::capacity_exceeded);
              threw = true;
            }
            RC_ASSERT(threw);
            RC_ASSERT(snapshot(cache) == before);
          } else {
            // (c) a reservation that fits succeeds; its slots follow the tables.
            std::optional<SlotReservation> r;
            try {
              r.emplace(cache.reserve(tokens));
            } catch (const Error& e) {
              RC_FAIL(std::string("a reservation that fits failed: ") + e.what());
            }
            std::map<SeqId, std::uint32_t> len = m.lens;
            const auto slots = r->slot_mapping();
            RC_ASSERT(slots.size() == tokens.size());
            for (std::size_t i = 0; i < tokens.size(); ++i) {
              const auto table = cache.block_table(tokens[i]);
              const std::uint32_t j = len[tokens[i]]++;
              RC_ASSERT(j / block_size < table.size());
              RC_ASSERT(slots[i] == table[j / block_size] * static_cast<std::int32_t>(block_size) +
                                        static_cast<std::int32_t>(j % block_size));
            }
            for (const auto& [id, l] : len) RC_ASSERT(cache.seq_len(id) == l);
            if (commit) {
              r->commit();
              m.lens = len;
              auto r2 = twin.reserve(tokens);
              RC_ASSERT(to_vector(r2.slot_mapping()) == to_vector(slots));
              r2.commit();
            } else {
              r.reset();
              RC_ASSERT(snapshot(cache) == before);
            }
          }
        }
        check_invariants(cache, twin, m);
      }
    }
    RC_ASSERT(gpu.live_allocations().empty());
  });
}

}  // namespace
