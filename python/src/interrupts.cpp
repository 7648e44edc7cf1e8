#include "interrupts.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace py = pybind11;

namespace numesh::python {

namespace {

constexpr const char* kNote =
    "numesh cancelled the call's graphs where they were: nothing it holds is left half-done "
    "(the next call starts afresh; a training step stops before its update or completes it)";

// The process's watcher: a pipe that Python's signal handler writes each signal's number to
// while a CtrlCWatch is alive, and a thread blocked on it that cancels the armed source on
// SIGINT and passes every byte on to the descriptor the watch replaced. Made once per process
// (again in a forked child, which has the memory but not the thread) and never destroyed: the
// thread sleeps in poll() for the life of the process, costing nothing between signals, where a
// thread per call cost ~0.25 ms a call (its start and its join, on cores the devices keep busy).
class Watcher {
 public:
  // The process's watcher, or nullptr when no pipe or thread could be made (Ctrl-C then acts
  // after the call). Requires the GIL, which also orders the first calls.
  static Watcher* get() {
    static Watcher* made = nullptr;
    static pid_t made_in = 0;
    if (made == nullptr || made_in != ::getpid()) {
      made = make();  // a forked child's inherited one has no thread: leaked, as is the parent's
      made_in = ::getpid();
    }
    return made;
  }

  int write_fd() const noexcept { return write_fd_; }

  // Arms `armed` (a null source: none); returns what was armed before. The bytes the pipe
  // holds first go to the target armed until now (a signal that came during its call is its
  // own, however late the watcher thread would have read it).
  SigintTarget arm(SigintTarget armed) {
    const std::lock_guard lock(mutex_);
    take_bytes();
    return std::exchange(armed_, armed);
  }
  // Arms `source` for a watch that replaced Python's wakeup descriptor `replaced`: bytes go on
  // to it, or, when it is the watcher's own (a watch nested in another), to where the outer
  // watch sent them. Returns what was armed before.
  SigintTarget arm_watch(runtime::CancelSource& source, int replaced) {
    const std::lock_guard lock(mutex_);
    take_bytes();
    const int forward = replaced == write_fd_ ? armed_.forward_fd : replaced;
    return std::exchange(armed_, SigintTarget{&source, forward});
  }

 private:
  Watcher(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

  static Watcher* make() {
    int fds[2];
    // Non-blocking, as Python requires of a wakeup descriptor: its C handler writes from the
    // signal and must never wait.
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return nullptr;
    auto* w = new Watcher(fds[0], fds[1]);
    try {
      std::thread([w] { w->watch(); }).detach();
    } catch (const std::system_error&) {
      ::close(fds[0]);
      ::close(fds[1]);
      delete w;
      return nullptr;
    }
    return w;
  }

  void watch() noexcept {
    for (;;) {
      pollfd readable{read_fd_, POLLIN, 0};
      if (::poll(&readable, 1, -1) < 0) continue;  // EINTR
      const std::lock_guard lock(mutex_);
      take_bytes();
    }
  }

  // Reads every byte the pipe holds (it is non-blocking) and acts on each for armed_. Under
  // mutex_: a byte is read and acted on while one target is armed, by the watcher thread or by
  // arm(), never read under one and acted on under the next.
  void take_bytes() noexcept {
    unsigned char bytes[64];
    for (ssize_t n; (n = ::read(read_fd_, bytes, sizeof bytes)) > 0;) {
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] == SIGINT && armed_.source != nullptr) armed_.source->cancel();
        // Whoever had the descriptor before (an asyncio loop) still hears of the signal.
        if (armed_.forward_fd >= 0 && ::write(armed_.forward_fd, &bytes[i], 1) != 1) {
          // Full or closed: as Python's own handler, drop the byte rather than wait.
        }
      }
    }
  }

  const int read_fd_, write_fd_;
  std::mutex mutex_;  // over armed_: a watch ends only when no cancel of it is under way
  SigintTarget armed_;
};

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
  Watcher* watcher = Watcher::get();
  if (watcher == nullptr) return;
  try {
    replaced_fd_ = set_wakeup_fd(watcher->write_fd());
  } catch (const py::error_already_set&) {
    return;  // refused: Ctrl-C acts after the call
  }
  outer_ = watcher->arm_watch(source_, replaced_fd_);
  active_ = true;
}

CtrlCWatch::~CtrlCWatch() {
  if (!active_) return;
  Watcher* watcher = Watcher::get();
  // Python's descriptor back first, then the outer watch (or none) armed again: once arm()
  // returns, no cancel of this watch's source is under way or to come.
  try {
    set_wakeup_fd(replaced_fd_);
  } catch (const py::error_already_set&) {
    try {
      set_wakeup_fd(-1);  // refused (closed meanwhile): none rather than a stale one
    } catch (const py::error_already_set&) {
      // Python refuses even "none": nothing more can be done from here.
    }
  }
  watcher->arm(outer_);
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
