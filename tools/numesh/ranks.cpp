#include "ranks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/diagnostics/mpi_collective.hpp"
#include "numesh/runtime/rank_settings.hpp"

namespace numesh::tools {

const std::shared_ptr<runtime::Transport>& command_world() {
  static const std::shared_ptr<runtime::Transport> world =
      runtime::launched_ranks() > 1 ? diagnostics::mpi_world_for_baselines()
                                    : std::make_shared<runtime::SingleProcessTransport>();
  return world;
}

void check_options_on_every_rank(const CLI::App& app) {
  std::vector<runtime::RankSetting> settings;
  for (const CLI::Option* option : app.get_options()) {
    const std::string name = option->get_name();
    if (name == "--help" || name == "-h") continue;
    settings.emplace_back(name, option->count() == 0
                                    ? std::string("(not given)")
                                    : fmt::format("{}", fmt::join(option->results(), " ")));
  }
  runtime::check_same_on_every_rank(*command_world(), settings);
}

void on_every_rank(runtime::Transport& world, const std::function<void()>& setup) {
  std::string message;
  try {
    setup();
  } catch (const Error& e) {
    message = e.what();
  }
  const auto length = static_cast<std::uint64_t>(message.size());
  std::vector<std::uint64_t> lengths(static_cast<std::size_t>(world.size()));
  world.all_gather(std::as_bytes(std::span(&length, 1)),
                   std::as_writable_bytes(std::span(lengths)));
  const std::uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  if (longest == 0) return;
  message.resize(longest);
  std::string all(longest * lengths.size(), '\0');
  world.all_gather(std::as_bytes(std::span(message)), std::as_writable_bytes(std::span(all)));
  std::vector<std::string> failures;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    if (lengths[r] == 0) continue;
    failures.push_back(fmt::format("rank {}: {}", r, all.substr(r * longest, lengths[r])));
  }
  throw ValueError(fmt::format("{}", fmt::join(failures, "; ")));
}

void check_on_every_rank(runtime::Transport& world, bool ok, const std::string& what) {
  const auto mine = static_cast<std::byte>(ok ? 1 : 0);
  std::vector<std::byte> all(static_cast<std::size_t>(world.size()));
  world.all_gather({&mine, 1}, all);
  std::vector<int> wrong;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r] == std::byte{0}) wrong.push_back(static_cast<int>(r));
  }
  NUMESH_CHECK(wrong.empty(), Error, "{} gave a wrong result on rank(s) {}", what,
               fmt::join(wrong, ", "));
}

std::ostream& rank0_stream(std::ostream& out) {
  // A stream without a buffer: every write fails silently, at no cost.
  static std::ostream discarded(nullptr);
  return command_world()->rank() == 0 ? out : discarded;
}

}  // namespace numesh::tools
