#include "identity/body_fields.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

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

FieldValue jsonField(std::string_view body, std::string_view path) {
  // A library parses it (nlohmann-json): strict, no exceptions, depth limited by the body size.
  // The callback sees every key of every object, to find duplicates.
  std::vector<std::vector<std::string>> keys;
  bool duplicate = false;
  const nlohmann::json document = nlohmann::json::parse(
      body,
      [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) {
          keys.emplace_back();
        } else if (event == Event::object_end) {
          if (!keys.empty()) keys.pop_back();
        } else if (event == Event::key && !keys.empty()) {
          auto& seen = keys.back();
          const std::string& key = parsed.get_ref<const std::string&>();
          if (std::find(seen.begin(), seen.end(), key) != seen.end()) duplicate = true;
          seen.push_back(key);
        }
        return true;
      },
      false);
  FieldValue field;
  if (document.is_discarded()) return field;
  if (duplicate) {
    field.ambiguous = true;
    return field;
  }
  const nlohmann::json* node = &document;
  while (true) {
    const auto dot = path.find('.');
    const std::string key(path.substr(0, dot));
    if (!node->is_object()) return field;
    auto it = node->find(key);
    if (it == node->end()) return field;
    node = &*it;
    if (dot == std::string_view::npos) break;
    path.remove_prefix(dot + 1);
  }
  if (node->is_string()) {
    field.value = node->get<std::string>();
  } else if (node->is_number() || node->is_boolean()) {
    field.value = node->dump();
  }
  return field;
}

}  // namespace

FieldValue bodyField(const config::KeyPart& part, std::string_view content_type,
                     std::string_view body) {
  const std::string type = mediaType(content_type);
  if (part.kind == config::KeyPartKind::Form && type == "application/x-www-form-urlencoded") {
    return queryField(body, part.name);
  }
  if (part.kind == config::KeyPartKind::Json && isJson(type)) return jsonField(body, part.name);
  return {};
}

}  // namespace sluice::identity
