#pragma once

#include <stdexcept>
#include <string>
#include <utility>

/// numesh's error types. Everything numesh throws derives from numesh::Error, so callers can
/// catch one type. The sharding layer mirrors eformer's Python exceptions one to one, so that
/// a config that fails in eformer fails here with the same class of error and, wherever the
/// text does not depend on Python object reprs, the same message (docs/eformer-compat.md has
/// the table).
namespace numesh {

/// Base class of every error numesh throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A value that cannot be used: an unknown semantic axis, a bad mode, an unparsable mesh
/// string, a partition spec with a nested tuple. eformer: ValueError.
class ValueError : public Error {
 public:
  using Error::Error;
};

/// An argument of the wrong kind: a manager built from something that is not a PartitionAxis,
/// an unsupported sharding type, dynamic axes given as None. eformer: TypeError and
/// AttributeError.
class TypeError : public Error {
 public:
  using Error::Error;
};

/// A lookup of a name that does not exist, most often a mesh axis missing from the mesh.
/// eformer: KeyError. `key()` is the missing key (what Python puts in `args[0]`); `what()` is
/// a full sentence that names the key and where it was looked up.
class KeyError : public Error {
 public:
  KeyError(std::string key, const std::string& message) : Error(message), key_(std::move(key)) {}
  /// The key that was not found.
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// An index outside a sequence: a dimension index past the rank. eformer: IndexError.
class IndexError : public Error {
 public:
  using Error::Error;
};

/// A partition spec that maps one mesh axis to more than one tensor dimension (or twice
/// inside one dimension). JAX: DuplicateSpecError.
class DuplicateSpecError : public Error {
 public:
  using Error::Error;
};

/// An operation that needs a mesh found none: no mesh scope is active and none was passed.
/// eformer: AssertionError("No mesh found under this context manager.").
class NoMeshError : public Error {
 public:
  using Error::Error;
};

/// A feature eformer or EasyDeL advertise but do not implement (attention layout "thd").
/// eformer: NotImplementedError.
class NotImplementedError : public Error {
 public:
  using Error::Error;
};

/// A tensor rank or extent that does not fit the operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// The machine cannot provide what was asked: an hwloc call failed, a binding is impossible.
class TopologyError : public Error {
 public:
  using Error::Error;
};

/// A file could not be opened, read or written (a missing weight file, a truncated .npy, a
/// directory that is not writable). The message names the file.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A run of a compiled graph was cancelled by its caller (CompiledGraph::cancel()) before it
/// completed. The graph can run again.
class CancelledError : public Error {
 public:
  using Error::Error;
};

/// A run stopped because another rank's run had stopped (a node failed there, or that run was
/// cancelled) before it sent what this one needed. The rank that stopped first reports its own
/// error; this one names the rank it heard it from.
class PeerStoppedError : public CancelledError {
 public:
  using CancelledError::CancelledError;
};

/// A rank of the run did not answer in time: a transfer waited longer than the transport's
/// patience for its peer (runtime/transport.hpp), which has most likely hung.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// Thrown by the node that CompiledGraph::inject_fault armed, in place of its body: a fault put
/// there on purpose, to test how a run fails, cancels the other devices and runs again.
class InjectedFault : public Error {
 public:
  using Error::Error;
};

}  // namespace numesh
