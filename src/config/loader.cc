#include "config/loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <system_error>
#include <utility>

#include "config/loader_sections.h"

namespace sluice::config {

std::string ConfigError::toString() const {
  std::string out = file;
  if (line > 0) {
    out += (out.empty() ? "" : ":") + std::to_string(line);
    if (column > 0) out += ":" + std::to_string(column);
  }
  if (!out.empty()) out += ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

namespace loader_internal {

bool isEnvironmentName(std::string_view name) {
  return isName(name) && name.find_first_of(".-") == std::string_view::npos &&
         !(name[0] >= '0' && name[0] <= '9');
}

std::string errnoMessage(int error) { return std::generic_category().message(error); }

std::optional<std::string> unreadableFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errnoMessage(errno);
  if (S_ISDIR(st.st_mode)) return errnoMessage(EISDIR);
  if (::access(path.c_str(), R_OK) != 0) return errnoMessage(errno);
  return std::nullopt;
}

void Loader::load(const toml::table& root) {
  TableReader r(root, "", diag_);
  section(r, "server", [&](TableReader& s) { loadServer(s); });
  section(r, "admin", [&](TableReader& s) { loadAdmin(s); });
  section(r, "log", [&](TableReader& s) { loadLog(s); });
  const bool has_valkey_table = section(r, "valkey", [&](TableReader& s) { loadValkey(s); });
  section(r, "identity", [&](TableReader& s) { loadIdentity(s); });
  entries(r, "upstream", [&](TableReader& e) { loadUpstream(e); });
  entries(r, "limit", [&](TableReader& e) { loadLimit(e); });
  entries(r, "route", [&](TableReader& e) { loadRoute(e); });
  entries(r, "plan", [&](TableReader& e) { loadPlan(e); });
  entries(r, "tenant", [&](TableReader& e) { loadTenant(e); });
  section(r, "rls", [&](TableReader& s) { loadRls(s); });
  r.finish();

  if ((has_valkey_table || !config_.limits.empty() || config_.rls) && !config_.hasValkey()) {
    std::string unused;
    config_.valkey.address = parseSocketAddress("127.0.0.1:6379", false, &unused);
  }
}

// The required `name` of an entry: its characters, and no earlier entry of the same kind
// with that name. `index` is the entry's position in its Config vector.
void Loader::readName(TableReader& r, std::string_view kind, NameIndex& names, size_t index,
                      std::string* out) {
  const toml::node* node = r.node("name");
  if (!node) return r.missing("name");
  const auto name = readString(*node, r.keyPath("name"), diag_);
  if (!name) return;
  *out = *name;
  if (name->empty()) {
    r.error("name", "must not be empty");
  } else if (!isName(*name)) {
    r.error("name", std::string(kind) + " name " + inQuotes(*name) +
                        " may only hold letters, digits, '_', '.' and '-'");
  }
  const int line = positionOf(node->source()).line;
  auto [it, inserted] = names.entries.emplace(*name, NameIndex::Entry{index, line});
  if (inserted) {
    names.names.push_back(*name);
  } else {
    r.error("name", "duplicate " + std::string(kind) + " name " + inQuotes(*name) +
                        " (first defined at line " + std::to_string(it->second.line) + ")");
  }
}

// A file the server opens later (certificate, key, CA bundle). Relative paths are relative
// to the current directory, as the process will see them.
std::optional<std::string> Loader::readFile(TableReader& r, std::string_view key, bool required,
                                            bool check) {
  const toml::node* node = r.node(key);
  if (!node) {
    if (required) r.missing(key);
    return std::nullopt;
  }
  auto path = readString(*node, r.keyPath(key), diag_);
  if (!path) return std::nullopt;
  if (path->empty()) {
    r.error(key, "must not be empty");
  } else if (auto why = check ? unreadableFile(*path) : std::nullopt) {
    r.error(key, "cannot read " + inQuotes(*path) + ": " + *why);
  }
  return path;
}

}  // namespace loader_internal

namespace {

using namespace loader_internal;

// A configuration file bigger than this is a mistake (a log file given by accident).
constexpr size_t kMaxFileBytes = 16 << 20;

// Reads a whole file; on failure says why (strerror) in *error.
bool readWholeFile(const std::string& path, std::string* out, std::string* error) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) {
    *error = errnoMessage(errno);
    return false;
  }
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0 && out->size() <= kMaxFileBytes) {
    out->append(buffer, n);
  }
  const int read_errno = errno;
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) {
    *error = errnoMessage(read_errno);
    return false;
  }
  if (out->size() > kMaxFileBytes) {
    *error = "larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB";
    return false;
  }
  return true;
}

}  // namespace

LoadResult loadConfigString(std::string_view toml, const std::string& source_name) {
  LoadResult result;
  try {
    Diagnostics diag(source_name);
    auto config = std::make_shared<Config>();
    config->source_path = source_name;
    // Defaults that config.h cannot spell as member initializers.
    std::string unused;
    config->server.listen = *parseSocketAddress("0.0.0.0:8080", false, &unused);
    config->admin.listen = *parseSocketAddress("127.0.0.1:9901", false, &unused);
    try {
      const toml::table root = toml::parse(toml, std::string_view(source_name));
      Loader(diag, *config).load(root);
      resolveSharedQuotas(*config);
    } catch (const toml::parse_error& e) {
      diag.add(positionOf(e.source()), "", std::string(e.description()));
    }
    result.errors = std::move(diag).sorted();
    if (result.errors.empty()) result.config = std::move(config);
  } catch (const std::exception& e) {
    result.config.reset();
    result.errors.push_back(
        ConfigError{source_name, 0, 0, "", std::string("internal error: ") + e.what()});
  }
  return result;
}

LoadResult loadConfigFile(const std::string& path) {
  try {
    std::string text, error;
    if (!readWholeFile(path, &text, &error)) {
      LoadResult result;
      result.errors.push_back(ConfigError{path, 0, 0, "", "cannot read: " + error});
      return result;
    }
    return loadConfigString(text, path);
  } catch (const std::exception& e) {
    LoadResult result;
    result.errors.push_back(
        ConfigError{path, 0, 0, "", std::string("internal error: ") + e.what()});
    return result;
  }
}

}  // namespace sluice::config