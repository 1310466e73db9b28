// Element types of tensors and kernel buffers, spelled as safetensors spells
// them. A port's `Global<T>` parameters carry theirs, so a recorded launch
// knows what each buffer holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "metrale/formats.hpp"

namespace metrale {

enum class Dtype : std::uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, boolean, f8_e4m3 };

/// The safetensors spelling ("F32", "BF16", ...).
std::string_view to_string(Dtype dtype);
/// Bytes per element.
std::size_t dtype_size(Dtype dtype);

template <class T>
constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<double>() { return Dtype::f64; }
template <> constexpr Dtype dtype_of<float>() { return Dtype::f32; }
template <> constexpr Dtype dtype_of<Bf16>() { return Dtype::bf16; }
template <> constexpr Dtype dtype_of<std::int64_t>() { return Dtype::i64; }
template <> constexpr Dtype dtype_of<std::int32_t>() { return Dtype::i32; }
template <> constexpr Dtype dtype_of<std::uint64_t>() { return Dtype::u64; }
template <> constexpr Dtype dtype_of<std::uint32_t>() { return Dtype::u32; }
template <> constexpr Dtype dtype_of<std::uint16_t>() { return Dtype::u16; }
template <> constexpr Dtype dtype_of<std::uint8_t>() { return Dtype::u8; }

}  // namespace metrale
