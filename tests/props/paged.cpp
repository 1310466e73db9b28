// Paged block tables (issue 5): random batches through both paged-decode kernels, the split path
// and the cache stores, against the float64 reference. The cases come from core's generators,
// which poison every output (NaN BF16, 0xA5 bytes) before the run, so an unwritten element fails.
#include <rapidcheck.h>

#include "arb.hpp"
#include "props.hpp"

namespace metrale::props {

namespace {

void seed_kernels() {
  const auto spec = arb_paged_spec(*rc::gen::element(KvFormat::fp8, KvFormat::nvfp4));
  auto c = gen::paged_decode_case(spec);
  note_input(spec.vars(), {c});
  check_case(c);
}

void split_path() {
  // Both paths over the same batch: the dispatcher's choice must not change the answer.
  const auto spec = arb_split_spec(*rc::gen::element(KvFormat::fp8, KvFormat::nvfp4));
  auto seed = gen::paged_decode_case(spec);
  auto split = gen::split_path_case(spec);
  note_input(spec.vars(), {seed, split});
  check_case(seed);
  check_case(split);
}

void cache_stores() {
  const std::string entry = *rc::gen::element<std::string>("mla_paged_cache_store_fp8", "mla_paged_cache_store_nvfp4");
  auto c = arb_kernel_case("mla_absorbed", entry);
  note_input(c.name, {c});
  check_case(c);
}

}  // namespace

std::vector<Property> paged_properties() {
  return {{"paged decode of random batches matches the float64 reference", seed_kernels},
          {"the split path and the seed kernel of one batch both match the float64 reference", split_path},
          {"cache stores to random slots write exactly the encoded rows", cache_stores}};
}

}  // namespace metrale::props
