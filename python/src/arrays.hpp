#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "numesh/runtime/tensor.hpp"

/// NumPy arrays in and out of numesh's host tensors, and bf16 as NumPy holds it: uint16 arrays
/// of bfloat16 bits (NumPy has no bfloat16).
namespace numesh::python {

/// The values of `value`, a C-contiguous NumPy array of float32, or of uint16 holding bfloat16
/// bits (widened exactly), as a host tensor of its shape. `name` is how errors call it.
/// Throws: TypeError for anything but such an array (naming its type or dtype and the fix);
/// ValueError for one that is not C-contiguous.
[[nodiscard]] runtime::HostTensor to_host_tensor(pybind11::handle value, const std::string& name);

/// `tensor` as a float32 NumPy array of its shape that takes its values without a copy (a
/// capsule owns them).
[[nodiscard]] pybind11::array_t<float> to_numpy(runtime::HostTensor tensor);

/// numesh.to_bf16 and numesh.from_bf16: float32 arrays to bfloat16 bits (uint16, rounding to
/// nearest even as numesh stores bf16) and back (exact).
void bind_arrays(pybind11::module_& m);

}  // namespace numesh::python
