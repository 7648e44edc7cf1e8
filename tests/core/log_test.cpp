#include "numesh/core/log.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace numesh::log {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// A program embedding numesh takes its messages instead of stderr, and gives them back.
TEST(LogTest, ASinkReceivesTheMessagesInsteadOfStderr) {
  ASSERT_TRUE(enabled(Level::kWarning)) << "run without NUMESH_LOG_LEVEL=off or error";
  std::vector<std::pair<std::string, std::string>> got;
  set_sink([&](std::string_view tag, std::string_view message) { got.emplace_back(tag, message); });
  warn("device {} runs unpinned", 3);
  EXPECT_TRUE(warn_once("log_test.once", "said once"));
  EXPECT_FALSE(warn_once("log_test.once", "said once"));
  set_sink({});
  warn("back on stderr");
  EXPECT_THAT(got,
              ElementsAre(Pair("warning", "device 3 runs unpinned"), Pair("warning", "said once")));
}

}  // namespace
}  // namespace numesh::log
