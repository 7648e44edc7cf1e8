#include "baselines.hpp"

#include <cblas.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"
#include "numesh/core/timing.hpp"
#include "numesh/diagnostics/memory_benchmark.hpp"

namespace numesh::tools {

double plain_read_seconds(const std::vector<std::filesystem::path>& files) {
  std::vector<char> buffer(std::size_t{8} << 20);
  const auto start = std::chrono::steady_clock::now();
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    NUMESH_CHECK(in.is_open(), IoError, "cannot read {}", path.string());
    while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    }
  }
  return seconds_since(start);
}

double read_into_new_memory_seconds(const std::vector<std::filesystem::path>& files) {
  double seconds = 0;  // the maps and reads; not the opens, nor giving the memory back
  for (const auto& path : files) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    NUMESH_CHECK(fd >= 0, IoError, "cannot read {}: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      throw IoError(fmt::format("cannot read {}: {}", path.string(), std::strerror(error)));
    }
    const auto bytes = static_cast<std::size_t>(st.st_size);
    const auto start = std::chrono::steady_clock::now();
    void* memory = bytes == 0 ? nullptr
                              : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      ::close(fd);
      throw IoError(fmt::format("cannot map {} bytes to read {} into", bytes, path.string()));
    }
    (void)::madvise(memory, bytes, MADV_HUGEPAGE);  // a hint: refused, the pages are 4 KiB
    std::size_t done = 0;
    int error = 0;
    while (done < bytes) {
      const ssize_t got = ::read(fd, static_cast<char*>(memory) + done,
                                 std::min<std::size_t>(bytes - done, std::size_t{1} << 26));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        error = got < 0 ? errno : 0;
        break;
      }
      done += static_cast<std::size_t>(got);
    }
    seconds += seconds_since(start);
    if (memory != nullptr) ::munmap(memory, bytes);
    ::close(fd);
    NUMESH_CHECK(done == bytes, IoError, "{}: read {} of its {} bytes{}", path.string(), done,
                 bytes, error != 0 ? fmt::format(" ({})", std::strerror(error)) : std::string());
  }
  return seconds;
}

double openblas_sgemm_gflops(std::int64_t m, std::int64_t k, std::int64_t n, int threads,
                             int repeats) {
  NUMESH_CHECK(m > 0 && k > 0 && n > 0 && threads > 0 && repeats > 0, ValueError,
               "sgemm baseline: sizes {}x{}x{}, {} threads and {} repeats must be positive", m, k,
               n, threads, repeats);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
      c(static_cast<std::size_t>(m * n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : a) x = uniform(rng);
  for (float& x : b) x = uniform(rng);
  // numesh keeps OpenBLAS single-threaded inside its devices; the baseline gets every thread.
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  const auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), b.data(),
                static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
  };
  const double seconds = median_seconds(once, repeats, 0.0);
  openblas_set_num_threads(before);
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / seconds /
         1e9;
}

double read_bandwidth_gbps(const runtime::DeviceMesh& mesh, std::int64_t bytes, int repeats) {
  diagnostics::MemoryBenchmarkOptions options;
  options.bytes = bytes;
  options.kernels = {diagnostics::MemoryKernel::kRead};
  options.threads = {0};
  options.repeats = repeats;
  const diagnostics::DeviceBandwidthResult read =
      diagnostics::measure_device_bandwidth(*mesh.device_set(), options);
  double gbps = 0.0;
  for (const diagnostics::BandwidthMeasurement& m : read.measurements) gbps += m.gbps;
  return gbps;
}

}  // namespace numesh::tools
