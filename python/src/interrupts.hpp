#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "numesh/core/error.hpp"
#include "numesh/runtime/cancellation.hpp"

namespace numesh::python {

/// What Ctrl-C cancels (nothing when null), and the descriptor each signal's byte is passed on
/// to (none when negative).
struct SigintTarget {
  runtime::CancelSource* source = nullptr;
  int forward_fd = -1;
};

/// Ctrl-C during a call that computes with the GIL released. Python's own SIGINT handler only
/// sets a flag that the main thread reads when it next runs Python code, which a long graph
/// would not let it do until the graph ended; so, while alive, this routes Python's signal
/// wakeup file descriptor (signal.set_wakeup_fd) to the pipe of a watcher thread (one for the
/// process, made on first use and blocked in poll() between signals), which cancels `source()`
/// when SIGINT's byte arrives and passes each byte on to the descriptor this replaced (an
/// asyncio loop's, say). Python's handler still runs as it always does: the call then raises
/// its KeyboardInterrupt.
///
/// Active only on Python's main thread (the only one a KeyboardInterrupt reaches) and while
/// SIGINT's handler is Python's default (a program's own handler decides for itself what
/// Ctrl-C means; it runs when the call returns). Watches nest: the innermost is cancelled.
/// Requires the GIL to construct and destroy.
class CtrlCWatch {
 public:
  CtrlCWatch();
  ~CtrlCWatch();
  CtrlCWatch(const CtrlCWatch&) = delete;
  CtrlCWatch& operator=(const CtrlCWatch&) = delete;

  /// What SIGINT cancels.
  runtime::CancelSource& source() noexcept { return source_; }

  /// Raises the pending KeyboardInterrupt (or whatever SIGINT's handler raises) as
  /// py::error_already_set when a signal is pending; otherwise returns. Requires the GIL.
  static void raise_pending_signal();
  /// After source() cancelled the call: raises the pending KeyboardInterrupt, or a new one when
  /// the signal was handled elsewhere meanwhile (only SIGINT cancels the source), with a note
  /// saying that numesh stopped the call. Requires the GIL.
  [[noreturn]] static void raise_cancelled();

 private:
  runtime::CancelSource source_;
  bool active_ = false;   // Ctrl-C reaches source() (see the class comment)
  SigintTarget outer_;    // what was armed before (the watch this one nests in), armed after
  int replaced_fd_ = -1;  // the wakeup descriptor before, restored after
};

/// Runs `work` (which returns nothing; it stores what it makes) with the GIL released, under a
/// CancelScope that Ctrl-C cancels (CtrlCWatch): a graph that is running stops where it is, and
/// the call raises KeyboardInterrupt with a note saying so. A Ctrl-C pending when the call
/// starts raises before any work, and one that comes as the work completes raises after it, as
/// Python would between two statements. Requires the GIL; `work` must not touch Python objects
/// (or must take the GIL and a runtime::CancelShield to, see bind_models.cpp's generate).
template <class Work>
void run_interruptible(Work&& work) {
  CtrlCWatch watch;
  CtrlCWatch::raise_pending_signal();
  try {
    {
      const pybind11::gil_scoped_release release;
      const runtime::CancelScope scope(watch.source());
      std::forward<Work>(work)();
    }
    CtrlCWatch::raise_pending_signal();
  } catch (const CancelledError&) {
    if (!watch.source().cancelled()) throw;  // not ours (none is, today): as it is
    CtrlCWatch::raise_cancelled();
  }
}

}  // namespace numesh::python
