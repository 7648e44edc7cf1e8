// The serving engine's steady step allocates nothing: once every program is compiled and the
// running sequences hold their blocks, Engine::step() (schedule, ragged batch, model, picks)
// makes no heap allocation of its own. Counted by replacing the global operator new for this
// binary alone (oneTBB's task allocation, through its own allocator, is not counted; the
// runtime's graph runs allocate nothing of theirs).

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <new>
#include <vector>

#include "check_mesh.hpp"
#include "numesh/models/engine/engine.hpp"
#include "small_llama.hpp"

namespace {

std::atomic<bool> g_armed{false};
std::atomic<long> g_allocations{0};
// NUMESH_ALLOC_TRAP=1 raises SIGTRAP at the first counted allocation: run the test under gdb
// to see where it comes from.
const bool g_trap = std::getenv("NUMESH_ALLOC_TRAP") != nullptr;

void* counted(std::size_t bytes) {
  if (g_armed.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (g_trap) std::raise(SIGTRAP);
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}

void* counted_aligned(std::size_t bytes, std::align_val_t align) {
  if (g_armed.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (g_trap) std::raise(SIGTRAP);
  }
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}

}  // namespace

// The replaced global allocation functions (this binary only).
void* operator new(std::size_t bytes) { return counted(bytes); }
void* operator new[](std::size_t bytes) { return counted(bytes); }
void* operator new(std::size_t bytes, std::align_val_t a) { return counted_aligned(bytes, a); }
void* operator new[](std::size_t bytes, std::align_val_t a) { return counted_aligned(bytes, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace numesh::models {
namespace {

// Allocations made by `f` on any thread while it runs.
template <class F>
long allocations_during(F&& f) {
  g_allocations = 0;
  g_armed = true;
  f();
  g_armed = false;
  return g_allocations.load();
}

TEST(SteadyStepTest, TheCounterCountsAnAllocation) {
  EXPECT_EQ(allocations_during([] { std::vector<int> v(10); }), 1);
}

TEST(SteadyStepTest, DecodeStepsOfRunningSequencesAllocateNothing) {
  const testing::ScratchDir dir;
  testing::write_small_llama(dir);
  for (const int devices : {1, 2}) {
    Engine engine = Engine::load(
        ModelSource::open(dir.path()), testing::mesh_of(devices, {"tp"}),
        {.context = 256, .serving = ServingOptions{.kv_tokens = 1024, .max_running = 4}});
    // Four sequences, greedy and seeded sampling, long enough to decode through the test.
    for (int i = 0; i < 4; ++i) {
      RequestOptions o;
      o.max_new_tokens = 200;
      if (i % 2 == 1) o.sampling = ops::SamplingOptions{0.8, 20, 0.95};
      o.seed = static_cast<std::uint64_t>(i);
      ASSERT_TRUE(engine.submit({1, 2, 3, static_cast<std::int32_t>(10 + i)}, o));
    }
    // Prefill and a few decode steps (each thread's first use of its scratch), then 64 steps
    // of decoding, which grow every sequence by four blocks of 16 tokens and publish the full
    // ones to the prefix cache.
    for (int s = 0; s < 4; ++s) engine.step();
    long steps = 0, decoded = 0;
    const long made = allocations_during([&] {
      for (; steps < 64; ++steps) decoded += engine.step().decode_tokens;
    });
    EXPECT_EQ(decoded, 4 * 64);
    EXPECT_GE(engine.scheduler().pool().cached_blocks(), 4 * 4);
    EXPECT_EQ(made, 0) << made << " allocations in " << steps << " steps on " << devices
                       << " device(s)";
  }
}

}  // namespace
}  // namespace numesh::models
