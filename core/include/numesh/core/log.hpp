#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

/// A tiny levelled logger on fmt. It writes one line per message to stderr:
/// `numesh: warning: ...`. The level comes from the environment variable NUMESH_LOG_LEVEL
/// (`error`, `warning` (the default), `info`, `debug`, or `off`), read once.
///
/// Library code logs sparingly: warnings for things the user should know and cannot see
/// otherwise (a binding the machine cannot do, NUMA balancing on), each at most once per
/// process through warn_once().
namespace numesh::log {

/// Severity, most severe first.
enum class Level { kOff = 0, kError = 1, kWarning = 2, kInfo = 3, kDebug = 4 };

/// The active level (NUMESH_LOG_LEVEL, read on first use). Thread-safe.
inline Level level() noexcept {
  static const Level active = [] {
    const char* env = std::getenv("NUMESH_LOG_LEVEL");
    const std::string_view v = env != nullptr ? env : "warning";
    if (v == "off") return Level::kOff;
    if (v == "error") return Level::kError;
    if (v == "info") return Level::kInfo;
    if (v == "debug") return Level::kDebug;
    return Level::kWarning;
  }();
  return active;
}

/// True when messages of `l` are printed. Thread-safe.
inline bool enabled(Level l) noexcept { return l != Level::kOff && l <= level(); }

namespace detail {
inline std::mutex& output_mutex() {
  static std::mutex m;
  return m;
}
inline void write(std::string_view tag, const std::string& message) {
  const std::lock_guard lock(output_mutex());
  fmt::print(stderr, "numesh: {}: {}\n", tag, message);
}
}  // namespace detail

/// Logs a warning. Thread-safe.
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kWarning)) detail::write("warning", fmt::format(f, std::forward<Args>(args)...));
}

/// Logs an informational message. Thread-safe.
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kInfo)) detail::write("info", fmt::format(f, std::forward<Args>(args)...));
}

/// Logs a debug message. Thread-safe.
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kDebug)) detail::write("debug", fmt::format(f, std::forward<Args>(args)...));
}

/// Logs `message` as a warning the first time `key` is seen in this process; later calls with
/// the same key are silent. Returns true when it logged (or would have, at a quieter level).
/// Thread-safe.
inline bool warn_once(const std::string& key, const std::string& message) {
  static std::mutex m;
  static std::set<std::string> seen;
  {
    const std::lock_guard lock(m);
    if (!seen.insert(key).second) return false;
  }
  if (enabled(Level::kWarning)) detail::write("warning", message);
  return true;
}

}  // namespace numesh::log
