// RAII device memory (STYLE §5): freeing is the destructor's job, so "every
// temporary is freed on every path" holds by construction.
#pragma once

#include <cstddef>
#include <cstring>
#include <source_location>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/error.hpp"

namespace metrale {

/// Copy a host array to `dst` (`src.size_bytes()` bytes).
template <class T>
  requires std::is_trivially_copyable_v<T>
void upload(GpuBackend& gpu, std::span<const T> src, DevicePtr dst) {
  if (!src.empty()) gpu.copy_h2d(std::as_bytes(src), dst);
}

/// Copy `count` elements of T from `src` to a new host vector.
template <class T>
  requires std::is_trivially_copyable_v<T>
std::vector<T> download(GpuBackend& gpu, DevicePtr src, std::size_t count) {
  std::vector<T> out(count);
  if (count != 0) gpu.copy_d2h(src, std::as_writable_bytes(std::span(out)));
  return out;
}

/// One owned device allocation. A buffer of 0 bytes allocates nothing and
/// holds the null pointer. Move-only; the destructor frees and ignores a failed
/// free (SPEC §4).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocate `bytes`. Errors: those of `GpuBackend::alloc`.
  DeviceBuffer(GpuBackend& gpu, std::size_t bytes,
               std::source_location where = std::source_location::current())
      : gpu_(&gpu), bytes_(bytes) {
    if (bytes != 0) ptr_ = gpu.alloc(bytes, where);
  }
  /// Allocate and fill with `src`. Errors: those of alloc and copy_h2d; nothing
  /// stays allocated on error.
  template <class T>
  static DeviceBuffer from_host(GpuBackend& gpu, std::span<const T> src,
                                std::source_location where = std::source_location::current()) {
    DeviceBuffer buf(gpu, src.size_bytes(), where);
    upload(gpu, src, buf.ptr());
    return buf;
  }

  DeviceBuffer(DeviceBuffer&& o) noexcept
      : gpu_(std::exchange(o.gpu_, nullptr)), ptr_(std::exchange(o.ptr_, {})), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      gpu_ = std::exchange(o.gpu_, nullptr);
      ptr_ = std::exchange(o.ptr_, {});
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  DevicePtr ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  /// The backend it was allocated on (null for a default-constructed or moved-from buffer).
  GpuBackend* backend() const { return gpu_; }
  bool empty() const { return bytes_ == 0; }

  /// Free now; a failed free is ignored.
  void reset() noexcept {
    if (gpu_ != nullptr && ptr_) {
      try {
        gpu_->free(ptr_);
      } catch (...) {  // SPEC §4: a failed free is ignored
      }
    }
    ptr_ = {};
    bytes_ = 0;
  }

  /// Give up ownership without freeing.
  DevicePtr release() noexcept {
    bytes_ = 0;
    return std::exchange(ptr_, {});
  }

  /// The whole buffer as a host vector of bytes() / sizeof(T) T (empty for an empty buffer,
  /// default-constructed or moved from included). Errors: `invalid_argument` when bytes() is not
  /// a multiple of sizeof(T) (the last element would be cut short); those of copy_d2h.
  template <class T>
  std::vector<T> to_host() const {
    if (bytes_ % sizeof(T) != 0)
      fail(Errc::invalid_argument, "DeviceBuffer::to_host: {} bytes are not a whole number of {}-byte elements", bytes_,
           sizeof(T));
    if (bytes_ == 0) return {};
    return download<T>(*gpu_, ptr_, bytes_ / sizeof(T));
  }

 private:
  GpuBackend* gpu_ = nullptr;
  DevicePtr ptr_{};
  std::size_t bytes_ = 0;
};

}  // namespace metrale
