#include "identity/body_fields.h"

#include <nlohmann/json.hpp>

#include "http/headers.h"
#include "identity/request_facts.h"

namespace sluice::identity {

namespace {

// "application/json; charset=utf-8" -> "application/json"
std::string mediaType(std::string_view content_type) {
  return http::toLower(http::trim(content_type.substr(0, content_type.find(';'))));
}

bool isJson(const std::string& type) {
  return type == "application/json" ||
         (type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0);
}

std::optional<std::string> formField(std::string_view body, std::string_view name) {
  return queryValue(body, name);
}

std::optional<std::string> jsonField(std::string_view body, std::string_view path) {
  // A library parses it (nlohmann-json): strict, no exceptions, depth limited by the body size.
  const nlohmann::json document = nlohmann::json::parse(body, nullptr, false);
  if (document.is_discarded()) return std::nullopt;
  const nlohmann::json* node = &document;
  while (true) {
    const auto dot = path.find('.');
    const std::string key(path.substr(0, dot));
    if (!node->is_object()) return std::nullopt;
    auto it = node->find(key);
    if (it == node->end()) return std::nullopt;
    node = &*it;
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  if (node->is_string()) return node->get<std::string>();
  if (node->is_number() || node->is_boolean()) return node->dump();
  return std::nullopt;
}

}  // namespace

std::optional<std::string> bodyField(const config::KeyPart& part, std::string_view content_type,
                                     std::string_view body) {
  const std::string type = mediaType(content_type);
  std::optional<std::string> value;
  if (part.kind == config::KeyPartKind::Form && type == "application/x-www-form-urlencoded") {
    value = formField(body, part.name);
  } else if (part.kind == config::KeyPartKind::Json && isJson(type)) {
    value = jsonField(body, part.name);
  }
  if (value && value->empty()) return std::nullopt;
  return value;
}

}  // namespace sluice::identity
