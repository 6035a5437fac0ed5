#include "train/stop_signals.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace tpsp {

static std::atomic<int> caught{0};
static std::atomic<bool> deferred{false};

static sigset_t stop_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    return set;
}

// The signal's own default action: the process ends as the signal says.
static void end_by(int signal) {
    std::signal(signal, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, signal);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(signal);
}

void take_stop_signals_on_their_own_thread() {
    const sigset_t set = stop_signals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
        for (;;) {
            int signal = 0;
            if (sigwait(&set, &signal) != 0) continue;
            if (!deferred.load() || caught.load() == signal) end_by(signal);
            int none = 0;
            caught.compare_exchange_strong(none, signal);
        }
    }).detach();
}

void defer_stop_signals() { deferred = true; }

int stop_signal_caught() { return caught.load(); }

}  // namespace tpsp
