#include "stats/access_log.h"

#include <spdlog/async.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>

namespace sluice::stats {

namespace {

// Each queued line is an spdlog message (~400 bytes, preallocated): 8192 of them are ~3 MiB,
// a second or more of peak traffic for the writer thread to catch up with.
constexpr size_t kQueueLines = 8192;

std::atomic<spdlog::details::thread_pool*> g_pool{nullptr};

// Created with the first access log only: no queue and no thread while the log is off.
std::shared_ptr<spdlog::details::thread_pool> writerPool() {
  static std::once_flag once;
  static std::shared_ptr<spdlog::details::thread_pool> pool;
  std::call_once(once, [] {
    pool = std::make_shared<spdlog::details::thread_pool>(kQueueLines, 1);
    g_pool.store(pool.get(), std::memory_order_release);
  });
  return pool;
}

}  // namespace

std::shared_ptr<AccessLog> AccessLog::open(const std::string& target, std::string* error) {
  std::shared_ptr<spdlog::sinks::sink> sink;
  try {
    if (target == "stdout") {
      sink = std::make_shared<spdlog::sinks::stdout_sink_mt>();
    } else {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(target, false);
    }
  } catch (const std::exception& e) {
    *error = "cannot open access log " + target + ": " + e.what();
    return nullptr;
  }
  auto logger = std::make_shared<spdlog::async_logger>(
      "access", std::move(sink), writerPool(), spdlog::async_overflow_policy::overrun_oldest);
  logger->set_pattern("%v");
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::info);  // flushed by the writer thread, line by line
  return std::shared_ptr<AccessLog>(new AccessLog(target, std::move(logger)));
}

AccessLog::AccessLog(std::string target, std::shared_ptr<spdlog::logger> logger)
    : target_(std::move(target)), logger_(std::move(logger)) {}

AccessLog::~AccessLog() = default;

void AccessLog::write(std::string_view line) { logger_->info(line); }

uint64_t AccessLog::dropped() {
  spdlog::details::thread_pool* pool = g_pool.load(std::memory_order_acquire);
  return pool ? pool->overrun_counter() : 0;
}

}  // namespace sluice::stats
