// The property families of issue 5, shared by the Catch2 tests (tests/prop_*_test.cpp, through
// `rc::prop`) and the fuzz drivers (fuzz/, through rapidcheck's checkProperty with their own seed
// and budget). A property is a plain function that generates its input with `*rc::gen::...` and
// asserts with RC_ASSERT, so it runs unchanged under either. Nothing here depends on Catch.
//
// Families (docs/fuzzing.md lists the properties of each):
//   alloc       every launcher and decode entry point over generated valid inputs: live device
//               allocations and bytes return to their prior value; the emulator's checked memory
//               faults any out-of-bounds or never-written read
//   faults      SQLite-style: count the backend calls of an operation, fail call N once and from
//               N on, for every N: the error surfaces, nothing leaks, stored state is as before
//   argorder    distinct sentinels through every launcher reach the parameter of the same name
//   paged       random paged batches against the float64 reference
//   capacity    stateful (rc::state) tests of PagedKvCache and MlaDeviceKv against models
//   validation  every launcher validation rule: rejected before any backend call
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "metrale/backend.hpp"
#include "metrale/emu/emulator.hpp"
#include "metrale/kernel_case.hpp"

namespace metrale::props {

/// One property: its name (also the Catch section and the fuzz driver's --property) and body.
struct Property {
  std::string name;
  std::function<void()> check;
  /// Whether a fuzz driver may re-run a failing input with the emulator's recorder on (not for
  /// properties whose buffers are gigabytes: the recorder copies every argument's allocation).
  bool record = true;
};

std::vector<Property> alloc_properties();
std::vector<Property> faults_properties();
std::vector<Property> argorder_properties();
std::vector<Property> paged_properties();
std::vector<Property> capacity_properties();
std::vector<Property> validation_properties();

/// The properties of family `name` ("alloc", "faults", ...). Errors: `not_found`.
std::vector<Property> family(const std::string& name);
/// The property named `name` of any family. Errors: `not_found`.
const Property& property(const std::string& name);

// ---- the input being checked, for a fuzz driver to write out when it fails -------------

/// What the running property is checking: every parameter, and the kernel cases that
/// reproduce it (empty for scenario properties, whose launches the driver records instead).
struct Input {
  std::string description;
  std::vector<KernelCase> cases;
};
/// Replace the current input (per thread). Also logged with RC_LOG, so a failing case's report
/// in the tests names it. A property calls it once its input is drawn and before it makes an
/// emulator that runs kernels (see set_record_dir).
void note_input(std::string description, std::vector<KernelCase> cases = {});
const Input& current_input();

/// When set, the first emulator a property makes after its note_input records its launches as
/// kernel case files into `dir` (a fuzz driver sets it while it reproduces a failure once; the
/// first emulator is the scenario's, later ones, such as a fault sweep's rigs, repeat its
/// launches). Each note_input empties `dir`, so it ends with the last case run, the shrunk one.
/// An empty path turns recording off.
void set_record_dir(std::filesystem::path dir);

/// The emulator options every property uses: leaks are asserted by the properties themselves
/// (a destructor may not fail a property), launches recorded when set_record_dir is set.
emu::EmulatorOptions emulator_options();
/// The SM count of the device those emulators play (132, or a GB10's 48 under
/// METRALE_EMU_COMPUTE_CAPABILITY=121): what the launchers size grids for.
std::uint32_t emulated_multiprocessors();

// ---- backends and checks ---------------------------------------------------------------

/// "emu", and "cuda" when the CUDA backend is built and a device answers.
std::vector<std::string> backends();
std::unique_ptr<GpuBackend> make_backend(const std::string& name);

/// Run `c` on every backend of backends(): each output within the case's tolerance of its
/// expectation (RC_FAIL naming the output, the worst element and the case otherwise), and on
/// the emulator, live allocations afterwards exactly those before.
void check_case(const KernelCase& c);

/// The serial numbers of the live allocations (the identity of each, not only the count).
std::set<std::uint64_t> live_serials(const emu::EmulatorBackend& gpu);

}  // namespace metrale::props
