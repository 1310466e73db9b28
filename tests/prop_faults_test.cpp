// Free on error (issue 5), SQLite-style: every backend call of the DeepSeek step and append, the K3
// decode paths, MlaDeviceKv and the split-path dispatcher made to fail once and from then on, over
// random scenarios (tests/props/faults.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("a DeepSeek decode step failing at any backend call leaves the paged cache as it was", "[prop][faults]") { check("a DeepSeek decode step failing at any backend call leaves the paged cache as it was"); }

TEST_CASE("a DeepSeek append_kv failing at any backend call leaves the paged cache as it was", "[prop][faults]") { check("a DeepSeek append_kv failing at any backend call leaves the paged cache as it was"); }

TEST_CASE("a K3 decode failing at any backend call leaves the KV, the caller's q and k and memory as they were", "[prop][faults]") { check("a K3 decode failing at any backend call leaves the KV, the caller's q and k and memory as they were"); }

TEST_CASE("MlaDeviceKv alloc, upload and append failing at any backend call leave nothing behind", "[prop][faults]") { check("MlaDeviceKv alloc, upload and append failing at any backend call leave nothing behind"); }

TEST_CASE("the split-path dispatcher failing at any backend call leaks nothing and retries exactly", "[prop][faults]") { check("the split-path dispatcher failing at any backend call leaks nothing and retries exactly"); }

}  // namespace
