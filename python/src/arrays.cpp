#include "arrays.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "conversions.hpp"
#include "numesh/core/dtype.hpp"
#include "numesh/core/error.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

namespace {

std::string dtype_name(const py::array& array) {
  return py::str(array.dtype()).cast<std::string>();
}

// `value` as an array of T, refused unless it is one already (no silent cast: a float64 array
// given where bf16 bits are expected would otherwise be read as numbers).
template <typename T>
py::array_t<T> exactly(py::handle value, const std::string& name, const char* what) {
  if (!py::isinstance<py::array>(value)) {
    throw TypeError(name + " is a " + python_type_name(value) + "; " + what +
                    " takes a NumPy array");
  }
  const auto array = py::reinterpret_borrow<py::array>(value);
  if (!array.dtype().is(py::dtype::of<T>())) {
    throw TypeError(name + " is an array of " + dtype_name(array) + "; " + what + " takes " +
                    py::str(py::dtype::of<T>()).cast<std::string>());
  }
  return py::reinterpret_borrow<py::array_t<T>>(value);
}

std::vector<std::int64_t> shape_of(const py::array& array) {
  return std::vector<std::int64_t>(array.shape(), array.shape() + array.ndim());
}

// A new array of `shape` whose values `fill(out)` writes.
template <typename T, typename Fill>
py::array_t<T> filled(const py::array& like, Fill fill) {
  py::array_t<T> out(std::vector<py::ssize_t>(like.shape(), like.shape() + like.ndim()));
  fill(out.mutable_data());
  return out;
}

}  // namespace

ArrayView array_view(py::handle value, const std::string& name) {
  if (!py::isinstance<py::array>(value)) {
    throw TypeError(name + " is a " + python_type_name(value) +
                    "; give a NumPy array of float32 (or uint16 holding bf16 bits)");
  }
  const auto array = py::reinterpret_borrow<py::array>(value);
  const bool f32 = array.dtype().is(py::dtype::of<float>());
  const bool bf16 = array.dtype().is(py::dtype::of<std::uint16_t>());
  if (!f32 && !bf16) {
    throw TypeError(name + " is an array of " + dtype_name(array) +
                    "; give float32 (.astype(np.float32)) or uint16 holding bf16 bits "
                    "(numesh.to_bf16)");
  }
  if ((array.flags() & py::array::c_style) == 0) {
    throw ValueError(name + " is not C-contiguous; give np.ascontiguousarray(" + name + ")");
  }
  return ArrayView{.data = array.data(), .shape = shape_of(array), .bf16 = bf16};
}

runtime::HostTensor to_host_tensor(const ArrayView& view) {
  std::int64_t size = 1;
  for (const std::int64_t d : view.shape) size *= d;
  runtime::HostTensor t{.shape = view.shape,
                        .data = std::vector<float>(static_cast<std::size_t>(size))};
  if (view.bf16) {
    const auto* in = static_cast<const std::uint16_t*>(view.data);
    std::transform(in, in + size, t.data.begin(), f32_from_bf16);
  } else {
    const auto* in = static_cast<const float*>(view.data);
    std::copy(in, in + size, t.data.begin());
  }
  return t;
}

py::array_t<float> to_numpy(runtime::HostTensor tensor) {
  const std::vector<py::ssize_t> shape(tensor.shape.begin(), tensor.shape.end());
  auto* values = new std::vector<float>(std::move(tensor.data));
  const py::capsule owner(values, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(shape, values->data(), owner);
}

void bind_arrays(py::module_& m) {
  m.def(
      "to_bf16",
      [](const py::object& value) {
        const auto in = exactly<float>(value, "the array", "to_bf16");
        const auto c = py::array_t<float, py::array::c_style | py::array::forcecast>(in);
        return filled<std::uint16_t>(c, [&](std::uint16_t* out) {
          std::transform(c.data(), c.data() + c.size(), out, bf16_from_f32);
        });
      },
      "array"_a, R"pbdoc(
float32 values as bfloat16 bits: a uint16 array of the same shape, rounded to nearest even (as
numesh stores bf16; NaN stays NaN). NumPy has no bfloat16, so numesh passes bf16 as uint16.
)pbdoc");
  m.def(
      "from_bf16",
      [](const py::object& value) {
        const auto in = exactly<std::uint16_t>(value, "the array", "from_bf16");
        const auto c = py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast>(in);
        return filled<float>(c, [&](float* out) {
          std::transform(c.data(), c.data() + c.size(), out, f32_from_bf16);
        });
      },
      "array"_a, "bfloat16 bits (a uint16 array) as float32 values of the same shape (exact).");
}

}  // namespace numesh::python
