// KV capacity (issue 5): stateful tests (rc::state) of the paged cache under the DeepSeek decoder
// and of MlaDeviceKv against simple models, to capacity and past it, with a block-table entry
// beyond the pool and pools past 2^31 bytes (tests/props/capacity.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("the paged cache under the DeepSeek decoder follows its model to capacity and past it",
          "[prop][capacity]") {
  check("the paged cache under the DeepSeek decoder follows its model to capacity and past it");
}

TEST_CASE("paged caches with rows past 2^31 bytes follow the model", "[prop][capacity]") {
  check("paged caches with rows past 2^31 bytes follow the model");
}

TEST_CASE("MlaDeviceKv follows its model to capacity and past it", "[prop][capacity]") {
  check("MlaDeviceKv follows its model to capacity and past it");
}

}  // namespace
