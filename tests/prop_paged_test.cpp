// Paged block tables (issue 5): random batches — seq_lens at 0, 1 and the block edges, block
// sizes 1..512, permuted sparse blocks, garbage in unused columns, q/kv head ratios, windows,
// sinks, compressed pools, FP8 scales that are not powers of two, NVFP4 zero groups — through
// both decode paths and the cache stores, against the float64 reference (tests/props/paged.cpp).
#include <rapidcheck/catch.h>

#include <string>

#include "props/props.hpp"

namespace {

void check(const std::string& name) { rc::prop(name, metrale::props::property(name).check); }

TEST_CASE("paged decode of random batches matches the float64 reference", "[prop][paged]") {
  check("paged decode of random batches matches the float64 reference");
}

TEST_CASE("the split path and the seed kernel of one batch both match the float64 reference", "[prop][paged]") {
  check("the split path and the seed kernel of one batch both match the float64 reference");
}

TEST_CASE("cache stores to random slots write exactly the encoded rows", "[prop][paged]") {
  check("cache stores to random slots write exactly the encoded rows");
}

}  // namespace
