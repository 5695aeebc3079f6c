#include "identity/body_fields.h"

#include <nlohmann/json.hpp>
#include <unordered_set>
#include <vector>

#include "http/headers.h"
#include "identity/request_facts.h"

namespace sluice::identity {

namespace {

// "application/json; charset=utf-8" -> "application/json"
std::string mediaType(std::string_view content_type) {
  return http::toLower(http::trim(content_type.substr(0, content_type.find(';'))));
}

// The value of parameter `name` in "type; a=1; name=\"v\"" (quoted or not), or nullopt.
std::optional<std::string> parameter(std::string_view text, std::string_view name) {
  size_t semicolon = text.find(';');
  while (semicolon != std::string_view::npos) {
    text.remove_prefix(semicolon + 1);
    const size_t eq = text.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = http::trim(text.substr(0, eq));
    text.remove_prefix(eq + 1);
    text = http::trim(text);
    std::string value;
    if (!text.empty() && text.front() == '"') {
      size_t i = 1;
      for (; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) ++i;
        value.push_back(text[i]);
      }
      if (i >= text.size()) return std::nullopt;  // unterminated quoted string
      text.remove_prefix(i + 1);
    } else {
      const size_t end = text.find(';');
      value = std::string(http::trim(text.substr(0, end)));
      text.remove_prefix(end == std::string_view::npos ? text.size() : end);
    }
    if (http::iequals(key, name)) return value;
    semicolon = text.find(';');
  }
  return std::nullopt;
}

FieldValue jsonField(std::string_view body, std::string_view path) {
  // A library parses it (nlohmann-json): strict, no exceptions, depth limited by the body size.
  // The callback sees every key of every object, to find duplicates: one hash set per object
  // being parsed, so the check is linear in the keys (a list per object made a body of 4,000
  // keys cost 27 ms of the loop).
  std::vector<std::unordered_set<std::string>> keys;
  bool duplicate = false;
  const nlohmann::json document = nlohmann::json::parse(
      body,
      [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) {
          keys.emplace_back();
        } else if (event == Event::object_end) {
          if (!keys.empty()) keys.pop_back();
        } else if (event == Event::key && !keys.empty() && !duplicate) {
          if (!keys.back().insert(parsed.get_ref<const std::string&>()).second) duplicate = true;
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
  // Only a string is a value: an application that compares ["victim"] or 42 with an account
  // name reads it in its own way (the first element, "42"), which the key cannot follow.
  if (node->is_string()) {
    field.value = node->get<std::string>();
  } else {
    field.not_string = true;
  }
  return field;
}

constexpr std::string_view kCrlf = "\r\n";

}  // namespace

FieldValue multipartField(std::string_view content_type, std::string_view body,
                          std::string_view name) {
  // RFC 2046 5.1.1 and RFC 7578: "--boundary" lines separate the parts; each part has header
  // fields, an empty line and its content; "--boundary--" ends the body. A body that does not
  // follow this has no readable field (the limit's on_missing decides).
  FieldValue field;
  const std::optional<std::string> boundary = parameter(content_type, "boundary");
  if (!boundary || boundary->empty() || boundary->size() > 70) return field;
  const std::string delimiter = "--" + *boundary;
  // The first delimiter: at the start, or after a preamble and a line break.
  size_t at = 0;
  if (body.substr(0, delimiter.size()) != delimiter) {
    at = body.find(std::string(kCrlf) + delimiter);
    if (at == std::string_view::npos) return field;
    at += kCrlf.size();
  }
  FieldValue found;
  while (true) {
    at += delimiter.size();
    if (body.substr(at, 2) == "--") return found;  // the close delimiter: the body is whole
    // Transport padding (spaces, tabs) may follow a delimiter before its line break.
    while (at < body.size() && (body[at] == ' ' || body[at] == '\t')) ++at;
    if (body.substr(at, 2) != kCrlf) return field;
    at += 2;
    const size_t head_end = body.find("\r\n\r\n", at);
    const size_t content_end = body.find(std::string(kCrlf) + delimiter, at);
    if (content_end == std::string_view::npos) return field;  // no delimiter after the part
    std::string_view head;
    std::string_view content;
    if (body.substr(at, 2) == kCrlf) {  // a part without header fields
      content = body.substr(at + 2, content_end >= at + 2 ? content_end - at - 2 : 0);
    } else if (head_end == std::string_view::npos || head_end + 2 >= content_end) {
      head = body.substr(at, content_end - at);  // header fields only, no empty line: no content
    } else {
      head = body.substr(at, head_end - at);
      content = body.substr(head_end + 4, content_end - head_end - 4);
    }
    std::optional<std::string> part_name;
    bool file = false;
    while (!head.empty()) {
      const size_t end = head.find(kCrlf);
      const std::string_view line = head.substr(0, end);
      head.remove_prefix(end == std::string_view::npos ? head.size() : end + 2);
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos) return field;
      if (!http::iequals(http::trim(line.substr(0, colon)), "content-disposition")) continue;
      const std::string_view disposition = line.substr(colon + 1);
      if (mediaType(disposition) != "form-data") return field;
      part_name = parameter(disposition, "name");
      file = parameter(disposition, "filename").has_value();
    }
    // A file (filename=...) is not a field: frameworks keep files apart from form fields.
    if (part_name && *part_name == name && !file) {
      if (!found.value) {
        found.value = std::string(content);
      } else if (*found.value != content) {
        found.ambiguous = true;
      }
    }
    at = content_end + kCrlf.size();
  }
}

FieldValue bodyField(const config::KeyPart& part, std::string_view content_type,
                     std::string_view body) {
  if (part.kind == config::KeyPartKind::Json) return jsonField(body, part.name);
  if (part.kind != config::KeyPartKind::Form) return {};
  if (mediaType(content_type) == "multipart/form-data") {
    return multipartField(content_type, body, part.name);
  }
  return queryField(body, part.name);
}

}  // namespace sluice::identity
