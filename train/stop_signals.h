// SIGTERM and SIGINT, taken by a thread of their own.
//
// main() blocks both before any other thread starts, so MPI's, OpenMP's and
// oneDNN's threads inherit the mask and no compute thread is ever interrupted
// by them (a SIGINT that landed inside oneDNN's JIT-compiled sgemm corrupted
// the heap). One thread waits for them with sigwait. Until the trainer defers
// them, a signal ends the process as it would without tpsp; after, the first
// only asks the run to stop (stop_signal_caught), and a second of the same
// kind ends the process at once.
#pragma once

namespace tpsp {

void take_stop_signals_on_their_own_thread();  // main(), before any other thread starts
void defer_stop_signals();                     // the trainer, before step 1
int stop_signal_caught();                      // 0, SIGTERM or SIGINT

}  // namespace tpsp
