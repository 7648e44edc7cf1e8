#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "numesh/runtime/tensor.hpp"

// NumPy .npy files: how weights and inputs come in from PyTorch or NumPy and how outputs go
// back to be checked there. Only what numesh computes in is accepted: fp32, little-endian,
// C order (NumPy's `np.save(f, a.astype('<f4'))`; PyTorch: `np.save(f, t.numpy())`).
// Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html (versions
// 1.0, 2.0 and 3.0 of the header are read; 1.0 is written).

namespace numesh::models {

/// Reads `file`. Rank 0 (a scalar) to any rank; zero-sized dims are allowed.
/// Throws: IoError when the file cannot be opened or ends early (naming the file and how many
/// bytes were expected); ValueError when it is not an .npy file or its dtype is not '<f4', it
/// is Fortran-ordered, or its header cannot be parsed (naming the file and the offending
/// header field and value, e.g. "descr '<f8' is float64; numesh reads only '<f4' (fp32)").
runtime::HostTensor load_npy(const std::filesystem::path& file);

/// Integer token ids from an .npy file: its shape and values, row-major.
struct NpyIds {
  std::vector<std::int64_t> shape;
  std::vector<std::int32_t> values;
};

/// Reads `file` holding integers '<i4' (np.int32) or '<i8' (np.int64, NumPy's default; each
/// value must fit int32), C order: training data and prompts.
/// Throws: as load_npy, with the dtype named ("numesh reads only '<i4' or '<i8' (integer token
/// ids)"); ValueError naming the index and value of an '<i8' id outside int32.
NpyIds load_npy_ids(const std::filesystem::path& file);

/// Writes `tensor` to `file` as fp32, little-endian, C order (format version 1.0), replacing
/// the file if it exists.
/// Throws: IoError when the file cannot be written; ShapeError when the tensor's data does
/// not match its shape.
void save_npy(const std::filesystem::path& file, const runtime::HostTensor& tensor);

}  // namespace numesh::models
