// The three descriptions of every kernel's parameters cannot drift apart: the
// emulator's declared list (from each port's signature) against the compiled
// PTX of kernels/ (count, order, sizes and float-ness) and against the names
// in the .cu source. Built when nvcc is found; needs no GPU.
#include <catch2/catch.hpp>

#ifdef METRALE_PTX_DIR

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "metrale/emu/emulator.hpp"

using namespace metrale;

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// entry → PTX parameter types (".u64", ".u32", ".f32", ...).
std::map<std::string, std::vector<std::string>> ptx_entries(const std::string& ptx) {
  std::map<std::string, std::vector<std::string>> out;
  const std::regex entry(R"(\.entry\s+(\w+)\s*\(([^)]*)\))");
  const std::regex param(R"(\.param\s+(\.\w+)\s+\w+)");
  for (std::sregex_iterator it(ptx.begin(), ptx.end(), entry), end; it != end; ++it) {
    auto& types = out[(*it)[1]];
    const std::string params = (*it)[2];
    for (std::sregex_iterator p(params.begin(), params.end(), param); p != end; ++p) types.push_back((*p)[1]);
  }
  return out;
}

// entry → parameter names, from the `extern "C" __global__` definitions of the .cu source.
std::map<std::string, std::vector<std::string>> source_entries(const std::string& cu) {
  std::map<std::string, std::vector<std::string>> out;
  const std::regex entry(R"(extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\))");
  const std::regex last_word(R"((\w+)\s*$)");
  for (std::sregex_iterator it(cu.begin(), cu.end(), entry), end; it != end; ++it) {
    auto& names = out[(*it)[1]];
    std::stringstream params((*it)[2]);
    for (std::string p; std::getline(params, p, ',');) {
      std::smatch m;
      if (std::regex_search(p, m, last_word)) names.push_back(m[1]);
    }
  }
  return out;
}

bool ptx_type_matches(ArgKind kind, const std::string& t) {
  switch (kind) {
    case ArgKind::ptr:
    case ArgKind::u64:
      return t == ".u64" || t == ".b64" || t == ".s64";
    case ArgKind::u32:
    case ArgKind::i32:
      return t == ".u32" || t == ".b32" || t == ".s32";
    case ArgKind::f32:
      return t == ".f32";
  }
  return false;
}

}  // namespace

TEST_CASE("every kernel's PTX and source parameters equal the emulator's declared list", "[ptx]") {
  emu::EmulatorBackend emu;
  std::map<std::string, std::vector<const emu::Registry::Entry*>> by_module;
  for (const auto& e : emu.registry().entries())
    if (e.module != "test") by_module[e.module].push_back(&e);
  REQUIRE(!by_module.empty());
  for (const auto& [module, entries] : by_module) {
    INFO("module " << module);
    const auto ptx_path = std::filesystem::path(METRALE_PTX_DIR) / (module + ".ptx");
    const auto cu_path = std::filesystem::path(METRALE_KERNEL_DIR) / (module + ".cu");
    REQUIRE(std::filesystem::exists(ptx_path));
    REQUIRE(std::filesystem::exists(cu_path));
    const auto ptx = ptx_entries(slurp(ptx_path));
    const auto src = source_entries(slurp(cu_path));
    CHECK(ptx.size() == entries.size());  // no kernel without a port, no port without a kernel
    for (const auto* e : entries) {
      INFO("kernel " << e->entry);
      REQUIRE(ptx.count(e->entry) == 1);
      REQUIRE(src.count(e->entry) == 1);
      const auto& types = ptx.at(e->entry);
      const auto& names = src.at(e->entry);
      REQUIRE(types.size() == e->params.size());
      REQUIRE(names.size() == e->params.size());
      for (std::size_t i = 0; i < e->params.size(); ++i) {
        INFO("parameter " << i << " declared " << e->params[i].name << " " << to_string(e->params[i].kind) << ", ptx "
                          << types[i] << ", source " << names[i]);
        CHECK(ptx_type_matches(e->params[i].kind, types[i]));
        CHECK(names[i] == e->params[i].name);
      }
    }
  }
}

#endif  // METRALE_PTX_DIR
