// Fuzzes the .npy reader (models/formats/npy.hpp): arbitrary bytes as a file, read as fp32 values
// and as token ids. Beyond "a numesh::Error or nothing": what load_npy accepts has as many values
// as its shape says, and survives save_npy and a second load_npy bit for bit.

#include <cstdlib>
#include <cstring>

#include "fuzz_target.hpp"
#include "numesh/models/formats/npy.hpp"
#include "numesh/runtime/tensor.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace numesh;
  const auto file = fuzz::scratch().write("input.npy", {data, size});
  fuzz::expect_clear_error_only([&] {
    const runtime::HostTensor t = models::load_npy(file);
    if (t.data.size() != static_cast<std::size_t>(runtime::num_elements(t.shape))) std::abort();
    const auto copy = fuzz::scratch().path() / "copy.npy";
    models::save_npy(copy, t);
    const runtime::HostTensor back = models::load_npy(copy);
    if (back.shape != t.shape || back.data.size() != t.data.size() ||
        (!t.data.empty() &&
         std::memcmp(back.data.data(), t.data.data(), t.data.size() * sizeof(float)) != 0)) {
      std::abort();
    }
  });
  fuzz::expect_clear_error_only([&] {
    const models::NpyIds ids = models::load_npy_ids(file);
    if (ids.values.size() != static_cast<std::size_t>(runtime::num_elements(ids.shape)))
      std::abort();
  });
  return 0;
}
