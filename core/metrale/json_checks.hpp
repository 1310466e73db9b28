// A first pass over a JSON document from outside (a safetensors header, a baseline file) that
// refuses a hostile one before it is parsed into memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace metrale {

/// What `check_json_shape` allows, and the words its errors start with.
struct JsonShape {
  std::string subject;                   ///< the errors' first words, e.g. "x.safetensors: header"
  int max_depth = 8;                     ///< containers open at once
  std::uint64_t max_values = 1'000'000;  ///< values of any kind, containers included
  std::string values_hint;               ///< said after the too-many-values error; may be empty
};

/// One pass over the JSON `text` that builds nothing: the nesting depth, the number of values
/// and, in every object, each key once (a parser keeps the last of two silently, so two readers
/// could see different documents). nlohmann's parser callback could check the same, but it
/// rescans the enclosing object at each nested object's end: quadratic in an object's size (a
/// safetensors header of 50,000 entries took minutes; a --torch file of 240,000 keys, 51 s).
/// Errors: `invalid_argument`, starting with `shape.subject`: "holds a NUL byte at offset <n>",
/// "starts with a byte-order mark", "is not valid json: <the parser's
/// reason>", "nests deeper than <max_depth> levels", "holds more than <max_values> json
/// values<values_hint>", "has key '<key>' twice in one object" (the key cut to an excerpt).
void check_json_shape(std::string_view text, const JsonShape& shape);

}  // namespace metrale
