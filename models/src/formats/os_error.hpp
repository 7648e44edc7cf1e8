#pragma once

// The text of an errno value, for the file formats' I/O errors: private to numesh::models.

#include <string>
#include <system_error>

namespace numesh::models::detail {

/// strerror's text of `err`, thread-safe.
inline std::string os_error(int err) { return std::generic_category().message(err); }

}  // namespace numesh::models::detail
