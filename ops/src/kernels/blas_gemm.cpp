#include "numesh/ops/kernels/blas_gemm.hpp"

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

void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, bool transpose_b, float beta,
          float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (m * n * k >= kBlasMinMultiplyAdds) {
    use_one_blas_thread();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
    return;
  }
  // Small products: Eigen, never `auto` on an expression (it would re-evaluate or dangle).
  using Strided = Eigen::OuterStride<>;
  const Eigen::Map<const RowMatrix, 0, Strided> am(a, m, k, Strided(lda));
  Eigen::Map<RowMatrix, 0, Strided> cm(c, m, n, Strided(ldc));
  if (beta == 0.0f) {
    cm.setZero();
  } else if (beta != 1.0f) {
    cm *= beta;
  }
  if (transpose_b) {
    cm.noalias() +=
        alpha * (am * Eigen::Map<const RowMatrix, 0, Strided>(b, n, k, Strided(ldb)).transpose());
  } else {
    cm.noalias() += alpha * (am * Eigen::Map<const RowMatrix, 0, Strided>(b, k, n, Strided(ldb)));
  }
}

void gemm(ConstMatrixMap a, ConstMatrixMap b, MatrixMap c, float alpha, float beta,
          bool transpose_b) {
  const Eigen::Index m = a.rows(), k = a.cols();
  const Eigen::Index n = transpose_b ? b.rows() : b.cols();
  const Eigen::Index kb = transpose_b ? b.cols() : b.rows();
  NUMESH_CHECK(kb == k && c.rows() == m && c.cols() == n, ShapeError,
               "gemm: a is [{}, {}], b{} is [{}, {}], c is [{}, {}]: they do not multiply", m, k,
               transpose_b ? " (transposed)" : "", b.rows(), b.cols(), c.rows(), c.cols());
  gemm(m, n, k, alpha, a.data(), k, b.data(), b.cols(), transpose_b, beta, c.data(), n);
}

void gemm_transposed_a(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                       std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (m * n * k >= kBlasMinMultiplyAdds) {
    use_one_blas_thread();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
    return;
  }
  using Strided = Eigen::OuterStride<>;
  Eigen::Map<RowMatrix, 0, Strided> cm(c, m, n, Strided(ldc));
  const Eigen::Map<const RowMatrix, 0, Strided> am(a, k, m, Strided(lda));
  const Eigen::Map<const RowMatrix, 0, Strided> bm(b, k, n, Strided(ldb));
  if (beta == 0.0f) {
    cm.noalias() = alpha * (am.transpose() * bm);
  } else {
    cm = beta * cm;
    cm.noalias() += alpha * (am.transpose() * bm);
  }
}

}  // namespace numesh::ops
