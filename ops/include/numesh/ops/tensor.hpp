#pragma once

#include <Eigen/Core>

// Eigen is numesh's kernel layer, not its tensor type: storage is owned by the runtime
// (HostTensor, Tensor, DeviceBuffer) and kernels see it through these row-major maps, so that
// Eigen's strides match the dimension order of PartitionSpecs.

namespace numesh::ops {

/// A row-major fp32 matrix (owning; for references and tests).
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A writable row-major view of someone else's storage.
using MatrixMap = Eigen::Map<RowMatrix>;
/// A read-only row-major view of someone else's storage.
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

}  // namespace numesh::ops
