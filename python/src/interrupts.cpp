#include "interrupts.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <system_error>

namespace py = pybind11;

namespace numesh::python {

namespace {

// The byte the watcher takes as "stop": no signal has number 0.
constexpr unsigned char kStopByte = 0;

constexpr const char* kNote =
    "numesh cancelled the call's graphs where they were: nothing it holds is left half-done "
    "(the next call starts afresh; a training step stops before its update or completes it)";

// signal.set_wakeup_fd(fd) (its C form, PySignal_SetWakeupFd, is not exported by Debian's
// python3): the descriptor it replaces. Throws py::error_already_set when Python refuses fd.
int set_wakeup_fd(int fd) {
  return py::module_::import("signal").attr("set_wakeup_fd")(fd).cast<int>();
}

bool on_main_thread_with_default_sigint() {
  const py::module_ threading = py::module_::import("threading");
  if (!threading.attr("current_thread")().is(threading.attr("main_thread")())) return false;
  const py::module_ signal = py::module_::import("signal");
  return signal.attr("getsignal")(SIGINT).is(signal.attr("default_int_handler"));
}

// BaseException.add_note from Python 3.11; before it, the same list by hand (read by the test
// and by code that looks for notes, though older tracebacks do not print it).
void add_note(const py::handle error, const char* note) {
  try {
    if (py::hasattr(error, "add_note")) {
      error.attr("add_note")(note);
      return;
    }
    if (!py::hasattr(error, "__notes__")) error.attr("__notes__") = py::list();
    error.attr("__notes__").attr("append")(note);
  } catch (const py::error_already_set&) {
    // An exception type that takes no attributes: raised without the note.
  }
}

}  // namespace

CtrlCWatch::CtrlCWatch() {
  if (!on_main_thread_with_default_sigint()) return;
  int fds[2];
  // Non-blocking, as Python requires of a wakeup descriptor: its C handler writes from the
  // signal and must never wait.
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return;  // no pipe: Ctrl-C acts after the call
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  try {
    // Before the descriptor is swapped: if the thread cannot start, Python's is untouched.
    watcher_ = std::thread([this] { watch(); });
  } catch (const std::system_error&) {
    return;  // no thread: Ctrl-C acts after the call
  }
  try {
    replaced_fd_ = set_wakeup_fd(write_fd_);
  } catch (const py::error_already_set&) {
    stop_watcher();  // refused (a closed descriptor?): Ctrl-C acts after the call
  }
}

CtrlCWatch::~CtrlCWatch() {
  if (active()) {
    // Give Python back its descriptor first, so that no signal's byte comes after the stop;
    // if it is refused (closed meanwhile), none, rather than ours that is about to close.
    try {
      set_wakeup_fd(replaced_fd_);
    } catch (const py::error_already_set&) {
      try {
        set_wakeup_fd(-1);
      } catch (const py::error_already_set&) {
        // Python refuses even "none": nothing more can be done from here.
      }
    }
    stop_watcher();
  }
  if (read_fd_ >= 0) ::close(read_fd_);
  if (write_fd_ >= 0) ::close(write_fd_);
}

void CtrlCWatch::stop_watcher() noexcept {
  for (;;) {
    if (::write(write_fd_, &kStopByte, 1) == 1) break;
    pollfd writable{write_fd_, POLLOUT, 0};  // full: the watcher is draining it
    ::poll(&writable, 1, 100);
  }
  watcher_.join();
}

void CtrlCWatch::watch() noexcept {
  for (;;) {
    pollfd readable{read_fd_, POLLIN, 0};
    if (::poll(&readable, 1, -1) < 0) continue;  // EINTR
    unsigned char bytes[64];
    const ssize_t n = ::read(read_fd_, bytes, sizeof bytes);
    for (ssize_t i = 0; i < n; ++i) {
      if (bytes[i] == kStopByte) return;
      if (bytes[i] == SIGINT) source_.cancel();
      // Whoever had the descriptor before (an asyncio loop) still hears of the signal.
      if (replaced_fd_ >= 0 && ::write(replaced_fd_, &bytes[i], 1) != 1) {
        // Full or closed: as Python's own handler, drop the byte rather than wait.
      }
    }
  }
}

void CtrlCWatch::raise_pending_signal() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

void CtrlCWatch::raise_cancelled() {
  if (PyErr_CheckSignals() == 0) PyErr_SetNone(PyExc_KeyboardInterrupt);
  py::error_already_set raised;  // fetched and normalized: value() is the exception
  add_note(raised.value(), kNote);
  throw raised;
}

}  // namespace numesh::python
