#include "metrale/error.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace metrale {

std::string_view to_string(Errc code) {
  switch (code) {
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::not_found: return "not_found";
    case Errc::capacity_exceeded: return "capacity_exceeded";
    case Errc::device_fault: return "device_fault";
    case Errc::launch_failed: return "launch_failed";
    case Errc::unsupported: return "unsupported";
    case Errc::internal: return "internal";
  }
  return "unknown";
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `text` (its first byte ≥ 0x80),
// or 0: the Unicode standard's table 3-7 (no overlong forms, surrogates or code points past
// U+10FFFF).
std::size_t utf8_sequence(std::string_view text) {
  const auto at = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = at(0);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  }
  if (length == 0 || text.size() < length || at(1) < low || at(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i)
    if (at(i) < 0x80 || at(i) > 0xBF) return 0;
  return length;
}

// The code point of the well-formed UTF-8 sequence `text` (utf8_sequence's length).
char32_t code_point(std::string_view text) {
  const auto at = [&](std::size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(text[i])); };
  if (text.size() == 1) return at(0);
  char32_t cp = at(0) & (0x7F >> text.size());
  for (std::size_t i = 1; i < text.size(); ++i) cp = (cp << 6) | (at(i) & 0x3F);
  return cp;
}

// A character that moves or hides what a terminal shows after it: the C1 controls, the line and
// paragraph separators, and the bidirectional marks (U+061C, U+200E, U+200F), embeddings,
// overrides and isolates (U+202E shows the rest of the line reversed).
bool unsafe_to_show(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t sequence = byte >= 0x80 ? utf8_sequence(text.substr(i)) : 1;
    if (byte < 0x20 || byte == 0x7F || sequence == 0) {
      out += fmt::format("\\x{:02X}", byte);
      ++i;
    } else if (const char32_t cp = code_point(text.substr(i, sequence)); unsafe_to_show(cp)) {
      out += fmt::format("\\u{:04X}", static_cast<std::uint32_t>(cp));
      i += sequence;
    } else {
      out.append(text.substr(i, sequence));
      i += sequence;
    }
  }
  return out;
}

std::string excerpt(std::string_view text) {
  if (text.size() <= kExcerptBytes) return printable(text);
  std::size_t cut = kExcerptBytes;
  // Not inside a character (a UTF-8 character's continuation bytes are at most three).
  for (int back = 0; back < 3 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++back) --cut;
  return fmt::format("{}... ({} bytes)", printable(text.substr(0, cut)), text.size());
}

Error::Error(Errc code, std::string message) : code_(code), message_(printable(message)) { rebuild(); }

Error& Error::add_context(std::string frame) {
  context_.insert(context_.begin(), printable(frame));
  rebuild();
  return *this;
}

void Error::rebuild() {
  what_.clear();
  for (const auto& frame : context_) {
    what_ += frame;
    what_ += ": ";
  }
  what_ += message_;
}

}  // namespace metrale
