// fuzz_replay: runs fuzz targets' entry points on saved inputs without libFuzzer, so that every
// build with tests (gcc's included) replays each target's corpus, the regression-* inputs of
// past findings first among them, as a CTest test (fuzz_replay_<target>).
//
//   fuzz_replay TARGET PATH...   each PATH a file, or a folder whose files are replayed
//
// Each target's source is compiled into this program with its LLVMFuzzerTestOneInput renamed
// to numesh_fuzz_<target> (fuzz/CMakeLists.txt), and fuzz_targets.inc lists them. An input
// passes when the entry point returns: a parser's clear numesh::Error is caught there; any
// other exception, an abort or a crash fails the test, naming the input first.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#define NUMESH_FUZZ_TARGET(name) \
  extern "C" int numesh_fuzz_##name(const std::uint8_t* data, std::size_t size);
#include "fuzz_targets.inc"
#undef NUMESH_FUZZ_TARGET

namespace {

struct Target {
  std::string_view name;
  int (*run)(const std::uint8_t*, std::size_t);
};

const Target kTargets[] = {
#define NUMESH_FUZZ_TARGET(name) {#name, &numesh_fuzz_##name},
#include "fuzz_targets.inc"
#undef NUMESH_FUZZ_TARGET
};

// The files of `path` (itself when a file), sorted so that every run replays in one order.
std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& path) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(path)) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) out.push_back(entry.path());
    }
  } else if (std::filesystem::is_regular_file(path)) {
    out.push_back(path);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string names;
  for (const Target& t : kTargets)
    names += std::string(names.empty() ? "" : ", ") + std::string(t.name);
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...\ntargets: %s\n", names.c_str());
    return 2;
  }
  const std::string_view wanted = argv[1];
  const auto target = std::find_if(std::begin(kTargets), std::end(kTargets),
                                   [&](const Target& t) { return t.name == wanted; });
  if (target == std::end(kTargets)) {
    std::fprintf(stderr, "fuzz_replay: no target '%s' (there are: %s)\n", argv[1], names.c_str());
    return 2;
  }
  std::size_t count = 0;
  for (int a = 2; a < argc; ++a) {
    const std::vector<std::filesystem::path> files = inputs_of(argv[a]);
    if (files.empty()) {
      std::fprintf(stderr, "fuzz_replay: %s holds no input\n", argv[a]);
      return 2;
    }
    for (const std::filesystem::path& file : files) {
      std::ifstream in(file, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      if (!in.eof() && in.fail()) {
        std::fprintf(stderr, "fuzz_replay: cannot read %s\n", file.c_str());
        return 2;
      }
      // Printed before the run: a crash leaves the input's name as the last line.
      std::printf("%s: %s (%zu bytes)\n", argv[1], file.c_str(), bytes.size());
      std::fflush(stdout);
      target->run(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++count;
    }
  }
  std::printf("fuzz_replay: %zu inputs of %s ran clean\n", count, argv[1]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fuzz_replay: FAILED: %s escaped the target\n", e.what());
  return 1;
}
