#include "parallel/trace.h"

#include <mpi.h>

#include "common/files.h"
#include "parallel/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

namespace tpsp {

double now_seconds() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void Tracer::enable(size_t capacity) {
    events_.reserve(capacity);
    enabled_ = true;
}

void Tracer::record(const char* name, Track track, double start, double end) {
    if (enabled_ && events_.size() < events_.capacity()) events_.push_back({name, track, start, end});
}

std::vector<std::pair<std::string, double>> Tracer::compute_seconds_by_name() const {
    std::vector<std::pair<std::string, double>> totals;
    for (const Event& e : events_) {
        if (e.track != Track::compute) continue;
        auto same = [&](const auto& total) { return total.first == e.name; };
        auto found = std::find_if(totals.begin(), totals.end(), same);
        if (found == totals.end()) found = totals.insert(totals.end(), {e.name, 0.0});
        found->second += e.end - e.start;
    }
    return totals;
}

int Tracer::count(const std::string& name, Track track) const {
    return int(std::count_if(events_.begin(), events_.end(),
                             [&](const Event& e) { return e.track == track && name == e.name; }));
}

static const char* const trace_head = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";

bool Tracer::replaceable(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return true;
    std::string start(std::strlen(trace_head), '\0');
    in.read(start.data(), std::streamsize(start.size()));
    return in.gcount() == 0 || start == trace_head;
}

void Tracer::reserve_file(const std::string& path, int ranks) {
    constexpr size_t frame = 1024;  // the head, the tail and each rank's three metadata lines, well within
    reserved_ = std::make_unique<AtomicFile>(path);
    reserved_path_ = path;
    reserved_->reserve(size_t(ranks) * (events_.capacity() * max_event_bytes + frame));
}

void Tracer::write(const std::string& path, int rank, void* comm_ptr) {
    MPI_Comm comm = *static_cast<MPI_Comm*>(comm_ptr);
    std::string json;
    char line[640];  // the longest: the four rows' names
    for (const Event& e : events_) {
        std::snprintf(line, sizeof line,
                      ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                      e.name, rank, int(e.track), e.start * 1e6, (e.end - e.start) * 1e6);
        json += line;
    }
    std::snprintf(
        line, sizeof line,
        ",\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}"
        ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"compute\"}}"
        ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": "
        "\"communication\"}}"
        ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 2, \"args\": {\"name\": "
        "\"data-parallel communication\"}}"
        ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 3, \"args\": {\"name\": "
        "\"pipeline schedule\"}}",
        rank, rank, rank, rank, rank, rank);
    json += line;
    int size = 0, length = int(json.size());
    MPI_Comm_size(comm, &size);
    std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
    // both gathers under parallel.timeout_s, as every other wait for peers
    MPI_Request request;
    MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm, &request);
    wait_for_collective(&request, comm, "gather of the trace's lengths");
    std::string all;
    if (rank == 0) {
        int total = 0;
        for (int r = 0; r < size; r++) offsets[r] = total, total += lengths[r];
        all.resize(size_t(total));
    }
    MPI_Igatherv(json.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm,
                 &request);
    wait_for_collective(&request, comm, "gather of the trace");
    if (rank != 0) return;
    const std::string head = trace_head, tail = "\n]}\n";
    std::unique_ptr<AtomicFile> file = reserved_path_ == path ? std::move(reserved_) : nullptr;
    if (!file) file = std::make_unique<AtomicFile>(path);
    file->write(head.data(), head.size());
    file->write(all.data() + 2, all.size() - 2);  // no leading comma
    file->write(tail.data(), tail.size());
    file->commit();
}

}  // namespace tpsp
