#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "numesh/core/error.hpp"

namespace py = pybind11;

namespace numesh::python {

// numesh's errors as the Python exceptions eformer raises (core/error.hpp mirrors them one to
// one): ValueError, TypeError, IndexError and NotImplementedError keep their names, KeyError
// carries the missing key as args[0] (what eformer's messages compare), NoMeshError is the
// AssertionError eformer's assert raises, and DuplicateSpecError is JAX's own class (an
// Exception, not a ValueError). ShapeError is also a ValueError and IoError an OSError. Every
// other numesh error is a numesh.Error, and a failed cast of a Python value a TypeError.
void bind_errors(py::module_& m) {
  // Registered first, so tried last: pybind11 tries translators newest first. Never freed: a
  // Python object must not be released after the interpreter has gone (a static would be).
  static auto* error = new py::exception<Error>(m, "Error");
  static auto* duplicate_spec =
      new py::exception<DuplicateSpecError>(m, "DuplicateSpecError", PyExc_Exception);
  // A bad shape is a ValueError and a file that cannot be read an OSError to Python code, and
  // both are numesh.Errors: classes of two bases, which py::exception cannot make.
  const auto both = [&](const char* name, PyObject* builtin, const char* doc) {
    const py::object type = py::module_::import("builtins").attr("type");
    auto* made =
        new py::object(type(name, py::make_tuple(*error, py::handle(builtin)),
                            py::dict(py::arg("__module__") = "numesh", py::arg("__doc__") = doc)));
    m.attr(name) = *made;
    return made;
  };
  static auto* shape_error =
      both("ShapeError", PyExc_ValueError, "An array or tensor of the wrong shape or rank.");
  static auto* io_error =
      both("IoError", PyExc_OSError, "A file numesh could not read or write, or a malformed one.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KeyError& e) {
      PyErr_SetObject(PyExc_KeyError, py::str(e.key()).ptr());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const NoMeshError& e) {
      PyErr_SetString(PyExc_AssertionError, e.what());
    } catch (const ShapeError& e) {
      PyErr_SetString(shape_error->ptr(), e.what());
    } catch (const IoError& e) {
      PyErr_SetString(io_error->ptr(), e.what());
    } catch (const DuplicateSpecError& e) {
      PyErr_SetString(duplicate_spec->ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(error->ptr(), e.what());
    } catch (const py::cast_error& e) {
      // A value of the wrong type met deep in a conversion: what Python calls a TypeError
      // (pybind11 alone would raise RuntimeError).
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
}

}  // namespace numesh::python
