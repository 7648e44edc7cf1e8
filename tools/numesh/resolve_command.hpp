#pragma once

// `numesh resolve`: semantic axes -> resolved spec -> corrected spec -> per-device layout.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace numesh::tools {

/// The options of `numesh resolve`, as given on the command line (parsed lazily by
/// run_resolve, so that every bad value is reported as a numesh::Error naming it).
struct ResolveOptions {
  std::string axes;                      ///< --axes, e.g. "batch,(fsdp,sp),tp".
  std::string preset;                    ///< --preset, e.g. "ColumnWise".
  std::string mode;                      ///< --mode; empty: train (or the preset's own mode).
  std::string paxis_json;                ///< --paxis-json FILE.
  std::vector<std::string> sets;         ///< --set field=value, in order.
  std::string mesh_dims = "1,-1,1,1,1";  ///< --mesh-dims.
  std::string mesh_names = "dp,fsdp,ep,tp,sp";  ///< --mesh-names.
  std::optional<std::int64_t> devices;          ///< --devices.
  std::string shape;                            ///< --shape; empty: no correction or layout.
  std::int64_t itemsize = 4;                    ///< --itemsize (bytes per element).
  bool json = false;                            ///< --json.
};

/// Registers the `resolve` subcommand on `app`, writing into `options`. Not thread-safe (CLI11
/// setup).
CLI::App* add_resolve_command(CLI::App& app, ResolveOptions& options);

/// Runs `numesh resolve` and writes its report (text or JSON) to `out`.
/// Throws: numesh::Error (every subclass) for bad input, with a message naming the value.
void run_resolve(const ResolveOptions& options, std::ostream& out);

}  // namespace numesh::tools
