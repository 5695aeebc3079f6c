#include <filesystem>
#include <memory>
#include <utility>

#include "config/loader_sections.h"
#include "config/ratelimit_yaml.h"

namespace sluice::config::loader_internal {

// [rls]: Sluice as Envoy's rate limit service.

void Loader::loadRls(TableReader& r) {
  RlsConfig rls;
  if (auto v = r.address("listen", AddressUse::Listen)) {
    rls.listen = *v;
    // The service is not served yet (issue 45): its configuration is read and checked whole,
    // its YAML files too, and the listener refused until it answers calls.
    r.error("listen",
            "the rate limit service for Envoy is not served in this version yet: [rls] is "
            "checked (its YAML files too) but cannot be used");
  } else if (!r.has("listen")) {
    r.missing("listen");
  }
  section(r, "tls", [&](TableReader& t) { readCertificate(t, &rls.tls.emplace()); });
  if (auto v = r.boolean("merge_domains")) rls.merge_domains = *v;
  if (auto v = r.enumeration<RlsConfig::Charge>(
          "charge", {{"all_or_nothing", RlsConfig::Charge::AllOrNothing},
                     {"each", RlsConfig::Charge::Each}})) {
    rls.charge = *v;
  }
  if (auto v = r.enumeration<OnError>("on_error",
                                      {{"allow", OnError::Allow}, {"deny", OnError::Deny}})) {
    rls.on_error = *v;
  }
  if (auto dir = r.string("config")) {
    if (dir->empty()) {
      r.error("config", "must not be empty (leave it out for no YAML limits)");
    } else {
      // Relative to the configuration file's folder, as envoyproxy/ratelimit's files sit
      // beside the deployment's other configuration.
      std::filesystem::path path(*dir);
      if (path.is_relative()) {
        path = std::filesystem::path(config_.source_path).parent_path() / path;
      }
      rls.config_dir = path.lexically_normal().string();
      std::error_code ec;
      if (!std::filesystem::is_directory(rls.config_dir, ec)) {
        r.error("config", "not a folder: " + loader_internal::quoted(rls.config_dir) +
                              (ec ? " (" + ec.message() + ")" : std::string()));
      } else {
        auto yaml = std::make_shared<RateLimitYaml>();
        std::string error;
        if (yaml->addDirectory(rls.config_dir, rls.merge_domains, error)) {
          rls.yaml = std::move(yaml);
        } else {
          r.error("config", error);  // "FILE:LINE:COL: why" of the YAML file
        }
      }
    }
  }
  config_.rls = std::move(rls);
}

}  // namespace sluice::config::loader_internal
