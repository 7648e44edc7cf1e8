#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>

/// A tiny levelled logger on fmt. By default it writes one line per message to stderr:
/// `numesh: warning: ...`; a program embedding numesh can take the messages instead with
/// set_sink(). The level comes from the environment variable NUMESH_LOG_LEVEL (`error`,
/// `warning` (the default), `info`, `debug`, or `off`), read once.
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

/// Receives each message that passes the level: its tag ("error", "warning", "info", "debug")
/// and its text, without the "numesh: tag: " prefix or a newline.
using Sink = std::function<void(std::string_view tag, std::string_view message)>;

namespace detail {
inline std::mutex& output_mutex() {
  static std::mutex m;
  return m;
}
inline Sink& sink() {
  static Sink s;
  return s;
}
inline void write(std::string_view tag, const std::string& message) {
  const std::lock_guard lock(output_mutex());
  if (const Sink& s = sink()) {
    s(tag, message);
  } else {
    fmt::print(stderr, "numesh: {}: {}\n", tag, message);
  }
}
}  // namespace detail

/// Sends every later message to `sink` instead of stderr (an empty Sink: back to stderr), so
/// that a program embedding numesh decides where its warnings go. Calls to the sink are
/// serialised. Thread-safe.
inline void set_sink(Sink sink) {
  const std::lock_guard lock(detail::output_mutex());
  detail::sink() = std::move(sink);
}

/// Logs a warning. Thread-safe.
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(Level::kWarning))
    detail::write("warning", fmt::format(f, std::forward<Args>(args)...));
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
