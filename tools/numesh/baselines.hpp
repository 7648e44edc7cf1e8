#pragma once

// What `numesh generate --baselines` measures beside a model in the same run, so that its load,
// prefill and decode rates are read as fractions of what the machine does plainly: a read of
// the checkpoint's files, OpenBLAS's multithreaded sgemm at the prefill's shape, and the memory
// read bandwidth of the mesh's devices.

#include <cstdint>
#include <filesystem>
#include <vector>

#include "numesh/runtime/device_mesh.hpp"

namespace numesh::tools {

/// Seconds to read `files` whole with read(2) into one 8 MiB buffer.
/// Throws: IoError naming a file that cannot be opened.
double plain_read_seconds(const std::vector<std::filesystem::path>& files);

/// Seconds to read each of `files` whole with read(2) into new memory of its size (anonymous
/// pages asking for huge pages, as the devices' buffers do; freed after each file, untimed):
/// what any loader that keeps the bytes pays on top of plain_read_seconds, the kernel zeroing
/// every new page before the read fills it. It needs free memory the size of the largest file
/// beside the model.
/// Throws: IoError naming a file that cannot be opened or read, or memory that cannot be mapped.
double read_into_new_memory_seconds(const std::vector<std::filesystem::path>& files);

/// GFLOP/s of OpenBLAS's cblas_sgemm for C[m, n] = A[m, k] B[k, n] on `threads` threads (the
/// median of `repeats` timed calls after one untimed), random operands. OpenBLAS's thread count
/// is restored to what it was.
/// Throws: ValueError for non-positive sizes, threads or repeats.
double openblas_sgemm_gflops(std::int64_t m, std::int64_t k, std::int64_t n, int threads,
                             int repeats);

/// The read kernel's GB/s summed over the mesh's devices (each with all its threads, `bytes`
/// per device, the median of `repeats` passes): the roofline of a decode step.
double read_bandwidth_gbps(const runtime::DeviceMesh& mesh, std::int64_t bytes, int repeats);

}  // namespace numesh::tools
