#pragma once

// PRIVATE: the known inputs and expected outputs of the collective benchmarks
// (collective_benchmark.cpp), shared with the baseline of MPI's own collectives
// (mpi_collective.cpp). Inputs hold small integers, exact in every dtype, so every sum is exact
// in fp32 and outputs compare for equality whatever the reduction order.

#include <cstddef>
#include <functional>
#include <span>

#include "numesh/core/dtype.hpp"
#include "numesh/diagnostics/collective_benchmark.hpp"

namespace numesh::diagnostics::detail {

/// Writes rank `rank`'s known input (`count` elements of `dtype`) into `data`.
void fill_inputs(void* data, DType dtype, std::size_t count, std::size_t rank);

/// Elements per rank for `bytes` per rank of `dtype` among `ranks`.
/// Throws: ValueError for a block dtype or bytes that are not a positive multiple of the element
/// size x ranks (naming the op, the bytes, the dtype and the ranks).
std::size_t element_count(CollectiveOp op, std::size_t bytes, std::size_t ranks, DType dtype);

/// Output elements per rank for `count` input elements per rank.
std::size_t output_count(CollectiveOp op, std::size_t count, std::size_t ranks);

/// True when the output of every rank in `which` (out(r) its first element) holds what `op`
/// over `ranks` ranks of known inputs gives (every element of small outputs; of large ones
/// every (n / 4096)-th and the last).
bool check_outputs(CollectiveOp op, std::size_t count, std::size_t ranks, DType dtype,
                   const std::function<const void*(std::size_t)>& out,
                   std::span<const std::size_t> which);

}  // namespace numesh::diagnostics::detail
