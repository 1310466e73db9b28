// Allocation (issue 5): every launcher and decode entry point over random valid inputs leaves the
// emulator's live allocations exactly as they were, its checked memory faulting any bad access
// (tests/props/alloc.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("every launcher over random valid inputs leaves live allocations as they were", "[prop][alloc]") { check("every launcher over random valid inputs leaves live allocations as they were"); }

TEST_CASE("the K3 decode entry points leave live allocations as they were", "[prop][alloc]") { check("the K3 decode entry points leave live allocations as they were"); }

TEST_CASE("the DeepSeek decode entry points leave live allocations as they were", "[prop][alloc]") { check("the DeepSeek decode entry points leave live allocations as they were"); }

TEST_CASE("the paged-decode dispatchers reuse one workspace and leave nothing behind", "[prop][alloc]") { check("the paged-decode dispatchers reuse one workspace and leave nothing behind"); }

}  // namespace
