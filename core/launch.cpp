#include "metrale/launch.hpp"

#include "metrale/error.hpp"

namespace metrale {

KernelLaunch& KernelLaunch::push(KernelArg a) {
  if (count_ == kMaxArgs) {
    overflow_ = true;
  } else {
    args_[count_++] = a;
  }
  return *this;
}

void KernelLaunch::launch(Stream stream) {
  with_context(gpu_.kernel_name(kernel_), [&] {
    if (overflow_) fail(Errc::internal, "more than {} kernel arguments", kMaxArgs);
    gpu_.launch(kernel_, grid_, block_, std::span(args_.data(), count_), stream, shared_, early_start_);
  });
}

}  // namespace metrale
