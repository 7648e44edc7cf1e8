#include "conversions.hpp"

#include <pybind11/stl.h>

#include <string>
#include <utility>

#include "numesh/core/error.hpp"

namespace py = pybind11;

namespace numesh::python {

namespace {

// The module's singletons and the PartitionSpec class, kept for the life of the process: a
// pybind11 object must not be destroyed after the interpreter is (a static py::object would
// be), so these are deliberately never freed.
py::object* not_given_object = nullptr;
py::object* unconstrained_object = nullptr;

py::object& partition_spec_class() {
  static py::object* cls =
      new py::object(py::module_::import("numesh.partition_spec").attr("PartitionSpec"));
  return *cls;
}

// The shape and str(dtype) of an object that has a shape; the dtype is "" when it has none.
sharding::ArrayInfo read_array(py::handle x) {
  sharding::ArrayInfo info;
  info.shape = to_shape(py::tuple(x.attr("shape")));
  info.dtype = py::hasattr(x, "dtype") ? py::str(x.attr("dtype")).cast<std::string>() : "";
  return info;
}

// A sentinel's type (one instance, named `name` in the module): its repr is its name, it is
// truthy, copies are itself, and pickling refers to it by name.
template <typename Sentinel>
py::object bind_sentinel(py::module_& m, const char* type_name, const char* doc, const char* name) {
  py::class_<Sentinel>(m, type_name, doc)
      .def("__repr__", [name](const Sentinel&) { return name; })
      .def("__bool__", [](const Sentinel&) { return true; })
      .def("__copy__", [](const py::object& self) { return self; })
      .def("__deepcopy__", [](const py::object& self, const py::object&) { return self; })
      .def("__reduce__", [name](const Sentinel&) { return name; });
  py::object instance = py::cast(Sentinel{});
  m.attr(name) = instance;
  return instance;
}

}  // namespace

std::string python_type_name(py::handle value) {
  return py::str(py::type::handle_of(value)).cast<std::string>();
}

std::optional<std::int64_t> index_value(py::handle value) {
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

void bind_sentinels(py::module_& m) {
  not_given_object = new py::object(bind_sentinel<NotGivenType>(
      m, "_NotGivenType", "The type of NOT_GIVEN, eformer's 'not supplied' sentinel.",
      "NOT_GIVEN"));
  unconstrained_object = new py::object(bind_sentinel<UnconstrainedType>(
      m, "_UnconstrainedType", "The type of PartitionSpec.UNCONSTRAINED, as in JAX.",
      "UNCONSTRAINED"));
}

sharding::AxisRule to_axis_rule(py::handle value) {
  using sharding::AxisRule;
  if (value.is_none()) return AxisRule();
  if (py::isinstance<py::str>(value)) return AxisRule(value.cast<std::string>());
  if (py::isinstance<py::bool_>(value)) return AxisRule::integer(value.cast<bool>() ? 1 : 0);
  // Python ints and what has __index__ (NumPy's integers); one past int64 is refused by name.
  if (PyIndex_Check(value.ptr()) != 0) {
    const auto v = index_value(value);
    if (!v) {
      throw ValueError("the integer " + py::repr(value).cast<std::string>() +
                       " does not fit an axis value (64 bits)");
    }
    return AxisRule::integer(*v);
  }
  if (py::isinstance<NotGivenType>(value)) return AxisRule(sharding::not_given);
  if (py::isinstance<UnconstrainedType>(value)) return AxisRule::unconstrained();
  const bool is_tuple = py::isinstance<py::tuple>(value);
  if (is_tuple || py::isinstance<py::list>(value)) {
    std::vector<AxisRule> members;
    for (py::handle member : value) members.push_back(to_axis_rule(member));
    return is_tuple ? AxisRule::tuple(std::move(members)) : AxisRule::list(std::move(members));
  }
  throw TypeError(
      "an axis rule is None, a str, an int, NOT_GIVEN, UNCONSTRAINED, or a tuple or "
      "list of those; got " +
      py::repr(value).cast<std::string>() + " of " + python_type_name(value));
}

py::object from_axis_rule(const sharding::AxisRule& rule) {
  using Kind = sharding::AxisRule::Kind;
  switch (rule.kind()) {
    case Kind::kNone:
      return py::none();
    case Kind::kNotGiven:
      return *not_given_object;
    case Kind::kUnconstrained:
      return *unconstrained_object;
    case Kind::kName:
      return py::str(rule.name());
    case Kind::kInt:
      return py::int_(rule.integer_value());
    case Kind::kTuple:
    case Kind::kList: {
      py::list members;
      for (const auto& m : rule.members()) members.append(from_axis_rule(m));
      if (rule.is_list()) return members;
      return py::tuple(members);
    }
  }
  return py::none();
}

py::object from_partition_spec(const sharding::PartitionSpec& spec) {
  py::list entries;
  for (const auto& e : spec) entries.append(from_axis_rule(e));
  return partition_spec_class().attr("_from_canonical")(py::tuple(entries));
}

sharding::Mode to_mode(py::handle value) {
  if (py::isinstance<py::str>(value)) {
    const auto text = value.cast<std::string>();
    for (const auto mode : {sharding::Mode::kTrain, sharding::Mode::kPrefill,
                            sharding::Mode::kDecode, sharding::Mode::kInsert}) {
      if (text == sharding::mode_string(mode)) return mode;
    }
  }
  return sharding::Mode::kTrain;
}

sharding::ModeArg to_mode_arg(py::handle value) {
  if (py::isinstance<py::bool_>(value)) return sharding::ModeArg::from_dim(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) {
    const auto dim = index_value(value);
    // Python's own words for shape[mode] with such an index.
    if (!dim) throw IndexError("cannot fit 'int' into an index-sized integer");
    return sharding::ModeArg::from_dim(*dim);
  }
  return to_mode(value);
}

std::vector<std::int64_t> to_shape(py::handle value) {
  std::vector<std::int64_t> shape;
  const bool sequence = py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value);
  if (sequence) {
    for (py::handle extent : value) {
      // Python ints and whatever has __index__ (NumPy's integers), as a shape tuple holds.
      if (PyIndex_Check(extent.ptr()) == 0 || py::isinstance<py::bool_>(extent)) {
        throw TypeError("a shape is a tuple or list of ints; " +
                        py::repr(value).cast<std::string>() + " holds " +
                        py::repr(extent).cast<std::string>() + " of " + python_type_name(extent));
      }
      const auto v = index_value(extent);
      if (!v) {
        throw ValueError("the extent " + py::repr(extent).cast<std::string>() + " of shape " +
                         py::repr(value).cast<std::string>() + " does not fit 64 bits");
      }
      shape.push_back(*v);
    }
    return shape;
  }
  throw TypeError("a shape is a tuple or list of ints; got " + py::repr(value).cast<std::string>() +
                  " of " + python_type_name(value));
}

sharding::ArrayInfo to_array_info(py::handle x) {
  if (!py::hasattr(x, "shape") || !py::hasattr(x, "dtype")) {
    throw TypeError("Expected array input, got " + python_type_name(x));
  }
  return read_array(x);
}

std::vector<sharding::NamedLeaf> to_named_leaves(py::handle pairs) {
  std::vector<sharding::NamedLeaf> leaves;
  for (py::handle item : pairs) {
    const auto [path, value] = item.cast<std::pair<std::string, py::object>>();
    sharding::NamedLeaf leaf{path, std::nullopt};
    if (py::hasattr(value, "shape")) leaf.array = read_array(value);
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

}  // namespace numesh::python
