#include "metrale/paged_cache.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "metrale/error.hpp"
#include "metrale/formats.hpp"
#include "validate.hpp"

namespace metrale {

std::string_view to_string(KvFormat format) { return format == KvFormat::fp8 ? "fp8" : "nvfp4"; }

KvFormat parse_kv_format(std::string_view text) {
  if (text == "fp8") return KvFormat::fp8;
  if (text == "nvfp4") return KvFormat::nvfp4;
  fail(Errc::invalid_argument, "unknown kv cache format '{}' (expected fp8 or nvfp4)", text);
}

namespace {

std::uint64_t align16(std::uint64_t n) { return (n + 15) / 16 * 16; }

PagedCacheConfig validated(PagedCacheConfig cfg) {
  if (cfg.format != KvFormat::fp8 && cfg.format != KvFormat::nvfp4)
    fail(Errc::invalid_argument, "paged cache: format {} is neither fp8 ({}) nor nvfp4 ({})",
         static_cast<int>(cfg.format), static_cast<int>(KvFormat::fp8), static_cast<int>(KvFormat::nvfp4));
  if (cfg.num_blocks == 0) fail(Errc::invalid_argument, "paged cache: num_blocks is 0");
  if (cfg.block_size == 0) fail(Errc::invalid_argument, "paged cache: block_size is 0");
  if (cfg.num_kv_heads == 0) fail(Errc::invalid_argument, "paged cache: num_kv_heads is 0");
  if (cfg.kv_cache_dim == 0) fail(Errc::invalid_argument, "paged cache: kv_cache_dim is 0");
  if (cfg.max_blocks_per_seq == 0) cfg.max_blocks_per_seq = cfg.num_blocks;
  // A sequence never holds more blocks than the pool has; a wider table only costs
  // num_seqs x max_blocks_per_seq int32 on the host and the device at every full-width upload.
  if (cfg.max_blocks_per_seq > cfg.num_blocks)
    fail(Errc::invalid_argument, "paged cache: max_blocks_per_seq {} exceeds num_blocks {}", cfg.max_blocks_per_seq,
         cfg.num_blocks);
  const std::uint64_t row_width = std::uint64_t{cfg.num_kv_heads} * cfg.kv_cache_dim;
  if (std::uint64_t{cfg.num_blocks} * cfg.block_size > std::numeric_limits<std::int32_t>::max())
    fail(Errc::invalid_argument, "paged cache: num_blocks {} x block_size {} slots do not fit the int32 slot mapping",
         cfg.num_blocks, cfg.block_size);
  // The store kernels take the row width as a u32 (and row_width() returns one).
  if (row_width > std::numeric_limits<std::uint32_t>::max())
    fail(Errc::invalid_argument, "paged cache: row width {} (num_kv_heads {} x kv_cache_dim {}) does not fit 32 bits",
         row_width, cfg.num_kv_heads, cfg.kv_cache_dim);
  if (cfg.format == KvFormat::fp8) {
    if (cfg.cache_stride == 0) cfg.cache_stride = align16(row_width);
    if (cfg.cache_stride < row_width)
      fail(Errc::invalid_argument, "paged cache: cache_stride {} < row width {}", cfg.cache_stride, row_width);
    // Else the pool size wraps around 2^64 and a tiny pool is allocated.
    const std::uint64_t slots = std::uint64_t{cfg.num_blocks} * cfg.block_size;
    if (cfg.cache_stride > std::numeric_limits<std::uint64_t>::max() / slots)
      fail(Errc::invalid_argument, "paged cache: cache_stride {} x {} slots does not fit 64 bits", cfg.cache_stride,
           slots);
    // The decode launchers' rules, here rather than at the first decode: row offsets within 32
    // bits, and a stored code times its scale finite in FP32.
    const detail::Validator v{"paged cache"};
    detail::validate_row_offsets(v, cfg.block_size, cfg.cache_stride, "cache_stride");
    v.e4m3_scale("k_scale", cfg.k_scale);
    v.e4m3_scale("v_scale", cfg.v_scale);
    if (cfg.latent && cfg.k_scale != cfg.v_scale)
      fail(Errc::invalid_argument, "paged cache: a latent pool has one scale, but k_scale {} and v_scale {} differ",
           cfg.k_scale, cfg.v_scale);
  } else {
    if (row_width % 16 != 0)
      fail(Errc::invalid_argument, "paged cache: nvfp4 row width {} is not a multiple of 16", row_width);
  }
  return cfg;
}

// The order blocks leave the free list (popped from the back): descending, or a seeded
// Fisher–Yates shuffle (written out so that a seed means the same order everywhere).
std::vector<std::int32_t> initial_free_list(std::uint32_t n, std::uint64_t seed) {
  std::vector<std::int32_t> free(n);
  for (std::uint32_t i = 0; i < n; ++i) free[i] = static_cast<std::int32_t>(i);
  if (seed != 0) {
    std::mt19937_64 rng(seed);
    for (std::uint32_t i = n; i > 1; --i) std::swap(free[i - 1], free[rng() % i]);
  }
  return free;
}

}  // namespace

PagedKvCache::PagedKvCache(GpuBackend& gpu, PagedCacheConfig cfg) : gpu_(gpu), cfg_(validated(cfg)) {
  const std::uint64_t row_width = row_width_u64();
  std::uint64_t pool = 0;
  if (cfg_.format == KvFormat::fp8) {
    pool = std::uint64_t{cfg_.num_blocks} * cfg_.block_size * cfg_.cache_stride;
  } else {
    data_section_bytes_ = align16(std::uint64_t{cfg_.block_size} * row_width / 2);
    block_stride_bytes_ = align16(data_section_bytes_ + std::uint64_t{cfg_.block_size} * row_width / 16);
    // The decode kernels' block offsets (block x stride) must stay inside int64 for any int32 block.
    if (block_stride_bytes_ >= (std::uint64_t{1} << 32))
      fail(Errc::invalid_argument,
           "paged cache: an nvfp4 block of block_size {} x row width {} takes {} bytes, reaching 2^32, past what the "
           "decode kernels address",
           cfg_.block_size, row_width, block_stride_bytes_);
    pool = std::uint64_t{cfg_.num_blocks} * block_stride_bytes_;
  }
  k_pool_ = DeviceBuffer(gpu_, pool);
  if (!cfg_.latent) v_pool_ = DeviceBuffer(gpu_, pool);
  free_ = initial_free_list(cfg_.num_blocks, cfg_.free_list_seed);
}

PagedKvCache::~PagedKvCache() {
  if (open_ != nullptr) open_->cache_ = nullptr;  // the reservation outlives its cache: it keeps its slots only
}

SeqId PagedKvCache::add_sequence() {
  if (open_ != nullptr) fail(Errc::internal, "paged cache: add_sequence while a slot reservation is outstanding");
  if (seqs_.size() > std::numeric_limits<SeqId>::max())
    fail(Errc::capacity_exceeded, "paged cache: all {} sequence ids are live", seqs_.size());
  while (seqs_.count(next_seq_) != 0) ++next_seq_;  // (wraps; ends: some id is free)
  const SeqId id = next_seq_++;
  seqs_.emplace(id, Seq{});
  return id;
}

void PagedKvCache::free_sequence(SeqId seq) {
  if (open_ != nullptr) fail(Errc::internal, "paged cache: free_sequence while a slot reservation is outstanding");
  Seq& s = seq_ref(seq);
  for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) free_.push_back(*it);
  seqs_.erase(seq);
}

PagedKvCache::Seq& PagedKvCache::seq_ref(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail(Errc::not_found, "paged cache: no sequence {}", seq);
  return it->second;
}

const PagedKvCache::Seq& PagedKvCache::seq_ref(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail(Errc::not_found, "paged cache: no sequence {}", seq);
  return it->second;
}

std::uint32_t PagedKvCache::seq_len(SeqId seq) const { return seq_ref(seq).len; }

std::span<const std::int32_t> PagedKvCache::block_table(SeqId seq) const { return seq_ref(seq).table; }

std::vector<SeqId> PagedKvCache::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

SlotReservation PagedKvCache::reserve(std::span<const SeqId> tokens) {
  if (open_ != nullptr) fail(Errc::internal, "paged cache: a slot reservation is already outstanding");
  for (SeqId seq : tokens) seq_ref(seq);  // unknown sequences fail before anything changes
  SlotReservation r(*this);
  open_ = &r;
  r.slots_.reserve(tokens.size());
  for (SeqId seq : tokens) {
    Seq& s = seq_ref(seq);
    auto undo = std::find_if(r.undo_.begin(), r.undo_.end(), [&](const auto& u) { return u.seq == seq; });
    if (undo == r.undo_.end()) undo = r.undo_.insert(undo, {seq, s.len, s.table.size()});
    if (s.len % cfg_.block_size == 0) {  // the token starts a new block
      if (s.table.size() == cfg_.max_blocks_per_seq)
        fail(Errc::capacity_exceeded,
             "paged cache: sequence {} holds {} tokens and cannot take the {} this reservation asks for: it is full at "
             "{} (max_blocks_per_seq {} x block_size {})",
             seq, undo->seq_len, std::count(tokens.begin(), tokens.end(), seq), s.len, cfg_.max_blocks_per_seq,
             cfg_.block_size);
      if (free_.empty())
        fail(Errc::capacity_exceeded,
             "paged cache: no free block for sequence {}: the reservation needs more blocks than the {} of {} that "
             "were free before it",
             seq, r.taken_blocks_.size(), cfg_.num_blocks);
      s.table.push_back(free_.back());
      r.taken_blocks_.push_back(free_.back());
      free_.pop_back();
    }
    r.slots_.push_back(s.table[s.len / cfg_.block_size] * static_cast<std::int32_t>(cfg_.block_size) +
                       static_cast<std::int32_t>(s.len % cfg_.block_size));
    ++s.len;
  }
  return r;  // a throw above destroys `r`, which rolls everything back
}

void PagedKvCache::rollback(SlotReservation& r) noexcept {
  for (auto it = r.taken_blocks_.rbegin(); it != r.taken_blocks_.rend(); ++it) free_.push_back(*it);
  for (const auto& u : r.undo_) {
    Seq& s = seqs_.at(u.seq);
    s.len = u.seq_len;
    s.table.resize(u.table_size);
  }
  open_ = nullptr;
}

SlotReservation::SlotReservation(SlotReservation&& o) noexcept
    : cache_(std::exchange(o.cache_, nullptr)),
      slots_(std::move(o.slots_)),
      undo_(std::move(o.undo_)),
      taken_blocks_(std::move(o.taken_blocks_)) {
  if (cache_ != nullptr) cache_->open_ = this;
}

SlotReservation::~SlotReservation() {
  if (cache_ != nullptr) cache_->rollback(*this);
}

void SlotReservation::commit() noexcept {
  if (cache_ != nullptr) cache_->open_ = nullptr;
  cache_ = nullptr;
}

PagedKvCache::DeviceTables PagedKvCache::upload_tables(std::span<const SeqId> seqs, std::int32_t fill,
                                                       TableWidth width) const {
  std::vector<const Seq*> held;  // each looked up once (`not_found` before anything is allocated)
  held.reserve(seqs.size());
  for (const SeqId seq : seqs) held.push_back(&seq_ref(seq));
  std::size_t columns = cfg_.max_blocks_per_seq;
  if (width == TableWidth::fitted) {
    columns = 1;
    for (const Seq* s : held) columns = std::max(columns, s->table.size());
  }
  std::vector<std::int32_t> tables(seqs.size() * columns, fill);
  std::vector<std::int32_t> lens(seqs.size());
  for (std::size_t i = 0; i < held.size(); ++i) {
    std::copy(held[i]->table.begin(), held[i]->table.end(), tables.begin() + static_cast<std::ptrdiff_t>(i * columns));
    lens[i] = static_cast<std::int32_t>(held[i]->len);
  }
  DeviceTables out;
  out.max_blocks_per_seq = static_cast<std::uint32_t>(columns);
  out.block_tables = DeviceBuffer::from_host<std::int32_t>(gpu_, tables);
  out.seq_lens = DeviceBuffer::from_host<std::int32_t>(gpu_, lens);
  out.num_seqs = static_cast<std::uint32_t>(seqs.size());
  return out;
}

}  // namespace metrale
