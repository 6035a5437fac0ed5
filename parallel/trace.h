// A per-rank timeline of compute and communication, written as one Chrome
// trace (JSON; opens in Perfetto or chrome://tracing): one process per rank,
// one track for compute and one for communication.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/files.h"

namespace tpsp {

// data_parallel: the DP group's; pipeline: a stage's schedule, each micro-batch's forward and backward and the
// bubbles between them (docs/design.md §10)
enum class Track { compute = 0, communication = 1, data_parallel = 2, pipeline = 3 };

// Seconds on a clock all ranks of one machine share (CLOCK_MONOTONIC).
double now_seconds();

class Tracer {
public:
    // Records nothing until enabled; keeps at most `capacity` events, so
    // recording never allocates inside a step.
    void enable(size_t capacity);
    void disable() { enabled_ = false; }
    bool enabled() const { return enabled_; }
    void record(const char* name, Track track, double start, double end);
    // Collective over `comm` (an MPI_Comm* of every rank): rank 0 writes PATH
    // (atomically) with every rank's events; a FileError on rank 0 if it
    // could not, after every rank has taken part.
    void write(const std::string& path, int rank, void* comm);
    // On the rank that will write PATH, before the traced steps: opens its
    // temporary and reserves the most the trace can take (every rank's
    // `capacity` events at max_event_bytes each), so that a disk without
    // the room says so before step 1; write() then fills that file.
    void reserve_file(const std::string& path, int ranks);
    // Whether PATH may be written as the trace: it does not exist, is empty,
    // or holds a trace (as write() begins one); a user's file is never replaced.
    static bool replaceable(const std::string& path);
    static constexpr size_t max_event_bytes = 256;  // a line of the JSON, at most (write's buffer)
    // Seconds spent in each compute span name, in order of first appearance.
    std::vector<std::pair<std::string, double>> compute_seconds_by_name() const;
    // How many spans of this name the track holds: which schedule ran (the tests read it).
    int count(const std::string& name, Track track) const;

    // Called at both ends of every compute span while enabled: the backend's
    // synchronize, so that on a GPU, whose kernels run after they are
    // launched, a span times its kernels and not only their launches (the
    // traced steps run slower for it). Nothing to wait for on the CPU.
    void (*fence)() = nullptr;

private:
    struct Event {
        const char* name;  // a string literal
        Track track;
        double start, end;
    };
    bool enabled_ = false;
    std::vector<Event> events_;
    std::unique_ptr<AtomicFile> reserved_;  // the file reserve_file made ready, on the writing rank
    std::string reserved_path_;
};

// A span of compute on a trace, from construction to destruction; nothing
// when there is no tracer or it is not enabled.
class ComputeSpan {
public:
    ComputeSpan(Tracer* tracer, const char* name)
        : tracer_(tracer && tracer->enabled() ? tracer : nullptr), name_(name) {
        if (tracer_ && tracer_->fence) tracer_->fence();
        start_ = now_seconds();
    }
    ComputeSpan(const ComputeSpan&) = delete;
    ComputeSpan& operator=(const ComputeSpan&) = delete;
    ~ComputeSpan() {
        if (!tracer_) return;
        if (tracer_->fence) tracer_->fence();
        tracer_->record(name_, Track::compute, start_, now_seconds());
    }

private:
    Tracer* tracer_;
    const char* name_;
    double start_;
};

}  // namespace tpsp
