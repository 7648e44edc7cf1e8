#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

// A progress line on stderr, for the front ends (the numesh program, the Python module): on a
// terminal one line rewritten in place, else one line per shown step.

namespace numesh {

/// The progress line on stderr: on a terminal one line rewritten in place, else one line per
/// show() (as `numesh bench collectives` prints its steps); nothing at all when `quiet`.
/// Not thread-safe: one thread drives it (a load's progress callback is called by one thread at
/// a time).
class ProgressLine {
 public:
  explicit ProgressLine(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  /// Clears the line on a terminal.
  ~ProgressLine() {
    if (!quiet_ && tty_) std::fprintf(stderr, "\r\033[K");
  }
  /// Shows `text` (replacing the previous text on a terminal).
  void show(const std::string& text) const {
    if (quiet_) return;
    std::fprintf(stderr, "%s%s%s", tty_ ? "\r\033[K" : "", text.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  /// Shows `text` on a terminal only: for frequent updates (each decode step, each matrix of a
  /// load) that would flood a log.
  void update(const std::string& text) const {
    if (tty_) show(text);
  }

 private:
  bool quiet_;
  bool tty_;
};

/// A load's progress: "loading 42% (123 of 290 MB)" for `done` of `total` bytes.
inline std::string load_progress_text(std::int64_t done, std::int64_t total) {
  const double whole = total > 0 ? static_cast<double>(total) : 1.0;
  return fmt::format("loading {:.0f}% ({:.0f} of {:.0f} MB)",
                     100.0 * static_cast<double>(done) / whole, static_cast<double>(done) / 1e6,
                     static_cast<double>(total) / 1e6);
}

}  // namespace numesh
