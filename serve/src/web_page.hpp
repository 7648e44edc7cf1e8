#pragma once

#include <string_view>

// The page for people that GET / answers with: serve/web/index.html (a chat with the model, its
// tokens streamed, and the server's load), embedded in the binary at configure time. CMake
// generates web_page.cpp, the definitions, in the build tree (serve/web/embed_page.cmake), so an
// edit of the page needs no step of its own and the binary needs no file beside it.

namespace numesh::serve {

/// The page's HTML (UTF-8) as serve/web/index.html was when CMake last configured; valid for the
/// whole run.
std::string_view web_page();

/// The Content-Security-Policy to serve the page with: everything from the same origin only,
/// and no script or style but the page's own inline ones (allowed by their SHA-256 hashes).
std::string_view web_page_policy();

}  // namespace numesh::serve
