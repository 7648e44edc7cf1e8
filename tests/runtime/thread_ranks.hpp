#pragma once

// Runs code on every rank of a run whose ranks are threads (make_thread_transports): the
// in-process stand-in for mpirun in runtime_test, with the real transport's contract.

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "numesh/runtime/transport.hpp"

namespace numesh::runtime::testing {

/// Runs `body` on every endpoint of `ranks` thread transports at once, each on its own thread,
/// and returns when all have returned.
inline void on_thread_ranks(int ranks,
                            const std::function<void(const std::shared_ptr<Transport>&)>& body) {
  auto endpoints = make_thread_transports(ranks);
  ASSERT_EQ(endpoints.size(), static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (auto& endpoint : endpoints) {
    threads.emplace_back([&body, endpoint] { body(endpoint); });
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace numesh::runtime::testing
