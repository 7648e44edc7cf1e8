#include "numesh/ops/kernels/argmax.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "numesh/ops/kernels/parallel.hpp"

namespace numesh::ops {

void row_argmax(ConstMatrixMap logits, std::int64_t first_index, float* out) {
  const std::int64_t rows = logits.rows(), cols = logits.cols();
  parallel_blocks(rows, row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* row = logits.data() + r * cols;
      std::int64_t at = 0;
      for (std::int64_t j = 1; j < cols && !std::isnan(row[at]); ++j) {
        if (std::isnan(row[j]) || row[j] > row[at]) at = j;
      }
      out[2 * r] = row[at];
      out[2 * r + 1] = static_cast<float>(first_index + at);
    }
  });
}

void row_top_k(ConstMatrixMap logits, std::int64_t first_index, std::int64_t k, float* out) {
  const std::int64_t rows = logits.rows(), cols = logits.cols();
  parallel_blocks(rows, row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* row = logits.data() + r * cols;
      // The k best so far, best first, as column numbers held exactly in fp32 (cols < 2^24), in
      // the second half of the row's own output: no buffer of a thread's, so that no step
      // allocates whichever thread runs it (a thread_local buffer grew on a thread's first row,
      // which SteadyStepTest caught when the arena gave the node to a thread new to it).
      float* best = out + r * 2 * k + k;
      // NaN ranks above every number (as in row_argmax), so a NaN row reaches the host's check;
      // the lower index first among equals: a total order, so the k best are one set in one
      // order whatever the scan.
      const auto before = [row](float fa, float fb) {
        const auto a = static_cast<std::int64_t>(fa), b = static_cast<std::int64_t>(fb);
        const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
        if (na != nb) return na;
        return (!na && row[a] > row[b]) || ((na || row[a] == row[b]) && a < b);
      };
      // One pass over a heap of the k best, its root the worst of them: a column enters when
      // it beats the root (few do); O(cols log k), whatever k is.
      std::int64_t size = 0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const auto column = static_cast<float>(c);
        if (size < k) {
          best[size++] = column;
          std::push_heap(best, best + size, before);
        } else if (before(column, best[0])) {
          std::pop_heap(best, best + k, before);
          best[k - 1] = column;
          std::push_heap(best, best + k, before);
        }
      }
      std::sort_heap(best, best + k, before);
      // Entry i goes to out[2i] and out[2i + 1], below best + i + 1 (2i + 1 <= k + i): never
      // over an entry still to be read.
      float* row_out = out + r * 2 * k;
      for (std::int64_t i = 0; i < k; ++i) {
        const auto c = static_cast<std::int64_t>(best[i]);
        row_out[2 * i] = row[c];
        row_out[2 * i + 1] = static_cast<float>(first_index + c);
      }
    }
  });
}

void row_log_sum_exp(ConstMatrixMap logits, float* out) {
  const std::int64_t rows = logits.rows(), cols = logits.cols();
  parallel_blocks(rows, row_block_for(cols), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* row = logits.data() + r * cols;
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < cols; ++j)
        m = std::isnan(row[j]) ? row[j] : std::max<double>(m, row[j]);
      if (std::isnan(m) || std::isinf(m)) {
        // NaN, +inf, or a row that rules out every token: the normaliser is that value.
        out[r] = static_cast<float>(m);
        continue;
      }
      double sum = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) sum += std::exp(static_cast<double>(row[j]) - m);
      out[r] = static_cast<float>(m + std::log(sum));
    }
  });
}

}  // namespace numesh::ops
