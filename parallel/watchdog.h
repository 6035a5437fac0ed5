// A thread that ends the job when a communication has been pending too long:
// PyTorch's NCCL watchdog, for the GPU's communicators. Their waits never
// block the host (the compute stream waits on an event), so the host blocks
// later, in a synchronisation that no deadline reaches, and a stopped peer
// would hang the job there. The communicator tells the watchdog about every
// operation it enqueues; operations on its stream complete in order, so the
// newest one pending for `timeout` seconds means the group is stuck.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace tpsp {

class Watchdog {
public:
    // on_expiry(name, seconds): called once, on the watchdog's thread, with
    // the stuck operation's name and how long it has been pending; it is
    // expected to end the process (print its line, abort). on_start: run
    // first on the watchdog's thread (to make the caller's GPU current there).
    Watchdog(double timeout_seconds, std::function<void(const char* name, double seconds)> on_expiry,
             std::function<void()> on_start = {});
    ~Watchdog();  // stops the thread
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // The newest operation, started now: done() says whether it has completed
    // (it is asked from the watchdog's thread). name must outlive it (a literal).
    void watch(const char* name, std::function<bool()> done);

private:
    void run();
    const double timeout_;
    const std::function<void(const char*, double)> on_expiry_;
    const std::function<void()> on_start_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    const char* name_ = nullptr;  // null: nothing pending
    double started_ = 0.0;
    std::function<bool()> done_;
    std::thread thread_;  // last: starts after every member above is ready
};

}  // namespace tpsp
