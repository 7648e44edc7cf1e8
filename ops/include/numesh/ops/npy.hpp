#pragma once

#include <filesystem>

#include "numesh/runtime/tensor.hpp"

// NumPy .npy files: how weights and inputs come in from PyTorch or NumPy and how outputs go
// back to be checked there. Only what numesh computes in is accepted: fp32, little-endian,
// C order (NumPy's `np.save(f, a.astype('<f4'))`; PyTorch: `np.save(f, t.numpy())`).
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html (versions
// 1.0, 2.0 and 3.0 of the header are read; 1.0 is written).

namespace numesh::ops {

/// Reads `file`. Rank 0 (a scalar) to any rank; zero-sized dims are allowed.
/// Throws: IoError when the file cannot be opened or ends early (naming the file and how many
/// bytes were expected); ValueError when it is not an .npy file or its dtype is not '<f4', it
/// is Fortran-ordered, or its header cannot be parsed (naming the file and the offending
/// header field and value, e.g. "descr '<f8' is float64; numesh reads only '<f4' (fp32)").
runtime::HostTensor load_npy(const std::filesystem::path& file);

/// Writes `tensor` to `file` as fp32, little-endian, C order (format version 1.0), replacing
/// the file if it exists.
/// Throws: IoError when the file cannot be written; ShapeError when the tensor's data does
/// not match its shape.
void save_npy(const std::filesystem::path& file, const runtime::HostTensor& tensor);

}  // namespace numesh::ops
