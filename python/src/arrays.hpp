#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "numesh/runtime/tensor.hpp"

/// NumPy arrays in and out of numesh's host tensors, and bf16 as NumPy holds it: uint16 arrays
/// of bfloat16 bits (NumPy has no bfloat16).
namespace numesh::python {

/// A C-contiguous NumPy array of float32, or of uint16 holding bfloat16 bits, as numesh reads
/// it: its buffer and shape, checked while the GIL is held and read later without it. The
/// array must outlive the view (a call's arguments do).
struct ArrayView {
  const void* data = nullptr;
  std::vector<std::int64_t> shape;
  bool bf16 = false;  ///< uint16 bfloat16 bits; else float32
};

/// `value` as an ArrayView. `name` is how errors call it. Throws: TypeError for anything but
/// such an array (naming its type or dtype and the fix); ValueError for one that is not
/// C-contiguous.
[[nodiscard]] ArrayView array_view(pybind11::handle value, const std::string& name);

/// The values of `view` (bf16 widened exactly) as a host tensor of its shape. Needs no GIL.
[[nodiscard]] runtime::HostTensor to_host_tensor(const ArrayView& view);

/// `tensor` as a float32 NumPy array of its shape that takes its values without a copy (a
/// capsule owns them).
[[nodiscard]] pybind11::array_t<float> to_numpy(runtime::HostTensor tensor);

/// numesh.to_bf16 and numesh.from_bf16: float32 arrays to bfloat16 bits (uint16, rounding to
/// nearest even as numesh stores bf16) and back (exact).
void bind_arrays(pybind11::module_& m);

}  // namespace numesh::python
