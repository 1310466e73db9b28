#include "props.hpp"

#include <rapidcheck.h>

#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "metrale/error.hpp"
#include "metrale/mla_fast.hpp"  // entry_unavailable
#ifdef METRALE_WITH_CUDA
#include "metrale/cuda/cuda_backend.hpp"
#endif

namespace metrale::props {

namespace {

thread_local Input current;

std::mutex record_mutex;
std::filesystem::path record_dir;  // guarded by record_mutex
unsigned recorded_emulators = 0;   // guarded by record_mutex

}  // namespace

std::vector<Property> family(const std::string& name) {
  static const std::map<std::string, std::vector<Property> (*)()> families = {
      {"alloc", alloc_properties},       {"faults", faults_properties},
      {"argorder", argorder_properties}, {"paged", paged_properties},
      {"capacity", capacity_properties}, {"validation", validation_properties}};
  const auto it = families.find(name);
  if (it == families.end()) fail(Errc::not_found, "no property family {}", name);
  return it->second();
}

const Property& property(const std::string& name) {
  static const std::vector<Property> all = [] {
    std::vector<Property> v;
    for (const char* f : {"alloc", "faults", "argorder", "paged", "capacity", "validation"})
      for (auto& p : family(f)) v.push_back(std::move(p));
    return v;
  }();
  for (const auto& p : all)
    if (p.name == name) return p;
  fail(Errc::not_found, "no property named '{}'", name);
}

void note_input(std::string description, std::vector<KernelCase> cases) {
  RC_LOG() << description << "\n";
  current.description = std::move(description);
  current.cases = std::move(cases);
  // Reproducing a shrunk case runs every accepted shrink on the way to it: keep the last one's.
  std::lock_guard lock(record_mutex);
  if (!record_dir.empty()) {
    std::filesystem::remove_all(record_dir);
    recorded_emulators = 0;
  }
}

const Input& current_input() { return current; }

void set_record_dir(std::filesystem::path dir) {
  std::lock_guard lock(record_mutex);
  record_dir = std::move(dir);
  recorded_emulators = 0;
}

emu::EmulatorOptions emulator_options() {
  emu::EmulatorOptions o;
  o.on_leak = [](const std::vector<emu::AllocationInfo>&) {};
  std::lock_guard lock(record_mutex);
  // The first emulator of a run is the scenario's (the rig, or the twin that counts the calls of a
  // fault sweep); the later ones repeat its launches.
  if (!record_dir.empty() && recorded_emulators++ == 0) o.record_dir = record_dir;
  return o;
}

std::uint32_t emulated_multiprocessors() {
  static const std::uint32_t n = [] {
    emu::EmulatorOptions o;  // (not emulator_options(): this one records nothing)
    o.threads = 1;
    return emu::EmulatorBackend(o).multiprocessor_count();
  }();
  return n;
}

std::vector<std::string> backends() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n{"emu"};
#ifdef METRALE_WITH_CUDA
    if (CudaBackend::available()) n.push_back("cuda");
#endif
    return n;
  }();
  return names;
}

std::unique_ptr<GpuBackend> make_backend(const std::string& name) {
#ifdef METRALE_WITH_CUDA
  if (name == "cuda") {
    static const CudaBackend keep_context;  // holds the primary context for the run (as support.hpp's)
    return std::make_unique<CudaBackend>();
  }
#endif
  (void)name;
  return std::make_unique<emu::EmulatorBackend>(emulator_options());
}

std::set<std::uint64_t> live_serials(const emu::EmulatorBackend& gpu) {
  std::set<std::uint64_t> s;
  for (const auto& a : gpu.live_allocations()) s.insert(a.serial);
  return s;
}

void check_case(const KernelCase& c) {
  std::map<std::string, Tensor> emu_out;
  for (const auto& name : backends()) {
    auto gpu = make_backend(name);
    if (entry_unavailable(*gpu, c.module, c.entry)) continue;  // mla_wgmma off sm_90 or in too little shared memory
    auto* emu = dynamic_cast<emu::EmulatorBackend*>(gpu.get());
    const auto before = emu != nullptr ? live_serials(*emu) : std::set<std::uint64_t>{};
    const auto out = run_kernel_case(*gpu, c);
    if (emu != nullptr) RC_ASSERT(live_serials(*emu) == before);
    for (const auto& [param, want] : c.expected) {
      const auto tol = c.tolerance.count(param) != 0 ? c.tolerance.at(param) : Tolerance{};
      const auto r = check_output(param, out.at(param), want, tol);
      if (!r.pass)
        RC_FAIL(fmt::format("{} on {}: {} of {} outside the tolerance (abs {} rel {}), worst {}; case {}", param, name,
                            r.bad, r.count, tol.abs, tol.rel, r.worst, c.name));
      if (name == "emu") continue;
      const auto& ref = emu_out.at(param);
      const auto same = check_output(param, out.at(param), ref, backend_tolerance(c, param, ref));
      if (!same.pass)
        RC_FAIL(fmt::format("{} on {} against the emulator: {} of {} differ, worst {}; case {}", param, name, same.bad,
                            same.count, same.worst, c.name));
    }
    if (name == "emu") emu_out = out;
  }
}

}  // namespace metrale::props
