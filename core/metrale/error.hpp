// The project's one error type (SPEC §1): a code, the innermost message and a
// context chain. `what()` reads outermost first, anyhow-style:
//   "k3_mla_sdpa_gate_f32: k3 mla: device KV cap 4 full"
// Messages start lower-case, name the values that were wrong and never end in a
// period.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace metrale {

enum class Errc {
  invalid_argument,
  out_of_memory,
  not_found,
  capacity_exceeded,
  device_fault,
  launch_failed,
  unsupported,
  internal,
};

/// The code's name as written in SPEC §1 ("invalid_argument", ...).
std::string_view to_string(Errc code);

/// `text` with its control characters (bytes below 0x20, and 0x7F) and every byte that is not
/// part of well-formed UTF-8 written as \xNN, and the characters that move or hide what follows
/// them on a terminal (the C1 controls, U+2028/U+2029, the bidirectional marks, embeddings,
/// overrides and isolates: U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) as \uNNNN, so that a
/// value read from a file (a case name, a metadata value, a JSON parser's excerpt of it) cannot
/// start, fake or reorder a line of output, and the output stays UTF-8; every other byte as it is. An Error's message
/// and context frames go through it.
std::string printable(std::string_view text);

/// The longest value, in bytes, that excerpt() writes whole.
inline constexpr std::size_t kExcerptBytes = 80;

/// `text` for a message, as printable() writes it, cut after kExcerptBytes bytes (at a character
/// boundary) with "... (N bytes)" after the cut: a value read from a file (a metadata value, a
/// tensor or case name) can be megabytes long, and an error line or report echoes its start only.
std::string excerpt(std::string_view text);

class Error : public std::exception {
 public:
  /// `message` as printable() writes it.
  Error(Errc code, std::string message);

  Errc code() const noexcept { return code_; }
  /// The innermost message, without context.
  const std::string& message() const noexcept { return message_; }
  /// Context frames, outermost first.
  const std::vector<std::string>& context() const noexcept { return context_; }
  /// "outer: inner: message".
  const char* what() const noexcept override { return what_.c_str(); }

  /// Prepend one context frame (it becomes the outermost), as printable() writes it.
  Error& add_context(std::string frame);

 private:
  void rebuild();

  Errc code_;
  std::string message_;
  std::vector<std::string> context_;
  std::string what_;
};

/// Throw `Error(code, fmt::format(format, args...))`.
template <class... Args>
[[noreturn]] void fail(Errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

/// Run `body`; an `Error` escaping it gains `frame` as its outermost context.
template <class F>
decltype(auto) with_context(std::string_view frame, F&& body) {
  try {
    return std::forward<F>(body)();
  } catch (Error& e) {
    e.add_context(std::string(frame));
    throw;
  }
}

}  // namespace metrale
