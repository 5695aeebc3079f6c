#include "identity/request_facts.h"

#include "identity/body_fields.h"

namespace sluice::identity {

namespace {

// Calls fn(name, value) for each `name=value` of a list separated by `separator`; stops when
// fn returns true.
template <typename Fn>
bool forEachPair(std::string_view text, char separator, Fn&& fn) {
  while (!text.empty()) {
    const auto end = text.find(separator);
    std::string_view pair = text.substr(0, end);
    const auto eq = pair.find('=');
    if (fn(pair.substr(0, eq),
           eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1))) {
      return true;
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return false;
}

}  // namespace

std::string formDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < text.size() && http::hexDigit(text[i + 1]) >= 0 &&
               http::hexDigit(text[i + 2]) >= 0) {
      out.push_back(
          static_cast<char>(http::hexDigit(text[i + 1]) * 16 + http::hexDigit(text[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::optional<std::string> queryValue(std::string_view query, std::string_view name) {
  std::optional<std::string> found;
  forEachPair(query, '&', [&](std::string_view n, std::string_view v) {
    if (formDecode(n) != name) return false;
    found = formDecode(v);
    return true;
  });
  return found;
}

namespace {

// Collects values: the first one found, ambiguous when a different one follows.
void addValue(FieldValue& field, std::string value) {
  if (!field.value) {
    field.value = std::move(value);
  } else if (*field.value != value) {
    field.ambiguous = true;
  }
}

FieldValue dropEmpty(FieldValue field) {
  if (field.value && field.value->empty() && !field.ambiguous) field.value.reset();
  return field;
}

FieldValue single(std::optional<std::string> value) {
  FieldValue field;  // an empty value is no value
  if (value && !value->empty()) field.value = std::move(value);
  return field;
}

}  // namespace

FieldValue headerField(const http::HeaderMap& headers, std::string_view name) {
  FieldValue field;
  for (const auto& h : headers) {
    if (http::iequals(h.name, name)) addValue(field, h.value);
  }
  return field;
}

FieldValue queryField(std::string_view query, std::string_view name) {
  FieldValue field;
  forEachPair(query, '&', [&](std::string_view n, std::string_view v) {
    if (formDecode(n) == name) addValue(field, formDecode(v));
    return false;
  });
  return field;
}

FieldValue cookieField(const http::HeaderMap& headers, std::string_view name) {
  // Every occurrence, in every Cookie field: the first wins in some servers, the last in others
  // (Django, Python's http.cookies), so two different values are refused, not picked.
  FieldValue field;
  for (const auto& h : headers) {
    if (!http::iequals(h.name, "cookie")) continue;
    forEachPair(h.value, ';', [&](std::string_view n, std::string_view v) {
      if (http::trim(n) != name) return false;
      v = http::trim(v);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      addValue(field, std::string(v));
      return false;
    });
  }
  return field;
}

FieldValue keyPartValue(const config::KeyPart& part, const RequestFacts& facts) {
  using Kind = config::KeyPartKind;
  switch (part.kind) {
    case Kind::Ip:
      return single(facts.client_key);
    case Kind::ApiKey:
      return single(facts.api_key);
    case Kind::Session: {
      FieldValue field = single(facts.session);
      field.ambiguous = facts.session_ambiguous;
      return field;
    }
    case Kind::Tenant:
      return single(facts.tenant);
    case Kind::Route:
      return single(std::string(facts.route));
    case Kind::Method:
      return single(facts.head->method);
    case Kind::Header:
      return dropEmpty(headerField(facts.head->headers, part.name));
    case Kind::Cookie:
      return dropEmpty(cookieField(facts.head->headers, part.name));
    case Kind::Query:
      return dropEmpty(queryField(facts.query, part.name));
    case Kind::Form: {
      FieldValue field = bodyField(part, facts.content_type, facts.body);
      FieldValue in_query = queryField(facts.query, part.name);
      if (in_query.ambiguous) field.ambiguous = true;
      if (in_query.value && !field.ambiguous) addValue(field, std::move(*in_query.value));
      return dropEmpty(std::move(field));
    }
    case Kind::Json:
      return dropEmpty(bodyField(part, facts.content_type, facts.body));
  }
  return {};
}

}  // namespace sluice::identity
