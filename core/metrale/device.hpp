// Device-side value types shared by every backend (SPEC §1): a 64-bit device
// address, an opaque kernel handle, launch dimensions, streams and the typed
// kernel argument that travels from a launcher to the backend.
#pragma once

#include <bit>
#include <compare>
#include <cstdint>
#include <string_view>

namespace metrale {

/// A 64-bit device address; 0 is null. Arithmetic is in bytes, as in the seeds
/// (`DevicePtr(k.0 + off)`).
struct DevicePtr {
  std::uint64_t addr = 0;

  constexpr DevicePtr operator+(std::uint64_t bytes) const { return DevicePtr{addr + bytes}; }
  constexpr explicit operator bool() const { return addr != 0; }
  constexpr auto operator<=>(const DevicePtr&) const = default;
};

/// An opaque handle from `GpuBackend::kernel(module, entry)`.
struct KernelHandle {
  std::uint64_t id = 0;
  constexpr auto operator<=>(const KernelHandle&) const = default;
};

/// A stream handle; 0 is the default stream.
using Stream = std::uint64_t;

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
  constexpr std::uint64_t count() const { return std::uint64_t{x} * y * z; }
  constexpr bool operator==(const Dim3&) const = default;
};

/// The kind of one kernel argument. It is kept from the launcher to the
/// backend, where it is checked against the kernel's declared parameter list.
enum class ArgKind : std::uint8_t { ptr, u32, i32, f32, u64 };

constexpr std::string_view to_string(ArgKind kind) {
  switch (kind) {
    case ArgKind::ptr: return "ptr";
    case ArgKind::u32: return "u32";
    case ArgKind::i32: return "i32";
    case ArgKind::f32: return "f32";
    case ArgKind::u64: return "u64";
  }
  return "?";
}

/// Size in bytes of an argument of this kind in the kernel's parameter buffer.
constexpr std::uint32_t arg_size(ArgKind kind) {
  return kind == ArgKind::ptr || kind == ArgKind::u64 ? 8 : 4;
}

/// One typed kernel argument: its kind and its bits (zero-extended).
struct KernelArg {
  ArgKind kind = ArgKind::u32;
  std::uint64_t bits = 0;

  static constexpr KernelArg ptr(DevicePtr p) { return {ArgKind::ptr, p.addr}; }
  static constexpr KernelArg u32(std::uint32_t v) { return {ArgKind::u32, v}; }
  static constexpr KernelArg i32(std::int32_t v) {
    return {ArgKind::i32, std::bit_cast<std::uint32_t>(v)};
  }
  static constexpr KernelArg f32(float v) { return {ArgKind::f32, std::bit_cast<std::uint32_t>(v)}; }
  static constexpr KernelArg u64(std::uint64_t v) { return {ArgKind::u64, v}; }

  constexpr DevicePtr as_ptr() const { return DevicePtr{bits}; }
  constexpr std::uint32_t as_u32() const { return static_cast<std::uint32_t>(bits); }
  constexpr std::int32_t as_i32() const { return std::bit_cast<std::int32_t>(as_u32()); }
  constexpr float as_f32() const { return std::bit_cast<float>(as_u32()); }
  constexpr std::uint64_t as_u64() const { return bits; }
  constexpr bool operator==(const KernelArg&) const = default;
};

}  // namespace metrale
