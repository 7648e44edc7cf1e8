// mpi_world() in a program that initialises and finalises MPI itself, run by CTest under
// `mpirun -np 2` (no GoogleTest: each check prints what failed, and the exit code is the
// verdict). This is the one test that includes mpi.h: it plays the program.
//   multiple:   MPI_Init_thread(MPI_THREAD_MULTIPLE), mpi_world(), a receive that no rank
//               sends to, then MPI_Finalize: the transport closes there and the receive ends
//               with CancelledError; a send after that is refused with CancelledError.
//   serialized: MPI_Init_thread(MPI_THREAD_SERIALIZED): mpi_world() refuses, naming the level.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "numesh/core/error.hpp"
#include "numesh/runtime/transport.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

std::string message_of(const std::exception_ptr& error) {
  if (!error) return "(no error)";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

int run_multiple() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "FAILED: this MPI gives thread level %d, not MPI_THREAD_MULTIPLE\n",
                 provided);
    MPI_Finalize();
    return 1;
  }
  auto world = numesh::runtime::mpi_world();
  expect(world->size() == 2, "the test runs on 2 ranks");
  const int peer = 1 - world->rank();
  std::vector<std::byte> into(16);
  auto promise = std::make_shared<std::promise<std::exception_ptr>>();
  auto outcome = promise->get_future();
  world->recv(peer, 7, into, [promise](std::exception_ptr e) { promise->set_value(e); });
  world->barrier();
  MPI_Finalize();  // deletes MPI_COMM_SELF's attributes first: the transport closes
  expect(outcome.wait_for(std::chrono::seconds(0)) == std::future_status::ready,
         "the pending receive completed when MPI was finalised");
  const std::string got = message_of(outcome.get());
  expect(got == "recv from rank " + std::to_string(peer) +
                    ", tag 7: the MPI transport closed before the transfer completed",
         "the pending receive ends with the transport's closing: " + got);
  const std::byte b{1};
  try {
    world->send(peer, 7, {&b, 1}, [](std::exception_ptr) {});
    expect(false, "a send after MPI_Finalize is refused");
  } catch (const numesh::CancelledError& e) {
    expect(std::string_view(e.what()) ==
               "send to rank " + std::to_string(peer) + ", tag 7: the MPI transport is closed",
           std::string("the refusal names the transfer: ") + e.what());
  }
  return failures == 0 ? 0 : 1;
}

int run_serialized() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  try {
    numesh::runtime::mpi_world();
    expect(provided >= MPI_THREAD_MULTIPLE, "mpi_world() refuses a program's SERIALIZED MPI");
  } catch (const numesh::Error& e) {
    expect(
        std::string_view(e.what()).find(
            "where the transport's progress thread needs " + std::to_string(MPI_THREAD_MULTIPLE) +
            " (MPI_THREAD_MULTIPLE: the program initialised MPI and may call it alongside)") !=
            std::string_view::npos,
        std::string("the refusal names the level: ") + e.what());
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode == "multiple") return run_multiple();
  if (mode == "serialized") return run_serialized();
  std::fprintf(stderr, "usage: transport_mpi_program_test multiple|serialized\n");
  return 2;
}
