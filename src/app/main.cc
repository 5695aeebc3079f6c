// sluice: the command line (PRODUCT.md). CLI11 parses it: it gives --help, clear errors for
// unknown flags and the -c/--config pair without hand-written argv handling.

#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/server.h"
#include "config/loader.h"

#ifdef SLUICE_JEMALLOC
// jemalloc's settings, read at its start (MALLOC_CONF in the environment adds to them): freed
// pages go back to the system after about a second, by jemalloc's background thread rather
// than by the workers (as Valkey's and Redis's jemalloc-bg-thread), so that resident memory
// returns to its baseline after a burst of connections, as with glibc's trimming.
extern "C" const char* malloc_conf;
const char* malloc_conf = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0";
#endif

int main(int argc, char** argv) {
  CLI::App cli{"Sluice: an HTTP reverse-proxy gateway with rate limits and quotas in Valkey"};
  cli.name("sluice");
  std::string config_path = "conf/sluice.toml";
  bool check_config = false;
  bool version = false;
  cli.add_option("-c,--config", config_path, "configuration file (TOML)")->capture_default_str();
  cli.add_flag("--check-config", check_config,
               "validate the configuration and exit: 0 and \"configuration OK\", or 1 and "
               "FILE:LINE:COL: what is wrong");
  cli.add_flag("-v,--version", version, "print the version and exit");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  if (version) {
    std::printf("sluice %s\n", SLUICE_VERSION);
    return 0;
  }
  if (check_config) {
    const sluice::config::LoadResult result = sluice::config::loadConfigFile(config_path);
    if (!result.ok()) {
      for (const auto& error : result.errors)
        std::fprintf(stderr, "%s\n", error.toString().c_str());
      return 1;
    }
    std::printf("configuration OK\n");
    return 0;
  }
  sluice::app::Server server(config_path);
  return server.run();
}
