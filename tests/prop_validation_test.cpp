// Launcher validation as properties (issue 5): every rule of every launcher, and the decode entry
// points' size checks, refuse a random bad value before any backend call (tests/props/validation.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("every launcher validation rule refuses its bad value before any backend call", "[prop][validation]") { check("every launcher validation rule refuses its bad value before any backend call"); }

TEST_CASE("the K3 decode paths refuse q, k, v or g of the wrong size before any backend call", "[prop][validation]") { check("the K3 decode paths refuse q, k, v or g of the wrong size before any backend call"); }

TEST_CASE("the DeepSeek decode step refuses inputs of the wrong size before any backend call", "[prop][validation]") { check("the DeepSeek decode step refuses inputs of the wrong size before any backend call"); }

}  // namespace
