#include "identity/tenant_lookup.h"

namespace sluice::identity {

std::vector<std::string> tenantLookupCommand(std::string_view tenant_key_prefix,
                                             std::string_view api_key) {
  std::string key(tenant_key_prefix);
  key += ':';
  key += api_key;
  return {"HMGET", std::move(key), "tenant", "plan"};
}

TenantRecord tenantFromReply(const valkey::Reply& reply) {
  using Type = valkey::Reply::Type;
  TenantRecord record;
  if (reply.type == Type::Array && reply.elements.size() == 2 &&
      reply.elements[0].type == Type::String && !reply.elements[0].text.empty()) {
    record.known = true;
    record.tenant = reply.elements[0].text;
    if (reply.elements[1].type == Type::String) record.plan = reply.elements[1].text;
  }
  return record;
}

}  // namespace sluice::identity
