#pragma once

// PRIVATE to models/src: how the model writers (safetensors, GGUF) put a file in place. Never
// over the old file's bytes: a process that reads a model's weights in place from its mapping
// (a server, WeightMapping) would see them change under it, or fault past a shortened end.

#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace numesh::models::detail {

/// Writes `file` by calling `write` on a temporary file beside it ("<file>.<pid>.partial"),
/// flushes it to the disk and renames it over `file`: a reader sees the old file or the new one
/// whole, and whoever has the old one mapped keeps its bytes. The stream goes to the file in
/// whole chunks of 8 MiB, whatever pieces `write` gives it (a flush of it writes nothing), so
/// that the page cache holds the new file in its largest folios (read and mapped at memory
/// speed). A `file` that is a symlink keeps being one: the file it names is replaced. The new
/// file takes the old one's permissions. The temporary is removed when anything fails.
/// `what` starts every message ("gguf", "safetensors").
/// Throws: IoError "<what>: cannot write '<file>'" when the temporary cannot be created,
/// "<what>: writing '<file>' failed (<the OS's error>)" when a write or the flush fails (without
/// the reason when `write` left the stream failed itself),
/// "<what>: cannot rename '<temporary>' to '<file>': <reason>"; what `write` throws.
void write_replacing(const std::filesystem::path& file, std::string_view what,
                     const std::function<void(std::ostream& out)>& write);

}  // namespace numesh::models::detail
