#include "numesh/ops/kernels/gemm.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cblas.h>

#include <mutex>

#include "numesh/core/check.hpp"
#include "numesh/core/error.hpp"

extern "C" void openblas_set_num_threads(int num_threads);

namespace numesh::ops {

namespace {

void use_one_blas_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

void gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float alpha, float beta,
          bool transpose_b) {
  const Eigen::Index m = a.rows(), k = a.cols();
  const Eigen::Index n = transpose_b ? b.rows() : b.cols();
  const Eigen::Index kb = transpose_b ? b.cols() : b.rows();
  NUMESH_CHECK(kb == k && c.rows() == m && c.cols() == n, ShapeError,
               "gemm: a is [{}, {}], b{} is [{}, {}], c is [{}, {}]: they do not multiply", m, k,
               transpose_b ? " (transposed)" : "", b.rows(), b.cols(), c.rows(), c.cols());
  if (m == 0 || n == 0) return;
  if (m * n * k >= kBlasMinMultiplyAdds) {
    use_one_blas_thread();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a.data(),
                static_cast<int>(k), b.data(), static_cast<int>(b.cols()), beta, c.data(),
                static_cast<int>(n));
    return;
  }
  // Small products: Eigen, never `auto` on an expression (it would re-evaluate or dangle).
  if (beta == 0.0f) {
    if (transpose_b) {
      c.noalias() = alpha * (a * b.transpose());
    } else {
      c.noalias() = alpha * (a * b);
    }
  } else {
    c *= beta;
    if (transpose_b) {
      c.noalias() += alpha * (a * b.transpose());
    } else {
      c.noalias() += alpha * (a * b);
    }
  }
}

namespace {
// Rows per parallel block inside one device: enough work per OpenBLAS call to stay efficient.
constexpr Eigen::Index kRowBlock = 64;
}  // namespace

void device_gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c) {
  const Eigen::Index rows = a.rows();
  if (oneapi::tbb::this_task_arena::max_concurrency() == 1 || rows <= kRowBlock) {
    gemm(a, b, c);
    return;
  }
  oneapi::tbb::parallel_for(
      oneapi::tbb::blocked_range<Eigen::Index>(0, rows, kRowBlock),
      [&](const oneapi::tbb::blocked_range<Eigen::Index>& r) {
        const Eigen::Index n = r.end() - r.begin();
        gemm(ConstMatrixMap(a.data() + r.begin() * a.cols(), n, a.cols()), b,
             MatrixMap(c.data() + r.begin() * c.cols(), n, c.cols()));
      });
}

}  // namespace numesh::ops
