// The host side of a paged KV cache (SPEC §3 "Paged layout"): a pool of
// physical blocks on the device, a free list, per-sequence block tables and
// seq_lens. Slots are handed out by all-or-nothing reservations; the K/V bytes
// themselves are written by the `mla_paged_cache_store_*` kernels.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string_view>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/buffer.hpp"

namespace metrale {

enum class KvFormat : std::uint8_t { fp8, nvfp4 };
/// "fp8" or "nvfp4".
std::string_view to_string(KvFormat format);
/// Parse "fp8" / "nvfp4". Errors: `invalid_argument` naming the text.
KvFormat parse_kv_format(std::string_view text);

struct PagedCacheConfig {
  KvFormat format = KvFormat::fp8;
  std::uint32_t num_blocks = 0;          // physical blocks in each pool
  std::uint32_t block_size = 16;         // tokens per block
  std::uint32_t num_kv_heads = 1;
  std::uint32_t kv_cache_dim = 576;      // values per KV head per token
  std::uint32_t max_blocks_per_seq = 0;  // blocks a sequence may hold (a full table's width); 0 = num_blocks
  std::uint64_t cache_stride = 0;        // FP8 row pitch in bytes; 0 = row width rounded up to 16
  float k_scale = 1.0f, v_scale = 1.0f;  // FP8 dequantisation scales
  std::uint64_t free_list_seed = 0;      // 0: blocks handed out in descending order; else shuffled
  /// One latent pool for K and V (FlashMLA's layout, V = K row for row; half the memory): v_pool()
  /// is k_pool(), a token's row is stored once, and FP8 needs k_scale == v_scale. A decode then
  /// gives o's dims past the latent as P·K_rope (DeepSeek's W_UV reads only the latent's).
  bool latent = false;
};

using SeqId = std::uint32_t;

class PagedKvCache;

/// Slots reserved for new tokens. Until `commit()`, the cache counts them as
/// used; destroying an uncommitted reservation restores the cache exactly
/// (seq_lens, block tables and free list). A reservation whose cache is destroyed first is left
/// holding only its slot mapping.
class SlotReservation {
 public:
  SlotReservation(SlotReservation&& o) noexcept;
  SlotReservation& operator=(SlotReservation&&) = delete;
  SlotReservation(const SlotReservation&) = delete;
  ~SlotReservation();

  /// slot_mapping[t] = physical_block·block_size + offset, one per reserved token.
  std::span<const std::int32_t> slot_mapping() const { return slots_; }
  /// Keep the reserved tokens.
  void commit() noexcept;

 private:
  friend class PagedKvCache;
  struct Undo {
    SeqId seq;
    std::uint32_t seq_len;
    std::size_t table_size;
  };
  explicit SlotReservation(PagedKvCache& cache) : cache_(&cache) {}
  PagedKvCache* cache_;
  std::vector<std::int32_t> slots_;
  std::vector<Undo> undo_;
  std::vector<std::int32_t> taken_blocks_;
};

class PagedKvCache {
 public:
  /// Allocate the K and V pools (latent: the one pool). Errors: `invalid_argument` naming the field
  /// (a format other than fp8 or nvfp4; num_blocks, block_size, num_kv_heads or kv_cache_dim 0;
  /// max_blocks_per_seq past num_blocks; row width past
  /// UINT32_MAX; NVFP4 row width not a multiple of 16; cache_stride < row width;
  /// an FP8 pool past 2^64 bytes; block_size × cache_stride (FP8) or an NVFP4
  /// block's bytes reaching 2^32, past what the decode kernels address; an FP8 scale
  /// not finite or ≤ 0, or 448 (the largest E4M3 code) times it past FP32's range; latent FP8
  /// with k_scale ≠ v_scale; a slot index past INT32_MAX); `out_of_memory`.
  PagedKvCache(GpuBackend& gpu, PagedCacheConfig cfg);
  /// Neither copied nor moved: reservations and decoders (DeepseekMlaDecoder) refer to the cache
  /// where it is, so a moved cache would leave them on a dead one. Place it where it stays (a
  /// std::unique_ptr, std::optional or std::deque for a set of caches).
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;
  ~PagedKvCache();

  const PagedCacheConfig& config() const { return cfg_; }
  /// Values per token row: num_kv_heads · kv_cache_dim.
  std::uint32_t row_width() const { return cfg_.num_kv_heads * cfg_.kv_cache_dim; }
  /// FP8: bytes between rows.
  std::uint64_t cache_stride() const { return cfg_.cache_stride; }
  /// NVFP4: bytes of packed E2M1 data at the start of a block (16-aligned).
  std::uint64_t data_section_bytes() const { return data_section_bytes_; }
  /// NVFP4: bytes per physical block (data section + scales, 16-aligned).
  std::uint64_t block_stride_bytes() const { return block_stride_bytes_; }
  /// Bytes of each of the K and V pools (latent: of the one pool).
  std::uint64_t pool_bytes() const { return k_pool_.bytes(); }
  DevicePtr k_pool() const { return k_pool_.ptr(); }
  /// The backend the pools live on.
  GpuBackend& backend() const { return gpu_; }
  /// The V pool; latent: k_pool().
  DevicePtr v_pool() const { return cfg_.latent ? k_pool_.ptr() : v_pool_.ptr(); }
  std::uint32_t max_blocks_per_seq() const { return cfg_.max_blocks_per_seq; }

  /// A new empty sequence. Ids count up from 0, wrap past 2^32 − 1 and skip the live ones, so an
  /// id is never two sequences'. Errors: `capacity_exceeded` when all 2^32 ids are live;
  /// `internal` while a reservation is outstanding (as reserve's).
  SeqId add_sequence();
  /// Return a sequence's blocks to the free list. Errors: `not_found`; `internal` while a
  /// reservation is outstanding.
  void free_sequence(SeqId seq);
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  /// Errors: `not_found`.
  std::uint32_t seq_len(SeqId seq) const;
  /// Physical block of each logical block. Errors: `not_found`.
  std::span<const std::int32_t> block_table(SeqId seq) const;
  std::vector<SeqId> sequences() const;
  std::uint32_t free_blocks() const { return static_cast<std::uint32_t>(free_.size()); }
  std::uint32_t used_blocks() const { return cfg_.num_blocks - free_blocks(); }

  /// Reserve one slot per entry of `tokens` (a sequence may appear several
  /// times: its tokens, in order). All or nothing. Errors: `not_found` for an
  /// unknown sequence; `capacity_exceeded` naming the sequence when the pool
  /// has no free block or its block table is full — nothing changes.
  /// `internal` while another reservation is outstanding.
  SlotReservation reserve(std::span<const SeqId> tokens);

  struct DeviceTables {
    DeviceBuffer block_tables;  // [num_seqs, max_blocks_per_seq] int32
    DeviceBuffer seq_lens;      // [num_seqs] int32
    std::uint32_t num_seqs = 0;
    std::uint32_t max_blocks_per_seq = 0;  // the tables' width (their row pitch, in entries)
  };
  /// How wide upload_tables makes each row: the cache's max_blocks_per_seq, or `fitted`, as
  /// wide as the longest of the uploaded tables (at least 1), so that the upload grows with the
  /// blocks those sequences hold rather than with the pool, and a split plan sized by the
  /// table's capacity has no chunks past the longest sequence.
  enum class TableWidth { full, fitted };
  /// Upload the tables of `seqs`, in order; unused columns hold `fill`
  /// (the kernels never read them). Errors: `not_found`, and the backend's.
  DeviceTables upload_tables(std::span<const SeqId> seqs, std::int32_t fill = -1,
                             TableWidth width = TableWidth::full) const;

 private:
  friend class SlotReservation;
  friend struct PagedKvCacheTestPeer;  // tests: the next id, to reach the wrap without 2^32 calls
  struct Seq {
    std::uint32_t len = 0;
    std::vector<std::int32_t> table;
  };
  void rollback(SlotReservation& r) noexcept;
  std::uint64_t row_width_u64() const { return std::uint64_t{cfg_.num_kv_heads} * cfg_.kv_cache_dim; }
  Seq& seq_ref(SeqId seq);
  const Seq& seq_ref(SeqId seq) const;

  GpuBackend& gpu_;
  PagedCacheConfig cfg_;
  std::uint64_t data_section_bytes_ = 0, block_stride_bytes_ = 0;
  DeviceBuffer k_pool_, v_pool_;    // v_pool_: none when latent
  std::vector<std::int32_t> free_;  // popped from the back
  std::map<SeqId, Seq> seqs_;
  SeqId next_seq_ = 0;
  SlotReservation* open_ = nullptr;  // the outstanding reservation, whose cache_ is this
};

}  // namespace metrale
