#pragma once

// An environment variable set for one scope, for tests of what the environment switches
// (NUMESH_SHARED_MEMORY, HWLOC_XMLFILE...): the tests leave the process's environment as they
// found it.

#include <cstdlib>
#include <optional>
#include <string>

namespace numesh::runtime::testing {

/// Sets `name` to `value` until the end of the scope, then restores its value before (or unsets
/// it). Not thread-safe: set it before the threads that read the environment start.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;
  ~ScopedEnvironment() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace numesh::runtime::testing
