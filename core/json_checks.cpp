#include "metrale/json_checks.hpp"

#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrale/error.hpp"

namespace metrale {
namespace {

using Json = nlohmann::json;

class ShapeChecks final : public nlohmann::json_sax<Json> {
 public:
  explicit ShapeChecks(const JsonShape& shape) : shape_(shape) {}
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    value();
    open(true);
    return true;
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second)
      fail(Errc::invalid_argument, "{} has key '{}' twice in one object", shape_.subject, excerpt(k));
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    value();
    open(false);
    return true;
  }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(Errc::invalid_argument, "{} is not valid json: {}", shape_.subject, e.what());
  }

 private:
  bool value() {
    if (++values_ > shape_.max_values)
      fail(Errc::invalid_argument, "{} holds more than {} json values{}", shape_.subject, shape_.max_values,
           shape_.values_hint);
    return true;
  }
  void open(bool object) {
    if (++depth_ > shape_.max_depth)
      fail(Errc::invalid_argument, "{} nests deeper than {} levels", shape_.subject, shape_.max_depth);
    if (object) keys_.emplace_back();
    objects_.push_back(object);
  }
  bool close() {
    if (objects_.back()) keys_.pop_back();
    objects_.pop_back();
    --depth_;
    return true;
  }
  const JsonShape& shape_;
  int depth_ = 0;
  std::uint64_t values_ = 0;
  std::vector<bool> objects_;                          // each open container: an object?
  // one set per open object, innermost last (ordered: no hash a crafted file could make collide)
  std::vector<std::set<std::string>> keys_;
};

}  // namespace

void check_json_shape(std::string_view text, const JsonShape& shape) {
  // The parser would stop at a NUL (and ignore what follows: the adversarial trial, forty-ninth
  // session, on a --torch file) and skip a byte-order mark; JSON text has neither.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    fail(Errc::invalid_argument, "{} holds a NUL byte at offset {}", shape.subject, nul);
  if (text.starts_with("\xEF\xBB\xBF")) fail(Errc::invalid_argument, "{} starts with a byte-order mark", shape.subject);
  ShapeChecks checks(shape);
  Json::sax_parse(text.begin(), text.end(), &checks);
}

}  // namespace metrale
