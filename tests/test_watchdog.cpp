// The watchdog of the GPU's communicators (parallel/watchdog.h), on the CPU:
// an operation that never completes is reported once, with its name, after
// the timeout; a completed one, or one followed by a newer completed one, is
// never reported.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "parallel/watchdog.h"

using namespace tpsp;

namespace {

constexpr double timeout = 0.2;  // seconds; the watchdog looks every 0.02 s

struct Expiry {
    std::atomic<int> count{0};
    std::promise<std::pair<std::string, double>> first;
    void operator()(const char* name, double seconds) {
        if (count++ == 0) first.set_value({name, seconds});
    }
};

}  // namespace

TEST(Watchdog, AnOperationThatNeverCompletesIsReportedOnceAfterTheTimeout) {
    Expiry expiry;
    auto reported = expiry.first.get_future();
    Watchdog watchdog(timeout, [&](const char* name, double seconds) { expiry(name, seconds); });
    watchdog.watch("all-gather", [] { return false; });
    ASSERT_EQ(reported.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "never reported";
    auto [name, seconds] = reported.get();
    EXPECT_EQ(name, "all-gather");
    EXPECT_GE(seconds, timeout);
    std::this_thread::sleep_for(std::chrono::duration<double>(5 * timeout));
    EXPECT_EQ(expiry.count, 1) << "reported more than once";
}

TEST(Watchdog, CompletedOperationsAreNeverReported) {
    Expiry expiry;
    Watchdog watchdog(timeout, [&](const char* name, double seconds) { expiry(name, seconds); });
    watchdog.watch("reduce-scatter", [] { return true; });
    // a stuck-looking operation followed by a newer one that completed: the
    // stream completes in order, so the older one is done too
    watchdog.watch("all-gather", [] { return false; });
    watchdog.watch("all-reduce", [] { return true; });
    std::this_thread::sleep_for(std::chrono::duration<double>(5 * timeout));
    EXPECT_EQ(expiry.count, 0);
}

// The GPU's communicator makes its GPU current on the watchdog's thread
// before the first event query (else the query would make a context on GPU 0).
TEST(Watchdog, TheStartHookRunsOnTheWatchdogsThreadBeforeAnyQuery) {
    std::atomic<bool> started{false};
    std::promise<std::pair<std::thread::id, bool>> queried;  // the querying thread, and whether the hook ran first
    auto first_query = queried.get_future();
    std::thread::id hook_thread;
    std::atomic<bool> once{false};
    Watchdog watchdog(
        timeout, [](const char*, double) {},
        [&] {
            hook_thread = std::this_thread::get_id();
            started = true;
        });
    watchdog.watch("all-gather", [&] {
        if (!once.exchange(true)) queried.set_value({std::this_thread::get_id(), started.load()});
        return true;
    });
    ASSERT_EQ(first_query.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "never queried";
    const auto [query_thread, hook_ran_first] = first_query.get();
    EXPECT_TRUE(hook_ran_first);
    EXPECT_EQ(query_thread, hook_thread);
    EXPECT_NE(query_thread, std::this_thread::get_id());
}
