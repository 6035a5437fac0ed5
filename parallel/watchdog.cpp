#include "parallel/watchdog.h"

#include <algorithm>
#include <chrono>

#include "parallel/trace.h"

namespace tpsp {

Watchdog::Watchdog(double timeout_seconds, std::function<void(const char*, double)> on_expiry,
                   std::function<void()> on_start)
    : timeout_(timeout_seconds), on_expiry_(std::move(on_expiry)), on_start_(std::move(on_start)),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void Watchdog::watch(const char* name, std::function<bool()> done) {
    std::lock_guard<std::mutex> lock(mutex_);
    name_ = name;
    started_ = now_seconds();
    done_ = std::move(done);
}

// Looks at the newest operation every tenth of the timeout (at most every
// second): forgotten once done, reported once pending for the whole timeout.
void Watchdog::run() {
    if (on_start_) on_start_();
    const auto period = std::chrono::duration<double>(std::min(1.0, timeout_ / 10));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
        if (!name_) continue;
        if (done_()) {
            name_ = nullptr;
            continue;
        }
        const double pending = now_seconds() - started_;
        if (pending < timeout_) continue;
        const char* name = name_;
        name_ = nullptr;
        lock.unlock();
        on_expiry_(name, pending);
        lock.lock();
    }
}

}  // namespace tpsp
