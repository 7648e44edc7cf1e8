#include "numesh/models/hf/nonfinite_weights.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/models/hf/hf_weights.hpp"
#include "numesh/ops/kernels/parallel.hpp"
#include "numesh/runtime/block_formats.hpp"
#include "numesh/runtime/convert.hpp"
#include "numesh/runtime/graph.hpp"
#include "numesh/runtime/slot_values.hpp"
#include "numesh/runtime/weight_panels.hpp"

namespace numesh::models {

std::string NonfiniteWeight::describe() const {
  return fmt::format("{} holds {} non-finite value{} of {} (the first, {}, at {})", name, count,
                     count == 1 ? "" : "s", elements, first, first_at);
}

std::string weight_label(const std::string& slot, Architecture architecture, std::int64_t experts) {
  std::vector<HfTensorPart> parts;
  try {
    parts = hf_tensor_parts(slot, architecture, experts);
  } catch (const KeyError&) {
    return slot;  // a slot saved under no known name: numesh's own
  }
  if (parts.size() == 1 && parts.front().fused != FusedPart::kWhole) {
    // A slice of a fused tensor (Phi-3's q in qkv_proj): positions count from the slice's
    // first row, so the label names the slice as well as the tensor.
    return fmt::format("{} ({}'s rows of {})", slot, fused_part_name(parts.front().fused),
                       parts.front().name);
  }
  if (parts.size() == 1) return parts.front().name;
  return parts.empty() ? slot : fmt::format("{} ({}, ...)", slot, parts.front().name);
}

namespace {

// What one device found in its shard: how many non-finite values, and the first (its flat
// position in the shard and its value).
struct SlotFinding {
  std::int64_t count = 0;
  std::int64_t first_at = -1;
  double first = 0.0;  // a double: no padding bytes cross ranks
};

// Values a scan takes at once: a run of them is first asked, without a branch (so that the
// compiler vectorizes it), whether any has its exponent bits all ones; only a run that has is
// looked at value by value. A checkpoint's values are almost always all finite, and the loop
// that noted each value as it went ran one value a cycle.
constexpr std::size_t kScanRun = 1024;

// Whether any of the `n` values of `bits` (a float's or a 16-bit float's bits) has all the bits
// of `exponent` set: an infinity or a NaN.
template <typename Bits>
bool any_all_ones(const Bits* bits, std::size_t n, Bits exponent) {
  Bits hit = 0;
  for (std::size_t i = 0; i < n; ++i) hit |= static_cast<Bits>((bits[i] & exponent) == exponent);
  return hit != 0;
}

// note(i, value) for each of the n values of `dtype` (a float type whose exponent field is
// `exponent`) at `bits` whose exponent bits are all ones, the value widened by the one converter
// the checkpoint reader uses.
template <typename Bits, typename Note>
void note_all_ones(const Bits* bits, std::size_t n, Bits exponent, DType dtype, const Note& note) {
  for (std::size_t r = 0; r < n; r += kScanRun) {
    const std::size_t end = std::min(n, r + kScanRun);
    if (!any_all_ones<Bits>(bits + r, end - r, exponent)) continue;
    for (std::size_t i = r; i < end; ++i) {
      if ((bits[i] & exponent) != exponent) continue;
      float value = 0.0f;
      runtime::convert_elements(bits + i, dtype, &value, DType::kF32, 1);
      note(i, value);
    }
  }
}

// The non-finite elements among n values of `dtype` at `data`: the float types by their
// exponent bits (all ones: an infinity or a NaN), without widening; the first of them widened
// alone.
SlotFinding find_nonfinite(const void* data, std::size_t n, DType dtype) {
  SlotFinding f;
  const auto note = [&f](std::size_t i, double value) {
    if (f.count++ == 0) f.first_at = static_cast<std::int64_t>(i), f.first = value;
  };
  if (!is_element_dtype(dtype)) {
    // A block's values are finite when its f16 scales are (d; Q4_K's dmin too): the codes
    // are small integers and the largest finite scales times them stay far below f32's range
    // (block_formats.hpp). So only a block whose scale overflowed f16 (weights beyond ~8e6)
    // or holds a NaN is dequantized, to count its values as before: reading the scales alone
    // takes a q4_0 model's scan from every weight to one 2-byte field in 18 bytes.
    const DTypeTraits& format = traits(dtype);
    const auto block = static_cast<std::size_t>(format.block_elements);
    const auto bytes = static_cast<std::size_t>(format.block_bytes);
    std::vector<std::size_t> scale_at;  // the f16 scales' offsets in a block
    for (const std::int16_t at : format.f16_scales) {
      if (at >= 0) scale_at.push_back(static_cast<std::size_t>(at));
    }
    std::vector<float> values(block);
    const auto* blocks = static_cast<const std::byte*>(data);
    // The scale's exponent bits all ones: an infinity or a NaN.
    const auto all_ones = [](const std::byte* scale) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, scale, sizeof bits);
      return (bits & 0x7C00) == 0x7C00;
    };
    const std::size_t count = (n + block - 1) / block;
    for (std::size_t r = 0; r < count; r += kScanRun) {
      // A run of blocks is looked at closely only when one of its scales is non-finite: a
      // branch-free pass over the scales first, as for the float types (a branch a block,
      // through a vector of offsets, had the scan of a q4_0 file take as long as reading it).
      const std::size_t end = std::min(count, r + kScanRun);
      bool hit = false;
      for (const std::size_t o : scale_at) {
        for (std::size_t b = r; b < end; ++b) hit |= all_ones(blocks + b * bytes + o);
      }
      if (!hit) continue;
      for (std::size_t b = r; b < end; ++b) {
        const std::byte* at = blocks + b * bytes;
        if (std::none_of(scale_at.begin(), scale_at.end(),
                         [&](std::size_t o) { return all_ones(at + o); }))
          continue;
        runtime::convert_elements(at, dtype, values.data(), DType::kF32, block);
        for (std::size_t i = 0; i < block; ++i) {
          if (!std::isfinite(values[i])) note(b * block + i, values[i]);
        }
      }
    }
    return f;
  }
  switch (element_type(dtype)) {
    case ElementType::kF32:
      note_all_ones<std::uint32_t>(static_cast<const std::uint32_t*>(data), n, 0x7F800000U, dtype,
                                   note);
      return f;
    case ElementType::kBF16:
      note_all_ones<std::uint16_t>(static_cast<const std::uint16_t*>(data), n, 0x7F80, dtype, note);
      return f;
    case ElementType::kF16:
      note_all_ones<std::uint16_t>(static_cast<const std::uint16_t*>(data), n, 0x7C00, dtype, note);
      return f;
  }
  return f;
}

// Values a task of the scan takes (4 MiB of f32): a shard's runs of them are scanned over the
// device's threads, and their findings merged in order, so that the count and the first are
// those of one pass. One thread per shard had made the scan a pass over the whole model at one
// core's read rate, about as long as reading the checkpoint.
constexpr std::size_t kScanTask = std::size_t{1} << 20;

// find_nonfinite over the calling arena's threads.
SlotFinding find_nonfinite_parallel(const void* data, std::size_t n, DType dtype) {
  const DTypeTraits& format = traits(dtype);
  const auto per_block = static_cast<std::size_t>(format.block_elements);
  const std::size_t task = (kScanTask + per_block - 1) / per_block * per_block;
  const std::size_t tasks = (n + task - 1) / task;
  if (tasks <= 1) return find_nonfinite(data, n, dtype);
  std::vector<SlotFinding> found(tasks);
  ops::parallel_blocks(static_cast<std::int64_t>(n), static_cast<std::int64_t>(task),
                       [&](std::int64_t first, std::int64_t end) {
                         const auto* at = static_cast<const std::byte*>(data) +
                                          static_cast<std::size_t>(first) / per_block *
                                              static_cast<std::size_t>(format.block_bytes);
                         found[static_cast<std::size_t>(first) / task] =
                             find_nonfinite(at, static_cast<std::size_t>(end - first), dtype);
                       });
  SlotFinding all;
  for (std::size_t t = 0; t < tasks; ++t) {
    if (found[t].count > 0 && all.count == 0) {
      all.first_at = static_cast<std::int64_t>(t * task) + found[t].first_at;
      all.first = found[t].first;
    }
    all.count += found[t].count;
  }
  return all;
}

// Panels a task of the panels' scan takes: at 16 outputs of a 4096-wide q8_0 row, 64 panels
// are 4.4 MB, of which the scan reads the scales (one 64-byte line in 8.5).
constexpr std::int64_t kScanPanels = 64;

// find_nonfinite for a shard of Q8_0 or Q4_0 matrices stored in panels (runtime/weight_panels.hpp),
// its panels over the calling arena's threads: each block's 16 scales, which lie together, asked
// at once (branch-free) whether one is non-finite, and a block with one put back together from
// its panel to count its values; the rows after the panels as rows. Positions are the rows'
// (the first is the lowest, whichever task finds it).
SlotFinding find_nonfinite_in_panels(const runtime::Tensor& shard) {
  const DType dtype = shard.dtype();
  const std::size_t rank = shard.shape().size();
  const std::int64_t n = shard.shape()[rank - 2], k = shard.shape()[rank - 1];
  const std::int64_t matrices = n * k == 0 ? 0 : shard.size() / (n * k);
  const std::int64_t block_bytes = traits(dtype).block_bytes, blocks = k / 32;
  const std::int64_t row = row_bytes(dtype, k), units = (block_bytes - 2) / 4;
  const std::int64_t panelled = runtime::panel_outputs(n);
  const std::int64_t panels = panelled / runtime::kPanelWidth;  // a matrix's
  const auto merge = [](SlotFinding& f, const SlotFinding& g, std::int64_t offset) {
    if (g.count == 0) return;
    if (f.count == 0 || g.first_at + offset < f.first_at) {
      f.first_at = g.first_at + offset;
      f.first = g.first;
    }
    f.count += g.count;
  };
  const auto* data = static_cast<const std::byte*>(shard.data());
  // Panel q of the shard: panel q % panels of matrix q / panels.
  const auto scan_panel = [&](std::int64_t q, std::vector<std::byte>& block, SlotFinding& f) {
    const std::int64_t mi = q / panels, p = q % panels;
    const std::byte* matrix = data + mi * n * row;
    for (std::int64_t t = 0; t < blocks; ++t) {
      const std::byte* at = matrix + (p * blocks + t) * runtime::kPanelWidth * block_bytes;
      std::uint16_t scales[runtime::kPanelWidth];
      std::memcpy(scales, at, sizeof scales);
      if (!any_all_ones<std::uint16_t>(scales, runtime::kPanelWidth, 0x7C00)) continue;
      for (std::int64_t o = 0; o < runtime::kPanelWidth; ++o) {
        if ((scales[o] & 0x7C00) != 0x7C00) continue;
        std::memcpy(block.data(), &scales[o], sizeof scales[o]);
        for (std::int64_t u = 0; u < units; ++u) {
          std::memcpy(block.data() + 2 + 4 * u, at + 32 + 64 * u + 4 * o, 4);
        }
        const std::int64_t output = p * runtime::kPanelWidth + o;
        merge(f, find_nonfinite(block.data(), 32, dtype), (mi * n + output) * k + 32 * t);
      }
    }
  };
  const std::int64_t tasks = (matrices * panels + kScanPanels - 1) / kScanPanels;
  std::vector<SlotFinding> found(static_cast<std::size_t>(tasks));
  ops::parallel_blocks(matrices * panels, kScanPanels, [&](std::int64_t first, std::int64_t end) {
    std::vector<std::byte> block(static_cast<std::size_t>(block_bytes));
    SlotFinding& f = found[static_cast<std::size_t>(first / kScanPanels)];
    for (std::int64_t q = first; q < end; ++q) scan_panel(q, block, f);
  });
  SlotFinding all;
  for (const SlotFinding& f : found) merge(all, f, 0);
  for (std::int64_t mi = 0; mi < matrices; ++mi) {
    const std::byte* matrix = data + mi * n * row;
    merge(all,
          find_nonfinite(matrix + panelled * row, static_cast<std::size_t>((n - panelled) * k),
                         dtype),
          (mi * n + panelled) * k);
  }
  return all;
}

}  // namespace

std::vector<NonfiniteWeight> find_nonfinite_weights(const std::vector<NamedTensor>& weights) {
  for (const NamedTensor& w : weights) {
    NUMESH_CHECK(w.tensor != nullptr, ValueError, "non-finite scan: the weight {} is null", w.name);
  }
  // Every device of this rank counts in its own shard of each weight (one copy of each slice),
  // all at once: one graph for a run of weights on one device set (a graph a weight, built and
  // run, cost about 0.1 ms: most of a 109 M Llama's 12-16 ms scan in panels).
  std::vector<std::vector<SlotFinding>> per_slot(weights.size());
  for (std::size_t i = 0; i < weights.size();) {
    const std::shared_ptr<runtime::DeviceSet>& devices = weights[i].tensor->mesh().device_set();
    runtime::GraphBuilder builder(devices);
    std::size_t j = i;
    for (; j < weights.size() && weights[j].tensor->mesh().device_set() == devices; ++j) {
      const runtime::ShardedTensor& t = *weights[j].tensor;
      const runtime::DeviceMesh& mesh = t.mesh();
      std::vector<SlotFinding>& found = per_slot[j];
      found.resize(static_cast<std::size_t>(mesh.size()));
      for (const std::int64_t slot : mesh.local_slots()) {
        if (t.layout().device(slot).replica_id != 0) continue;
        const runtime::Tensor& shard = t.shard(slot);
        builder.add(mesh.device(slot).index(), fmt::format("nonfinite[{}][{}]", j, slot),
                    [&found, &shard, slot] {
                      found[static_cast<std::size_t>(slot)] =
                          shard.order() == runtime::StoredOrder::kPanels
                              ? find_nonfinite_in_panels(shard)
                              : find_nonfinite_parallel(shard.data(),
                                                        static_cast<std::size_t>(shard.size()),
                                                        shard.dtype());
                    });
      }
    }
    builder.compile().run();
    i = j;
  }
  std::vector<NonfiniteWeight> found;
  for (std::size_t wi = 0; wi < weights.size(); ++wi) {
    const NamedTensor& w = weights[wi];
    const runtime::ShardedTensor& t = *w.tensor;
    const runtime::DeviceMesh& mesh = t.mesh();
    // Other ranks' devices counted there: every rank reports the same.
    const std::vector<SlotFinding> slots =
        runtime::values_of_every_slot(mesh, std::move(per_slot[wi]));
    NonfiniteWeight report;
    report.name = w.name;
    report.elements = 1;
    for (const std::int64_t e : t.shape()) report.elements *= e;
    for (const SlotFinding& f : slots) report.count += f.count;
    if (report.count == 0) continue;
    // The first, in the first shard that holds one, its coordinates moved to the shard's place.
    const auto first =
        std::find_if(slots.begin(), slots.end(), [](const SlotFinding& f) { return f.count > 0; });
    const auto first_slot = static_cast<std::int64_t>(first - slots.begin());
    const std::vector<std::int64_t>& shard_shape = t.layout().shard_shape();
    std::int64_t rest = first->first_at;
    std::vector<std::int64_t> at(shard_shape.size());
    for (std::size_t d = shard_shape.size(); d-- > 0;) {
      at[d] = rest % shard_shape[d] + t.layout().device(first_slot).slices[d].offset;
      rest /= shard_shape[d];
    }
    report.first = static_cast<float>(first->first);
    report.first_at = fmt::format("[{}]", fmt::join(at, ", "));
    found.push_back(std::move(report));
  }
  return found;
}

}  // namespace numesh::models
