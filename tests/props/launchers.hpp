// Every launcher, driven generically for the argument-order and validation families: valid
// arguments drawn with distinct sentinel values, the launch record they must produce (each
// argument under the declared name of the field it came from), and each validation rule as a
// way to break one argument set and the error that must follow. All arguments are sentinels:
// the launches are dry runs (the emulator checks and records them, runs no block).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/error.hpp"

namespace metrale::props {

/// A launch as the emulator's record must show it.
struct ExpectedLaunch {
  std::string module, entry;
  Dim3 grid, block;
  /// By the kernel's declared parameter names, in declaration order.
  std::vector<std::pair<std::string, KernelArg>> args;
  std::uint32_t shared_bytes = 0;  // dynamic shared memory a block
  Dim3 cluster{1, 1, 1};
};

/// How one broken rule must be reported.
struct BrokenRule {
  std::string rule;                  // "n_out 0", for the report
  Errc code = Errc::invalid_argument;
  std::vector<std::string> needles;  // the message must contain each (the kernel's name first)
};

/// One drawn argument set of one launcher.
class LauncherArgs {
 public:
  virtual ~LauncherArgs() = default;
  virtual ExpectedLaunch expected() const = 0;
  virtual void launch(GpuBackend& gpu, KernelHandle kernel) const = 0;
  virtual std::size_t rules() const = 0;
  /// Break rule `i` (drawing the bad value with *rc::gen) and say how it must be reported.
  virtual BrokenRule break_rule(std::size_t i) = 0;
};

struct Launcher {
  std::string module, entry;
  /// Draw valid arguments, boundary values included (call only inside a property).
  std::function<std::unique_ptr<LauncherArgs>()> arb;
};

/// Every launcher of mla_absorbed, mla_decode and mla_fast.
std::vector<Launcher> launchers();

/// "name=kind(value) ..." of a launch, for reports.
std::string describe(const ExpectedLaunch& e);

}  // namespace metrale::props
