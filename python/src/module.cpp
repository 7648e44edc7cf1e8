#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "bindings.hpp"
#include "conversions.hpp"

// The only PYBIND11_MODULE: numesh._numesh, the C++ half of the numesh package. The package
// (python/numesh/) adds what is Python's alone: PartitionSpec as a tuple, the `with` of
// PartitionManager and Mesh, the presets as classes.
PYBIND11_MODULE(_numesh, m) {
  m.doc() = "numesh's C++ core; import numesh, not this module.";
  numesh::python::bind_sentinels(m);
  numesh::python::bind_errors(m);
  numesh::python::bind_sharding(m);
  numesh::python::bind_rules(m);
  numesh::python::bind_easydel(m);
  numesh::python::bind_runtime(m);
  numesh::python::bind_models(m);
  numesh::python::bind_training(m);
  numesh::python::bind_ops(m);
  numesh::python::bind_serve(m);
  numesh::python::bind_arrays(m);
}
