#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "numesh/sharding/axis_rule.hpp"
#include "numesh/sharding/named_array.hpp"
#include "numesh/sharding/partition_spec.hpp"
#include "numesh/sharding/semantic_axis.hpp"

/// How eformer's dynamically typed values cross into C++ and back. The sharding layer's
/// AxisRule keeps the distinctions Python makes (a tuple is not a list, None is not "",
/// NOT_GIVEN is not None), so each Python value maps to one AxisRule and back to an equal value.
namespace numesh::python {

/// The type of numesh.NOT_GIVEN (eformer's sentinel); one instance exists.
struct NotGivenType {};
/// The type of numesh.PartitionSpec.UNCONSTRAINED (JAX's); one instance exists.
struct UnconstrainedType {};

/// Registers the two sentinel types and their instances on `m` (NOT_GIVEN, UNCONSTRAINED).
/// Called once, by the module's initialisation, before any conversion.
void bind_sentinels(pybind11::module_& m);

/// Python's name of the type of `value`, as str(type(value)) prints it: "<class 'int'>".
[[nodiscard]] std::string python_type_name(pybind11::handle value);

/// `value` as an AxisRule: None, NOT_GIVEN, UNCONSTRAINED, a str, an int (bool included, as
/// Python treats it), or a tuple or list of those. Throws: TypeError naming the Python type of
/// anything else (a float, a dict).
[[nodiscard]] sharding::AxisRule to_axis_rule(pybind11::handle value);
/// The Python value `rule` stands for (the NOT_GIVEN and UNCONSTRAINED singletons included).
[[nodiscard]] pybind11::object from_axis_rule(const sharding::AxisRule& rule);

/// `spec` as a numesh.PartitionSpec (the Python class of python/numesh/partition_spec.py).
[[nodiscard]] pybind11::object from_partition_spec(const sharding::PartitionSpec& spec);

/// eformer's mode argument of resolve_spec and resolve_axis: "__train__", "__prefill__",
/// "__autoregressive__" or "__insert__"; any other object (another string, None, an int)
/// behaves as train there, as in eformer, which only tests for the generation modes.
[[nodiscard]] sharding::Mode to_mode(pybind11::handle value);
/// PartitionManager.resolve's mode: a Python int (bool included; not a NumPy integer, which
/// eformer's isinstance(mode, int) does not take) names the dimension whose extent decides;
/// anything else as to_mode.
[[nodiscard]] sharding::ModeArg to_mode_arg(pybind11::handle value);

/// The value of a Python int or of an object with __index__ (NumPy's integers), or nullopt
/// past int64. Throws: what __index__ raises (TypeError for a float).
[[nodiscard]] std::optional<std::int64_t> index_value(pybind11::handle value);

/// A shape: a sequence of Python ints. Throws: TypeError naming the value otherwise.
[[nodiscard]] std::vector<std::int64_t> to_shape(pybind11::handle value);

/// eformer's array argument: anything with a shape and a dtype (a NumPy array, a JAX or torch
/// array whose dtype NumPy names), read as its shape and str(dtype). Throws: TypeError
/// "Expected array input, got <class ...>" (eformer's) for anything else.
[[nodiscard]] sharding::ArrayInfo to_array_info(pybind11::handle x);

/// The leaves of a pytree as the sharding layer takes them, from (path, leaf) pairs in JAX's
/// order (numesh/pytree.py flattens): a leaf with a `shape` is an array, of dtype str(dtype),
/// or "" when it has none (what counts bytes then raises ValueError "unknown dtype ''"); any
/// other leaf (a Python scalar, a string) has no array, as eformer tells leaves by hasattr
/// "shape". Throws: TypeError for a pair that is not (str, leaf) or a shape that is not ints.
[[nodiscard]] std::vector<sharding::NamedLeaf> to_named_leaves(pybind11::handle pairs);

}  // namespace numesh::python

namespace pybind11::detail {

/// AxisRule arguments and results as plain Python values (to_axis_rule, from_axis_rule).
template <>
struct type_caster<numesh::sharding::AxisRule> {
  PYBIND11_TYPE_CASTER(numesh::sharding::AxisRule, const_name("AxisRule"));
  bool load(handle src, bool /*convert*/) {
    value = numesh::python::to_axis_rule(src);
    return true;
  }
  static handle cast(const numesh::sharding::AxisRule& rule, return_value_policy /*policy*/,
                     handle /*parent*/) {
    return numesh::python::from_axis_rule(rule).release();
  }
};

/// PartitionSpec arguments from any tuple or list of entries (a numesh.PartitionSpec is a
/// tuple), canonicalised as P(*entries); results as numesh.PartitionSpec.
template <>
struct type_caster<numesh::sharding::PartitionSpec> {
  PYBIND11_TYPE_CASTER(numesh::sharding::PartitionSpec, const_name("PartitionSpec"));
  bool load(handle src, bool /*convert*/) {
    if (!isinstance<tuple>(src) && !isinstance<list>(src)) return false;
    std::vector<numesh::sharding::AxisRule> entries;
    for (handle entry : src) entries.push_back(numesh::python::to_axis_rule(entry));
    value = numesh::sharding::PartitionSpec(std::move(entries));
    return true;
  }
  static handle cast(const numesh::sharding::PartitionSpec& spec, return_value_policy /*policy*/,
                     handle /*parent*/) {
    return numesh::python::from_partition_spec(spec).release();
  }
};

}  // namespace pybind11::detail
