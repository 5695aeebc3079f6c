#pragma once

// The loader's sections (loader.cc: the entry points and the shared readers;
// loader_server.cc: [server], [log], [valkey], [identity]; loader_routes.cc:
// [[upstream]], [[route]]; loader_limits.cc: [[limit]], [[plan]], [[tenant]]; loader_rls.cc:
// [rls]). Internal to src/config/.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/loader_table_reader.h"

namespace sluice::config::loader_internal {

// POSIX shells accept [A-Za-z_][A-Za-z0-9_]* as variable names.
bool isEnvironmentName(std::string_view name);

// strerror's message for an errno value.
std::string errnoMessage(int error);

// Only checks that the file can be opened for reading (a message why not): whether it
// holds a usable PEM certificate or key is for the TLS code to say when it loads it.
std::optional<std::string> unreadableFile(const std::string& path);

// Where each name of one kind (upstream, limit, ...) was declared, to resolve references and
// refuse duplicates.
struct NameIndex {
  struct Entry {
    size_t index;
    int line;
  };
  std::map<std::string, Entry> entries;
  std::vector<std::string> names;  // for suggestions

  const Entry* find(const std::string& name) const {
    auto it = entries.find(name);
    return it == entries.end() ? nullptr : &it->second;
  }
};

// Walks the root table and fills a Config, section by section. References between sections
// (a route's upstream and limits, a plan's limits, a tenant's plan) are resolved against the
// entries read before them, hence the order in load().
class Loader {
 public:
  Loader(Diagnostics& diag, Config& config) : diag_(diag), config_(config) {}

  void load(const toml::table& root);

 private:
  // A [name] table; returns whether it is present.
  template <class F>
  bool section(TableReader& parent, std::string_view key, F&& read) {
    const toml::node* node = parent.node(key);
    if (!node) return false;
    const toml::table* table = node->as_table();
    if (!table) {
      diag_.add(*node, parent.keyPath(key), "expected a table, got " + describe(*node));
      return true;
    }
    TableReader reader(*table, parent.keyPath(key), diag_);
    read(reader);
    reader.finish();
    return true;
  }

  // The entries of a [[name]] array of tables, each read under the path "name[i]".
  template <class F>
  void entries(TableReader& parent, std::string_view key, F&& read) {
    const toml::node* node = parent.node(key);
    if (!node) return;
    const std::string path = parent.keyPath(key);
    const toml::array* array = node->as_array();
    if (!array) {
      diag_.add(*node, path,
                "expected an array of tables ([[" + path + "]]), got " + describe(*node));
      return;
    }
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      const std::string element_path = path + "[" + std::to_string(i) + "]";
      const toml::table* table = element.as_table();
      if (!table) {
        diag_.add(element, element_path, "expected a table, got " + describe(element));
        continue;
      }
      TableReader reader(*table, element_path, diag_);
      read(reader);
      reader.finish();
    }
  }

  // The required `name` of an entry: its characters, and no earlier entry of the same kind
  // with that name. `index` is the entry's position in its Config vector.
  void readName(TableReader& r, std::string_view kind, NameIndex& names, size_t index,
                std::string* out);

  // A file the server opens later (certificate, key, CA bundle). Relative paths are relative
  // to the current directory, as the process will see them.
  std::optional<std::string> readFile(TableReader& r, std::string_view key, bool required,
                                      bool check = true);

  void loadServer(TableReader& r);

  void readCertificate(TableReader& r, TlsCertificate* out);

  void loadAdmin(TableReader& r);
  void loadLog(TableReader& r);

  void loadValkey(TableReader& r);

  void loadIdentity(TableReader& r);

  void loadUpstream(TableReader& r);

  void loadLimit(TableReader& r);

  void readCostFrom(TableReader& r, const std::string& text, LimitConfig& l);
  void readOnMissingAndFold(TableReader& r, LimitConfig& l);
  void readKeyPart(const StringItem& item, LimitConfig& l);

  void loadRoute(TableReader& r);

  void readMatch(TableReader& m, RouteMatch& match);

  void loadPlan(TableReader& r);

  void loadTenant(TableReader& r);

  void loadRls(TableReader& r);
  void loadRlsDescriptor(TableReader& r, RlsConfig& rls);

  Diagnostics& diag_;
  Config& config_;
  NameIndex upstreams_, limits_, routes_, plans_, tenants_;
  struct ApiKeyOwner {
    size_t tenant_index;
    std::string tenant;
    int line;
  };
  std::map<std::string, ApiKeyOwner> api_keys_;
  int catch_all_line_ = 0;  // of the first route that matches every request
};

}  // namespace sluice::config::loader_internal
