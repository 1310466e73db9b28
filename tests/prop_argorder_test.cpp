// Argument ordering (issue 5): sentinels through every launcher and dispatcher reach the parameter of
// the same name in the emulator's launch record (tests/props/argorder.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("random sentinels through every launcher reach the declared parameters of their names", "[prop][argorder]") { check("random sentinels through every launcher reach the declared parameters of their names"); }

TEST_CASE("the paged-decode dispatchers route every argument to the kernels they choose", "[prop][argorder]") { check("the paged-decode dispatchers route every argument to the kernels they choose"); }

TEST_CASE("the batched GEMV dispatcher routes every argument to the kernel it chooses", "[prop][argorder]") { check("the batched GEMV dispatcher routes every argument to the kernel it chooses"); }

}  // namespace
