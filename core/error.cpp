#include "metrale/error.hpp"

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

Error::Error(Errc code, std::string message) : code_(code), message_(std::move(message)) { rebuild(); }

Error& Error::add_context(std::string frame) {
  context_.insert(context_.begin(), std::move(frame));
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
