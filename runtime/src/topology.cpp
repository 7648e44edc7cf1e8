#include "numesh/runtime/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>

#include "hwloc_handle.hpp"
#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/log.hpp"

namespace numesh::runtime {

namespace detail {

std::optional<int> pages_node(const Topology& topology, const void* p, std::size_t bytes) {
  if (p == nullptr || !topology.can_bind()) return std::nullopt;
  UniqueBitmap nodes = make_bitmap();
  if (hwloc_get_area_memlocation(topology.hwloc()->get(), p, bytes, nodes.get(),
                                 HWLOC_MEMBIND_BYNODESET) != 0 ||
      hwloc_bitmap_iszero(nodes.get())) {
    return std::nullopt;
  }
  if (hwloc_bitmap_weight(nodes.get()) != 1) return -1;
  const int os_index = hwloc_bitmap_first(nodes.get());
  for (const NumaNode& node : topology.numa_nodes()) {
    if (node.os_index == os_index) return node.index;
  }
  return -1;
}

UniqueBitmap make_bitmap() {
  UniqueBitmap bitmap(hwloc_bitmap_alloc());
  NUMESH_CHECK(bitmap != nullptr, TopologyError, "hwloc could not allocate a bitmap");
  return bitmap;
}

UniqueBitmap to_bitmap(const CpuSet& cpus) {
  UniqueBitmap bitmap = make_bitmap();
  for (const int pu : cpus.pus()) {
    NUMESH_CHECK(hwloc_bitmap_set(bitmap.get(), static_cast<unsigned>(pu)) == 0, TopologyError,
                 "hwloc could not add PU {} to a bitmap", pu);
  }
  return bitmap;
}

CpuSet to_cpuset(hwloc_const_bitmap_t bitmap) {
  if (bitmap == nullptr) return CpuSet();
  // An infinite bitmap would never end the loop below; object cpusets are always finite.
  NUMESH_DCHECK(hwloc_bitmap_weight(bitmap) >= 0);
  std::vector<int> pus;
  for (int pu = hwloc_bitmap_first(bitmap); pu != -1; pu = hwloc_bitmap_next(bitmap, pu)) {
    pus.push_back(pu);
  }
  return CpuSet(std::move(pus));
}

hwloc_obj_t HwlocTopology::numa_obj(int index) const noexcept {
  if (index < 0) return nullptr;
  return hwloc_get_obj_by_type(get(), HWLOC_OBJ_NUMANODE, static_cast<unsigned>(index));
}

}  // namespace detail

namespace {

using detail::HwlocTopology;
using detail::UniqueBitmap;
using detail::UniqueTopology;

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

UniqueTopology init_topology() {
  hwloc_topology_t raw = nullptr;
  NUMESH_CHECK(hwloc_topology_init(&raw) == 0, TopologyError,
               "hwloc could not initialise a topology: {}", errno_text(errno));
  return UniqueTopology(raw);
}

// hwloc's "unknown" os_index (HWLOC_UNKNOWN_INDEX) becomes -1.
int os_index(hwloc_obj_t obj) {
  return obj->os_index == HWLOC_UNKNOWN_INDEX ? -1 : static_cast<int>(obj->os_index);
}

int count(hwloc_topology_t t, hwloc_obj_type_t type) {
  // -1 means "at several depths", which hwloc 2 allows for Groups only, never for the types
  // read here.
  const int n = hwloc_get_nbobjs_by_type(t, type);
  return n < 0 ? 0 : n;
}

hwloc_obj_t object(hwloc_topology_t t, hwloc_obj_type_t type, int i) {
  return hwloc_get_obj_by_type(t, type, static_cast<unsigned>(i));
}

// Logical index of the nearest ancestor of `type`, or -1.
int ancestor_index(hwloc_topology_t t, hwloc_obj_type_t type, hwloc_obj_t obj) {
  const hwloc_obj_t a = hwloc_get_ancestor_obj_by_type(t, type, obj);
  return a == nullptr ? -1 : static_cast<int>(a->logical_index);
}

// The node sharing the most PUs with `cpus` (the first on a tie), or -1 when none shares any.
int most_shared_node(const std::vector<NumaNode>& nodes, const CpuSet& cpus) {
  int best = -1;
  std::size_t best_shared = 0;
  for (const NumaNode& n : nodes) {
    const std::size_t shared = n.cpuset.intersect(cpus).size();
    if (shared > best_shared) {
      best = n.index;
      best_shared = shared;
    }
  }
  return best;
}

// hwloc attaches a NUMA node as a memory child of the object it is local to. On most machines
// that is the package or something below it; on some exports (16amd64-8n2c-cpusets.xml) it is
// a Group above the package, so the ancestor walk finds none. The package whose PUs include
// the node's is then the one holding it.
int node_package(hwloc_topology_t t, hwloc_obj_t obj, const CpuSet& cpus,
                 const std::vector<Package>& packages) {
  const int ancestor = ancestor_index(t, HWLOC_OBJ_PACKAGE, obj);
  if (ancestor >= 0 || cpus.empty()) return ancestor;
  for (const Package& p : packages) {
    if (p.cpuset.contains(cpus)) return p.index;
  }
  return -1;
}

std::string_view distance_origin(TopologySource source) {
  switch (source) {
    case TopologySource::kMachine:
      return "os";
    case TopologySource::kXml:
      return "xml";
    case TopologySource::kSynthetic:
      return "synthetic";
  }
  return "os";
}

// Releases hwloc's distance structures when the reader is done with them.
class DistancesList {
 public:
  explicit DistancesList(hwloc_topology_t t) : topology_(t) {}
  DistancesList(const DistancesList&) = delete;
  DistancesList& operator=(const DistancesList&) = delete;
  ~DistancesList() {
    for (hwloc_distances_s* d : list_) hwloc_distances_release(topology_, d);
  }
  std::vector<hwloc_distances_s*>& list() noexcept { return list_; }

 private:
  hwloc_topology_t topology_;
  std::vector<hwloc_distances_s*> list_;
};

// The first NUMA latency matrix that covers every node, reordered by NumaNode::index (hwloc
// stores the objects in the order the source listed them, which is not the logical order in
// 16amd64-8n2c-cpusets.xml); otherwise the 10/20 guess.
DistanceMatrix read_distances(hwloc_topology_t t, int nodes, TopologySource source,
                              std::vector<std::string>& notes) {
  const auto n = static_cast<std::size_t>(nodes);
  DistancesList found(t);
  unsigned nr = 0;
  constexpr unsigned long kKind = HWLOC_DISTANCES_KIND_MEANS_LATENCY;
  if (hwloc_distances_get_by_type(t, HWLOC_OBJ_NUMANODE, &nr, nullptr, kKind, 0) == 0 && nr > 0) {
    found.list().resize(nr, nullptr);
    if (hwloc_distances_get_by_type(t, HWLOC_OBJ_NUMANODE, &nr, found.list().data(), kKind, 0) !=
        0) {
      nr = 0;
    }
    found.list().resize(nr);  // hwloc may return fewer than it counted
  }
  for (const hwloc_distances_s* d : found.list()) {
    if (d->nbobjs != n) continue;
    std::vector<std::size_t> row(n);
    std::vector<bool> seen(n, false);
    bool covers = true;
    for (std::size_t i = 0; i < n && covers; ++i) {
      const hwloc_obj_t obj = d->objs[i];
      covers = obj != nullptr && obj->type == HWLOC_OBJ_NUMANODE && obj->logical_index < n &&
               !seen[obj->logical_index];
      if (covers) {
        row[i] = obj->logical_index;
        seen[obj->logical_index] = true;
      }
    }
    if (!covers) continue;
    DistanceMatrix m{.size = nodes,
                     .values = std::vector<std::uint64_t>(n * n),
                     .origin = std::string(distance_origin(source))};
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) m.values[row[i] * n + row[j]] = d->values[i * n + j];
    }
    return m;
  }
  DistanceMatrix m{
      .size = nodes, .values = std::vector<std::uint64_t>(n * n, 20), .origin = "default"};
  for (std::size_t i = 0; i < n; ++i) m.values[i * n + i] = 10;
  // With one node there is nothing to guess.
  if (nodes > 1) {
    notes.emplace_back(
        "no NUMA distance matrix was found: the distances are a guess (10 local, 20 remote)");
  }
  return m;
}

// Restricts the machine topology to the PUs this process may run on (taskset, numactl,
// sched_setaffinity). hwloc already leaves out what cgroups forbid; the affinity mask is only
// visible through the binding. Restricting the hwloc topology itself, rather than filtering
// what is reported, keeps the objects the binding code sees consistent with the Topology.
void restrict_to_binding(hwloc_topology_t t, std::vector<std::string>& notes) {
  UniqueBitmap binding = detail::make_bitmap();
  if (hwloc_get_cpubind(t, binding.get(), HWLOC_CPUBIND_PROCESS) != 0) {
    notes.push_back(fmt::format("could not read the process binding ({}): every allowed PU is used",
                                errno_text(errno)));
    return;
  }
  const hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(t);
  NUMESH_CHECK(hwloc_bitmap_and(binding.get(), binding.get(), allowed) == 0, TopologyError,
               "hwloc could not intersect the process binding with the allowed PUs");
  if (hwloc_bitmap_iszero(binding.get()) || hwloc_bitmap_isequal(binding.get(), allowed)) return;
  const CpuSet bound = detail::to_cpuset(binding.get());
  NUMESH_CHECK(hwloc_topology_restrict(t, binding.get(), 0) == 0, TopologyError,
               "hwloc could not restrict the topology to the process binding {}: {}", bound,
               errno_text(errno));
  notes.push_back(fmt::format("restricted to the process binding {}", bound));
}

// Automatic NUMA balancing migrates pages towards the threads touching them, undoing the
// runtime's explicit placement (and making benchmarks noisy), so users should hear about it.
void warn_if_numa_balancing() {
  std::ifstream in("/proc/sys/kernel/numa_balancing");
  std::string value;
  if (!(in >> value) || value == "0") return;
  log::warn_once("numa_balancing",
                 fmt::format("the kernel's automatic NUMA balancing is on "
                             "(/proc/sys/kernel/numa_balancing = {}); it migrates pages behind "
                             "numesh's placement (turn it off with `sysctl "
                             "kernel.numa_balancing=0`)",
                             value));
}

}  // namespace

namespace detail {

Topology HwlocTopology::make_topology(std::shared_ptr<const HwlocTopology> hwloc,
                                      TopologySource source, std::string origin, bool can_bind,
                                      std::vector<std::string> notes) {
  const hwloc_topology_t t = hwloc->get();
  Topology topo;
  topo.source_ = source;
  topo.origin_ = std::move(origin);
  topo.can_bind_ = can_bind;

  for (int i = 0; i < count(t, HWLOC_OBJ_PACKAGE); ++i) {
    const hwloc_obj_t obj = object(t, HWLOC_OBJ_PACKAGE, i);
    topo.packages_.push_back(
        {.index = i, .os_index = os_index(obj), .cpuset = to_cpuset(obj->cpuset)});
  }

  // In hwloc 2 a NUMA node is a memory child; its cpuset is the PUs local to it, and it is
  // empty for memory-only nodes, which stay listed.
  for (int i = 0; i < count(t, HWLOC_OBJ_NUMANODE); ++i) {
    const hwloc_obj_t obj = object(t, HWLOC_OBJ_NUMANODE, i);
    CpuSet cpus = to_cpuset(obj->cpuset);
    const int package = node_package(t, obj, cpus, topo.packages_);
    topo.numa_nodes_.push_back({.index = i,
                                .os_index = os_index(obj),
                                .cpuset = std::move(cpus),
                                .memory_bytes = obj->attr->numanode.local_memory,
                                .package = package});
  }

  for (int i = 0; i < count(t, HWLOC_OBJ_L3CACHE); ++i) {
    const hwloc_obj_t obj = object(t, HWLOC_OBJ_L3CACHE, i);
    CpuSet cpus = to_cpuset(obj->cpuset);
    const int node = most_shared_node(topo.numa_nodes_, cpus);
    topo.l3_groups_.push_back({.index = i,
                               .size_bytes = obj->attr->cache.size,
                               .cpuset = std::move(cpus),
                               .numa_node = node});
  }

  // Some topologies (synthetic ones without a core level, some XML exports) have no Core
  // objects; each PU then counts as a core.
  const hwloc_obj_type_t core_type = count(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  for (int i = 0; i < count(t, core_type); ++i) {
    const hwloc_obj_t obj = object(t, core_type, i);
    CpuSet pus = to_cpuset(obj->cpuset);
    if (pus.empty()) continue;
    const int node = most_shared_node(topo.numa_nodes_, pus);
    topo.cpuset_ = topo.cpuset_.unite(pus);
    topo.cores_.push_back({.index = static_cast<int>(topo.cores_.size()),
                           .pus = std::move(pus),
                           .numa_node = node,
                           .package = ancestor_index(t, HWLOC_OBJ_PACKAGE, obj),
                           .l3_group = ancestor_index(t, HWLOC_OBJ_L3CACHE, obj)});
  }

  topo.distances_ = read_distances(t, static_cast<int>(topo.numa_nodes_.size()), source, notes);
  topo.notes_ = std::move(notes);
  topo.hwloc_ = std::move(hwloc);
  return topo;
}

}  // namespace detail

std::string_view to_string(TopologySource source) noexcept {
  switch (source) {
    case TopologySource::kMachine:
      return "machine";
    case TopologySource::kSynthetic:
      return "synthetic";
    case TopologySource::kXml:
      return "xml";
  }
  return "unknown";
}

Topology Topology::discover() {
  UniqueTopology topo = init_topology();
  NUMESH_CHECK(hwloc_topology_load(topo.get()) == 0, TopologyError,
               "hwloc could not load the machine's topology: {}", errno_text(errno));
  std::vector<std::string> notes;
  // HWLOC_XMLFILE or HWLOC_SYNTHETIC in the environment make hwloc load something other than
  // this machine; its PUs are then not ours to bind to or to restrict by our binding.
  const bool thissystem = hwloc_topology_is_thissystem(topo.get()) != 0;
  if (thissystem) {
    restrict_to_binding(topo.get(), notes);
  } else {
    notes.emplace_back(
        "hwloc loaded another system (HWLOC_XMLFILE or HWLOC_SYNTHETIC is set): binding is not "
        "possible, devices run unpinned");
  }
  warn_if_numa_balancing();
  return HwlocTopology::make_topology(std::make_shared<const HwlocTopology>(std::move(topo)),
                                      TopologySource::kMachine, "", /*can_bind=*/thissystem,
                                      std::move(notes));
}

namespace {

// The most PUs numesh lets a synthetic description make: hwloc builds every object it
// describes, so "pack:100 core:100 pu:100" would take minutes and gigabytes before anything
// could be refused (found by topology_fuzz: 44784 PUs took 32 s under ASan). Real machines have
// far fewer PUs than this.
constexpr std::uint64_t kMaxSyntheticPus = 4096;

// What a synthetic description holds, read as hwloc 2.9's parser reads it
// (hwloc_backend_synthetic_init), so that nothing hwloc accepts is counted short or passes
// unseen:
// - root attributes in parentheses at the very start, "[numa...]" attached objects: no count;
// - a level that starts with a digit is a bare count ("2 4 8"; topology_fuzz found "11111",
//   11111 PUs, taking 25 s);
// - any other level is a type, and its count follows the next ':' in the rest of the text,
//   wherever that is (topology_fuzz found "l3<bytes>=<bytes>:516", which hwloc reads as 516
//   L3 caches, taking 15 s while this skipped every token holding a '=');
// - a type is named by its leading letters and dashes, any prefix of the type's name of some
//   minimum length, in any case (hwloc__type_match: "MemCach" is a memory-side cache, which
//   topology_fuzz found making hwloc 2.9 assert while loading "MemCach<bytes>3:1 core:4 pu:2");
// - a count is read as strtoul(..., 0) reads it: leading blanks, a sign, 0x hexadecimal and
//   0 octal included ("pu:0x2000" is 8192 PUs);
// - attributes in parentheses after a count ("numa:2(memory=1GB)") hold no count;
// - the next level starts right after the count or the attributes, with or without a blank.
// Where hwloc would refuse the text, the walk stops: hwloc then names the fault.
struct SyntheticLevels {
  /// The number of leaves (PUs) hwloc would build, or kMaxSyntheticPus + 1 once past it.
  std::uint64_t leaves = 1;
  /// The first level naming a memory-side cache, or empty.
  std::string_view memory_side_cache;
  /// The last level's type name and count ("core:1", attributes left out) and its type name
  /// alone ("core"; empty for a bare count), once the walk has read the whole description.
  std::string_view last_level, last_type;
};

// True when the type name at the start of `text` is a memory-side cache for hwloc: its leading
// letters and dashes, in lower case, are a prefix of "memcache" at least 5 long or of
// "memory-side cache" at least 8 long.
bool names_memory_side_cache(std::string_view text) {
  std::string name;
  for (const char c : text) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
    if (!letter) break;
    name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const auto prefix_of = [&](std::string_view type, std::size_t at_least) {
    return name.size() >= at_least && type.starts_with(name);
  };
  return prefix_of("memcache", 5) || prefix_of("memory-side cache", 8);
}

// Why hwloc may have refused a description walked into `levels`, for its error message: hwloc
// tells only on stderr, and only when verbose. The slip seen most, a last level that is not
// PUs ("numa:2 core:4"), is named; otherwise empty.
std::string last_level_hint(const SyntheticLevels& levels) {
  // The type's leading letters, as hwloc matches a type name ("PU", "pu :2").
  std::string type;
  for (const char c : levels.last_type) {
    if (std::isalpha(static_cast<unsigned char>(c)) == 0) break;
    type += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (type.empty() || type == "pu") return {};
  return fmt::format(
      ": its last level is '{}', and hwloc's must be PUs (e.g. 'package:2 numa:2 core:8 pu:2')",
      levels.last_level);
}

SyntheticLevels scan_synthetic(std::string_view desc) {
  constexpr std::uint64_t kTooMany = kMaxSyntheticPus + 1;
  SyntheticLevels out;
  std::size_t i = 0;
  const auto skip_past = [&](char c) {
    const std::size_t at = desc.find(c, i);
    i = at == std::string_view::npos ? desc.size() : at + 1;
    return at != std::string_view::npos;
  };
  if (desc.starts_with('(') && !skip_past(')')) return out;
  std::string_view last_level, last_type;
  while (i < desc.size()) {
    while (i < desc.size() && (desc[i] == ' ' || desc[i] == '\n')) ++i;
    if (i == desc.size()) break;
    if (desc[i] == '[') {
      if (!skip_past(']')) return out;
      continue;
    }
    const std::size_t level = i;
    last_type = {};
    if (desc[i] < '0' || desc[i] > '9') {
      if (out.memory_side_cache.empty() && names_memory_side_cache(desc.substr(i))) {
        const std::size_t end = desc.find_first_of(" \n", i);
        out.memory_side_cache = desc.substr(i, end == std::string_view::npos ? end : end - i);
      }
      if (!skip_past(':')) return out;
      last_type = desc.substr(level, i - 1 - level);
    }
    // strtoul: blanks, a sign (a '-' negates the count: a huge one), then the base's digits.
    while (i < desc.size() && std::isspace(static_cast<unsigned char>(desc[i])) != 0) ++i;
    bool negative = false;
    if (i < desc.size() && (desc[i] == '+' || desc[i] == '-')) negative = desc[i++] == '-';
    std::uint64_t base = 10;
    if (i < desc.size() && desc[i] == '0') {
      base = 8;
      if (i + 2 < desc.size() && (desc[i + 1] == 'x' || desc[i + 1] == 'X') &&
          std::isxdigit(static_cast<unsigned char>(desc[i + 2])) != 0) {
        base = 16;
        i += 2;
      }
    }
    std::uint64_t count = 0;
    std::size_t digits = 0;
    for (; i < desc.size(); ++i, ++digits) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(desc[i])));
      const std::uint64_t digit = c >= '0' && c <= '9'   ? static_cast<std::uint64_t>(c - '0')
                                  : c >= 'a' && c <= 'f' ? static_cast<std::uint64_t>(c - 'a' + 10)
                                                         : base;
      if (digit >= base) break;
      count = std::min(count * base + digit, kTooMany);
    }
    if (digits == 0) return out;
    if (negative && count != 0) count = kTooMany;
    out.leaves = std::min(out.leaves * count, kTooMany);
    last_level = desc.substr(level, i - level);
    if (i < desc.size() && desc[i] == '(' && !skip_past(')')) return out;
  }
  out.last_level = last_level;
  out.last_type = last_type;
  return out;
}

}  // namespace

Topology Topology::from_synthetic(std::string_view description) {
  // hwloc reads the description up to its first NUL byte, and the PU count below must be of
  // what hwloc reads: with a NUL, "11100008\0..." passed the count and hwloc spent minutes
  // building 11 million objects (topology_fuzz found it).
  const std::size_t nul = description.find('\0');
  NUMESH_CHECK(nul == std::string_view::npos, TopologyError,
               "the synthetic topology description has a NUL byte at offset {}: a description is "
               "text",
               nul);
  const std::string desc(description);
  const SyntheticLevels levels = scan_synthetic(desc);
  // hwloc 2.9's synthetic backend asserts, aborting the process, while it loads some memory-side
  // caches (topology_fuzz found "MemCache3:1 core:4 pu:2"), and numesh places no device by them.
  NUMESH_CHECK(levels.memory_side_cache.empty(), TopologyError,
               "the synthetic topology '{}' has a memory-side cache level ('{}'); numesh takes "
               "machines, packages, dies, groups, NUMA nodes, caches L1-L5, cores and PUs",
               desc, levels.memory_side_cache);
  const auto check_pus = [&](std::uint64_t pus) {
    NUMESH_CHECK(pus <= kMaxSyntheticPus, TopologyError,
                 "the synthetic topology '{}' describes more than {} PUs, the most numesh accepts",
                 desc, kMaxSyntheticPus);
  };
  check_pus(levels.leaves);
  UniqueTopology topo = init_topology();
  NUMESH_CHECK(hwloc_topology_set_synthetic(topo.get(), desc.c_str()) == 0, TopologyError,
               "hwloc rejected the synthetic topology description '{}'{}", desc,
               last_level_hint(levels));
  NUMESH_CHECK(hwloc_topology_load(topo.get()) == 0, TopologyError,
               "hwloc could not load the synthetic topology '{}': {}", desc, errno_text(errno));
  // The count above walks hwloc's parser from outside; should the two ever part, the limit
  // still holds before numesh's own quadratic passes over the objects.
  check_pus(static_cast<std::uint64_t>(hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_PU)));
  // hwloc's synthetic backend binds nothing and reports success, unless HWLOC_THISSYSTEM=1
  // told it that the description is this machine (how two NUMA devices are emulated on a
  // one-node machine).
  const bool can_bind = hwloc_topology_is_thissystem(topo.get()) != 0;
  std::vector<std::string> notes;
  if (!can_bind) {
    notes.emplace_back(
        "binding is not possible on a synthetic topology: devices run unpinned (set "
        "HWLOC_THISSYSTEM=1 to bind to the PUs it names)");
  }
  return HwlocTopology::make_topology(std::make_shared<const HwlocTopology>(std::move(topo)),
                                      TopologySource::kSynthetic, desc, can_bind, std::move(notes));
}

Topology Topology::from_xml(const std::filesystem::path& file) {
  const std::string path = file.string();
  std::error_code ec;
  NUMESH_CHECK(std::filesystem::exists(file, ec), TopologyError,
               "topology file '{}' does not exist", path);
  NUMESH_CHECK(!std::filesystem::is_directory(file, ec), TopologyError,
               "topology file '{}' is a directory", path);
  UniqueTopology topo = init_topology();
  NUMESH_CHECK(hwloc_topology_set_xml(topo.get(), path.c_str()) == 0, TopologyError,
               "hwloc could not read the topology file '{}': {}", path, errno_text(errno));
  NUMESH_CHECK(hwloc_topology_load(topo.get()) == 0, TopologyError,
               "hwloc could not load the topology file '{}': {}", path, errno_text(errno));
  // Even with HWLOC_THISSYSTEM=1 an export of some other machine names PUs this one may not
  // have, so XML topologies never bind.
  std::vector<std::string> notes{
      "binding is not possible on an XML topology: devices run unpinned"};
  return HwlocTopology::make_topology(std::make_shared<const HwlocTopology>(std::move(topo)),
                                      TopologySource::kXml, path, /*can_bind=*/false,
                                      std::move(notes));
}

}  // namespace numesh::runtime
