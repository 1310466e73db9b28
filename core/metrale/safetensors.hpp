// A reader and writer of the safetensors format (8-byte little-endian header
// length, a JSON header of {name: {dtype, shape, data_offsets}} plus an
// optional "__metadata__" map of strings, then the raw little-endian data).
// Case files (SPEC §5) and the golden cases are safetensors files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "metrale/dtype.hpp"
#include "metrale/formats.hpp"

namespace metrale {

struct Tensor {
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;

  std::size_t numel() const;

  /// A tensor of T with `shape` holding `values` (numel must match; `internal` otherwise).
  template <class T>
  static Tensor from(std::vector<std::int64_t> shape, std::span<const T> values) {
    Tensor t{dtype_of<T>(), std::move(shape), {}};
    t.data.resize(values.size_bytes());
    if (!values.empty()) std::memcpy(t.data.data(), values.data(), values.size_bytes());  // memcpy of null is UB
    t.check_size();
    return t;
  }
  /// The elements as T; `invalid_argument` when the dtype is not T's.
  template <class T>
  std::vector<T> values() const {
    expect_dtype(dtype_of<T>());
    std::vector<T> out(data.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), data.data(), out.size() * sizeof(T));
    return out;
  }
  /// The elements converted to float from F32, F64, BF16 or F16;
  /// `invalid_argument` for other dtypes.
  std::vector<float> to_f32() const;

  void check_size() const;
  void expect_dtype(Dtype want) const;
};

class SafeTensors {
 public:
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;

  /// Read a file: the header, then only the data its tensors reference (the
  /// file's size bounds nothing; a sparse file is not read whole). Errors:
  /// `not_found` (the path), `invalid_argument` naming the path and what is
  /// malformed (header length, JSON, a key twice in one object, dtype,
  /// shape/offset disagreement, overlapping or out-of-file data, bytes of
  /// the data section no tensor covers: the format allows no holes),
  /// `out_of_memory` when the referenced data is more than a quarter of the host's memory for a
  /// kernel case (reading takes twice it, a case run on the emulator three times: the tensors,
  /// each device byte and its written mark), an eighth for a model case (a replay holds about six
  /// times its file: the tensors as FP32 and BF16 beside them, and the caches).
  /// The header is checked whole before any data is read.
  enum class Use { kernel_case, model_case };
  static SafeTensors read(const std::filesystem::path& path, Use use = Use::kernel_case);
  /// Read a file's header only: the metadata, and each tensor's dtype and shape with its data
  /// empty, except the tensors `with_data` picks by name (a case's tolerances), which are read
  /// whole. What a caller refuses on the header (a case's wrong tensor name, a file --only does
  /// not pick) then costs no more than the header. Errors: `read`'s for the header, and
  /// `out_of_memory` when the picked tensors hold more than a quarter of the host's memory.
  using TensorFilter = std::function<bool(const std::string& tensor)>;
  static SafeTensors read_header(const std::filesystem::path& path, const TensorFilter& with_data = {});
  /// Parse from memory; `name` is used in messages.
  static SafeTensors parse(std::span<const std::byte> bytes, std::string_view name);
  /// Write, tensors in name order, data 8-byte aligned, through a file beside `path` renamed over
  /// it (files.hpp: a failed write leaves `path` as it was). Errors: `invalid_argument` when the
  /// file cannot be written (names the path).
  void write(const std::filesystem::path& path) const;
  /// The same, but only if no file is at `path` (of two writers of one path, one wins): false,
  /// with nothing written, when one is. Errors as `write`.
  bool write_new(const std::filesystem::path& path) const;
  std::vector<std::byte> serialize() const;

  bool has(std::string_view name) const { return tensors.find(std::string(name)) != tensors.end(); }
  /// Errors: `not_found` naming the tensor.
  const Tensor& at(std::string_view name) const;
  /// Errors: `not_found` naming the key.
  const std::string& meta(std::string_view key) const;
  /// The metadata value parsed as a number; the whole string must be one
  /// (meta_f64: a finite decimal, meta_i64: a 64-bit integer). Errors:
  /// `not_found`, or `invalid_argument` naming the key and the value.
  double meta_f64(std::string_view key) const;
  std::int64_t meta_i64(std::string_view key) const;
};

}  // namespace metrale
