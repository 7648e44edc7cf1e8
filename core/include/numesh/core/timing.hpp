#pragma once

// The timing loop of numesh's own measurements (`numesh bench collectives`, `numesh op`): a
// median of wall-clock samples, so that one descheduled run on a shared machine does not move
// the figure the way it moves a mean.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

namespace numesh {

/// Seconds of std::chrono::steady_clock elapsed since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The median of `samples`: with an even number of them, the upper of the two middle ones (a
/// figure that was measured, not an average of two). REQUIRES: samples is not empty.
/// Thread-safety: pure.
inline double median(std::vector<double> samples) {
  const auto mid = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
  std::nth_element(samples.begin(), mid, samples.end());
  return *mid;
}

/// Median wall time in seconds of `fn()` over at least `min_repeats` calls and at least
/// `min_seconds` of timed calls in total (whichever takes longer; never more than 100000
/// calls), after one untimed warm-up call. Each call is timed on its own with
/// std::chrono::steady_clock; with an even number of samples the upper median is returned.
/// REQUIRES: fn is callable with no arguments; its result, if any, is discarded.
/// Throws: ValueError when min_repeats < 1 or min_seconds < 0 (naming the value); whatever
/// `fn` throws.
/// Thread-safety: calls `fn` on the calling thread only; as thread-safe as `fn`.
template <typename Fn>
requires std::invocable<Fn&>
double median_seconds(Fn&& fn, int min_repeats, double min_seconds) {
  NUMESH_CHECK(min_repeats >= 1, ValueError, "median_seconds: min_repeats {} must be at least 1",
               min_repeats);
  NUMESH_CHECK(min_seconds >= 0, ValueError, "median_seconds: min_seconds {} must not be negative",
               min_seconds);
  using Clock = std::chrono::steady_clock;
  constexpr std::size_t kMaxSamples = 100000;  // bounds memory and time of tiny, fast cases
  fn();  // warm-up: first-touch of buffers, waking worker threads
  std::vector<double> samples;
  const auto start = Clock::now();
  while (static_cast<int>(samples.size()) < min_repeats ||
         std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const auto t0 = Clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (samples.size() >= kMaxSamples) break;
  }
  return median(std::move(samples));
}

}  // namespace numesh
