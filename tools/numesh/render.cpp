#include "render.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <ostream>
#include <string>
#include <vector>

namespace numesh::tools {

namespace {

using sharding::ShardLayout;

std::string range(std::int64_t block, std::int64_t extent) {
  return fmt::format("[{}:{})", block * extent, (block + 1) * extent);
}

// The devices holding block (b0[, b1]) as "0,4".
std::string holders(const ShardLayout& l, const std::vector<std::int64_t>& block) {
  for (const auto& group : l.replica_groups()) {
    if (l.device(group.front()).block == block) return fmt::format("{}", fmt::join(group, ","));
  }
  return "?";
}

void print_table(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::string rule = "+";
  for (std::size_t w : width) rule += std::string(w + 2, '-') + "+";
  out << rule << "\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out << "|";
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      out << " " << rows[i][c] << std::string(width[c] - rows[i][c].size(), ' ') << " |";
    }
    out << "\n";
    if (i == 0) out << rule << "\n";
  }
  out << rule << "\n";
}

}  // namespace

void render_layout_text(const ShardLayout& l, std::int64_t itemsize, std::ostream& out) {
  const std::int64_t bytes = l.bytes_per_device(itemsize);
  out << fmt::format("layout:    each device holds [{}] of [{}]: {} ({} bytes at itemsize {})\n",
                     fmt::join(l.shard_shape(), ", "), fmt::join(l.shape(), ", "),
                     human_bytes(static_cast<std::uint64_t>(bytes)), bytes, itemsize);
  out << fmt::format(
      "           blocks per dim [{}]; {} distinct shards; each held by {} "
      "device(s)\n\n",
      fmt::join(l.blocks_per_dim(), ", "), l.num_shards(), l.replication());

  const auto& bpd = l.blocks_per_dim();
  const auto& ext = l.shard_shape();
  if (l.rank() == 1) {
    out << "blocks of dim 0 (cells: devices holding the block):\n";
    std::vector<std::vector<std::string>> rows(2);
    for (std::int64_t b = 0; b < bpd[0]; ++b) {
      rows[0].push_back(range(b, ext[0]));
      rows[1].push_back(holders(l, {b}));
    }
    print_table(rows, out);
    out << "\n";
  } else if (l.rank() == 2) {
    out << "blocks (rows: dim 0, columns: dim 1; cells: devices holding the block):\n";
    std::vector<std::vector<std::string>> rows;
    rows.emplace_back(std::vector<std::string>{""});
    for (std::int64_t c = 0; c < bpd[1]; ++c) rows[0].push_back(range(c, ext[1]));
    for (std::int64_t r = 0; r < bpd[0]; ++r) {
      std::vector<std::string> row{range(r, ext[0])};
      for (std::int64_t c = 0; c < bpd[1]; ++c) row.push_back(holders(l, {r, c}));
      rows.push_back(std::move(row));
    }
    print_table(rows, out);
    out << "\n";
  }

  out << fmt::format("devices (mesh coordinates over ({}) -> slice, replica group):\n",
                     fmt::join(l.mesh().names(), ", "));
  std::vector<std::array<std::string, 3>> lines;
  std::array<std::size_t, 3> width{};
  for (const auto& d : l.devices()) {
    std::vector<std::string> slices;
    for (const auto& s : d.slices) slices.push_back(fmt::format("{}:{}", s.offset, s.limit()));
    lines.push_back({fmt::format("{}", d.device), fmt::format("({})", fmt::join(d.coords, ", ")),
                     fmt::format("[{}]", fmt::join(slices, ", "))});
    for (std::size_t i = 0; i < 3; ++i) width[i] = std::max(width[i], lines.back()[i].size());
  }
  for (std::size_t i = 0; i < lines.size(); ++i) {
    out << fmt::format("  {:>{}}  {:<{}}  {:<{}}  group {}\n", lines[i][0], width[0], lines[i][1],
                       width[1], lines[i][2], width[2], l.devices()[i].replica_group);
  }
}

nlohmann::json layout_json(const ShardLayout& l, std::int64_t itemsize) {
  using nlohmann::json;
  json devices = json::array();
  for (const auto& d : l.devices()) {
    json slices = json::array();
    for (const auto& s : d.slices) slices.push_back(json::array({s.offset, s.limit()}));
    devices.push_back(json{{"device", d.device},
                           {"coords", d.coords},
                           {"block", d.block},
                           {"slices", slices},
                           {"replica_group", d.replica_group}});
  }
  return json{{"blocks_per_dim", l.blocks_per_dim()},
              {"shard_shape", l.shard_shape()},
              {"num_shards", l.num_shards()},
              {"replication", l.replication()},
              {"bytes_per_device", l.bytes_per_device(itemsize)},
              {"replica_groups", l.replica_groups()},
              {"devices", devices}};
}

std::string axes_text(const sharding::Mesh& mesh) {
  std::string out;
  for (std::size_t a = 0; a < mesh.rank(); ++a) {
    out += fmt::format("{}{}={}", a == 0 ? "" : ", ", mesh.names()[a], mesh.sizes()[a]);
  }
  return out;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) {
    return fmt::format("{} MiB", bytes >> 20);
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace numesh::tools
