#include "shard_reader.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "numesh/core/check.hpp"
#include "numesh/runtime/weight_panels.hpp"
#include "transpose.hpp"

namespace numesh::models::detail {

namespace {

// Source rows a task reads and transposes at a time: 64 rows of a 14336-wide fp32 matrix are
// 3.5 MiB, and the transposed writes land in 64-element runs of each shard row.
constexpr std::int64_t kRowBlock = 64;

// Calls f(first, rows) for the blocks [first, first + rows) that cover rows [0, n) of a box of
// tensor `name`, over the calling arena's threads: kRowBlock rows, or the least multiple of
// whole panels and whole groups of the rows the checkpoint reads together that is at least
// kRowBlock (a head of GGUF's permuted q and k: blocks of 64 rows would read each head of 128
// twice; heads of 48 are read in blocks of 96, heads of 100 in 400); the last block shorter.
// The blocks are counted, not split off a range: tbb::blocked_range halves a range down to its
// grain wherever the middle falls (11008 rows end in blocks of 43 at rows 43, 86...), which
// would cut panels.
void for_each_row_block(const Checkpoint& checkpoint, const std::string& name, std::int64_t n,
                        const std::function<void(std::int64_t first, std::int64_t rows)>& f) {
  const std::int64_t whole = std::lcm(
      runtime::kPanelWidth, std::max<std::int64_t>(1, checkpoint.rows_read_together(name)));
  const std::int64_t block = whole * ((kRowBlock + whole - 1) / whole);
  tbb::parallel_for(std::int64_t{0}, (n + block - 1) / block, [&](std::int64_t b) {
    const std::int64_t first = b * block;
    f(first, std::min(block, n - first));
  });
}

// Reads matrix `name` [out, in]'s box [o0, o0 + no) x [i0, i0 + ni) transposed into `dst`, the
// row-major [ni, no] block of a shard (elements of `dtype`), over the calling arena's threads.
void read_transposed(const Checkpoint& checkpoint, const std::string& name, std::int64_t o0,
                     std::int64_t no, std::int64_t i0, std::int64_t ni, DType dtype,
                     std::byte* dst) {
  // A block format's blocks run along stored rows, which a transposed read would cut across.
  NUMESH_CHECK(is_element_dtype(dtype), TypeError,
               "{}: a {} shard cannot be read transposed: block formats are stored out-in only",
               name, to_string(dtype));
  const std::size_t size = dtype_size(dtype);
  for_each_row_block(checkpoint, name, no, [&](std::int64_t first, std::int64_t rows) {
    // Each task stages its own block (tasks may nest on one thread, so not thread-local).
    std::vector<std::byte> block(static_cast<std::size_t>(rows * ni) * size);
    const std::array<std::int64_t, 2> offsets{o0 + first, i0}, sizes{rows, ni};
    checkpoint.read_box(name, offsets, sizes, dtype, block);
    transpose(block.data(), rows, ni, size, dst + static_cast<std::size_t>(first) * size, no);
  });
}

// Reads tensor `name`'s box [r0, r0 + nr) x [c0, c0 + nc) as it is into `dst` ([nr, nc]) in
// `order`, in row blocks over the calling arena's threads.
void read_straight(const Checkpoint& checkpoint, const std::string& name, std::int64_t r0,
                   std::int64_t nr, std::int64_t c0, std::int64_t nc, DType dtype,
                   runtime::StoredOrder order, std::byte* dst) {
  // Whole rows of the box in the shard's format (a block format's blocks run along them).
  const auto row_bytes = static_cast<std::size_t>(numesh::row_bytes(dtype, nc));
  for_each_row_block(checkpoint, name, nr, [&](std::int64_t first, std::int64_t rows) {
    const std::array<std::int64_t, 2> offsets{r0 + first, c0}, sizes{rows, nc};
    const std::span<std::byte> to(dst + static_cast<std::size_t>(first) * row_bytes,
                                  static_cast<std::size_t>(rows) * row_bytes);
    if (order == runtime::StoredOrder::kRows) {
      checkpoint.read_box(name, offsets, sizes, dtype, to);
      return;
    }
    // Panels lie where their rows would: the block's rows are staged (in the cache) and
    // written once as its panels, the matrix's last rows mod 16 as rows, instead of a second
    // pass over the whole shard rearranging it in memory.
    const auto staged = std::make_unique_for_overwrite<std::byte[]>(to.size());
    checkpoint.read_box(name, offsets, sizes, dtype, std::span(staged.get(), to.size()));
    runtime::rows_to_panels(dtype, rows, nc, std::span(staged.get(), to.size()), to);
  });
}

// nn.Linear matrices ([out, in]) go to a tensor stored out-in as they are, to an in-out one
// transposed; other sources ([rows, cols], the embedding table) as they are.
bool straight(const MatrixFill& m) noexcept {
  return !m.source->transposed || m.stored == ops::WeightLayout::kOutIn;
}

// The file's bytes of the shard of `slot` of a matrix the file stores as the tensor stores it
// (rows of one tensor, out-in or not transposed, not stacked), read in place; nullptr when they
// are not one run of the file in the shard's format (Checkpoint::box_in_place) or the matrix
// is not such a matrix. The shard's order is not looked at: the caller decides.
std::shared_ptr<const std::byte> bytes_in_place(const Checkpoint& checkpoint, const MatrixFill& m,
                                                std::int64_t slot) {
  const MatrixSource& source = *m.source;
  const auto& box = m.tensor->layout().device(slot).slices;
  if (!straight(m) || box.size() != 2) return nullptr;  // experts [E, ., .] are one tensor each
  const std::array<std::int64_t, 2> offsets{source.row_offset + box[0].offset, box[1].offset},
      sizes{box[0].extent, box[1].extent};
  return checkpoint.box_in_place(source.tensors[0], offsets, sizes, m.tensor->dtype());
}

// True when `m` is stored in panels and read_shards could read every local shard of it from the
// file in place were it stored in rows.
bool panels_of_rows_in_place(const Checkpoint& checkpoint, const MatrixFill& m) {
  if (m.tensor->order() != runtime::StoredOrder::kPanels) return false;
  const std::vector<std::int64_t>& slots = m.tensor->mesh().local_slots();
  return std::all_of(slots.begin(), slots.end(), [&](std::int64_t slot) {
    return bytes_in_place(checkpoint, m, slot) != nullptr;
  });
}

}  // namespace

std::int64_t panel_bytes_of_rows_in_place(const Checkpoint& checkpoint,
                                          std::span<const MatrixFill> matrices) {
  std::int64_t bytes = 0;
  for (const MatrixFill& m : matrices) {
    if (!panels_of_rows_in_place(checkpoint, m)) continue;
    bytes +=
        m.tensor->shard_bytes() * static_cast<std::int64_t>(m.tensor->mesh().local_slots().size());
  }
  return bytes;
}

int keep_in_place_rows(const Checkpoint& checkpoint, std::span<const MatrixFill> matrices) {
  int relaid = 0;
  for (const MatrixFill& m : matrices) {
    runtime::ShardedTensor& tensor = *m.tensor;
    if (!panels_of_rows_in_place(checkpoint, m)) continue;
    // Laid out again, unfilled and in rows; the holders of the tensor (the layers) see the new
    // one, and no program has read the old one yet (read_shards' REQUIRES).
    tensor =
        runtime::ShardedTensor(tensor.mesh(), tensor.shape(), tensor.spec(), tensor.dtype(),
                               runtime::BufferContents::kUnspecified, runtime::StoredOrder::kRows);
    ++relaid;
  }
  return relaid;
}

std::int64_t read_shards(const Checkpoint& checkpoint, std::span<const MatrixFill> matrices,
                         bool in_place, const std::function<void(std::size_t i)>& after) {
  std::atomic<std::int64_t> mapped{0};
  std::vector<runtime::ShardedTensor*> tensors;
  for (const MatrixFill& m : matrices) tensors.push_back(m.tensor);
  // Matrices reported so far: counted by this rank's first slot's thread during the fill, by
  // this one after it (a matrix whose shard there is empty is reported with the next one, or at
  // the end).
  std::size_t reported = 0;
  const auto report_through = [&](std::size_t last) {
    for (; reported <= last; ++reported) after(reported);
  };
  const auto fill = [&](std::size_t i, std::int64_t slot, runtime::Tensor& shard) {
    const MatrixSource& source = *matrices[i].source;
    const runtime::ShardedTensor& tensor = *matrices[i].tensor;
    const auto& box = tensor.layout().device(slot).slices;
    auto* dst = static_cast<std::byte*>(shard.data());
    const DType dtype = shard.dtype();
    // One matrix, or experts [E, ., .] from one checkpoint tensor each.
    const bool stacked = box.size() == 3;
    const std::size_t first = stacked ? 1 : 0;
    const std::int64_t r0 = box[first].offset, nr = box[first].extent;
    const std::int64_t c0 = box[first + 1].offset, nc = box[first + 1].extent;
    const std::int64_t e0 = stacked ? box[0].offset : 0, ne = stacked ? box[0].extent : 1;
    const auto matrix_bytes = static_cast<std::size_t>(nr * row_bytes(dtype, nc));
    // One tensor's rows as the file has them: the shard reads them where they are.
    if (in_place && shard.order() == runtime::StoredOrder::kRows) {
      if (std::shared_ptr<const std::byte> bytes = bytes_in_place(checkpoint, matrices[i], slot)) {
        shard.use_mapped(std::move(bytes));
        mapped += static_cast<std::int64_t>(shard.size_bytes());
        if (slot == tensor.mesh().local_slots().front() && after) report_through(i);
        return;
      }
    }
    for (std::int64_t e = 0; e < ne; ++e) {
      const std::string& name = source.tensors[static_cast<std::size_t>(e0 + e)];
      std::byte* to = dst + static_cast<std::size_t>(e) * matrix_bytes;
      // A slice of a fused tensor starts source.row_offset rows into it (its outputs).
      if (straight(matrices[i])) {
        read_straight(checkpoint, name, source.row_offset + r0, nr, c0, nc, dtype, shard.order(),
                      to);
      } else {  // the shard is [in, out]: rows r of the box are inputs, columns outputs
        read_transposed(checkpoint, name, source.row_offset + c0, nc, r0, nr, dtype, to);
      }
    }
    if (slot == tensor.mesh().local_slots().front() && after) report_through(i);
  };
  runtime::fill_shards(tensors, fill, runtime::FillWrites::kStoredOrder);
  if (after && reported < matrices.size()) report_through(matrices.size() - 1);
  return mapped.load();
}

}  // namespace numesh::models::detail
