#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "conversions.hpp"
#include "numesh/sharding/easydel.hpp"
#include "numesh/sharding/partition_manager.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace numesh::python {

void bind_easydel(py::module_& m) {
  // numesh.easydel wraps it: the Python manager passes its C++ half.
  m.def(
      "_easydel_get_shardings",
      [](const sharding::PartitionManager& pm, const py::object& mode, const std::string& layout,
         bool qkv_mni_sharding, std::optional<std::size_t> softmax_aux_rank) {
        const auto r = sharding::easydel::get_shardings(pm, to_mode_arg(mode), layout,
                                                        qkv_mni_sharding, softmax_aux_rank);
        py::dict out;
        out["query3d"] = r.query3d;
        out["query"] = r.query;
        out["key"] = r.key;
        out["value"] = r.value;
        out["bias"] = r.bias;
        out["mask"] = r.mask;
        out["output"] = r.output;
        out["q_segment_ids"] = r.q_segment_ids;
        out["kv_segment_ids"] = r.kv_segment_ids;
        out["softmax_aux"] = r.softmax_aux ? py::cast(*r.softmax_aux) : py::object(py::none());
        return out;
      },
      "partition_manager"_a, "mode"_a, "layout"_a, "qkv_mni_sharding"_a, "softmax_aux_rank"_a);
}

}  // namespace numesh::python
