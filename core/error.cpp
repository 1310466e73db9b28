#include "metrale/error.hpp"

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

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7F) {
      out += fmt::format("\\x{:02X}", byte);
    } else {
      out += ch;
    }
  }
  return out;
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
