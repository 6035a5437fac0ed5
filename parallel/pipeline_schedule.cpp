#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>

namespace tpsp {

std::string pipeline_shape_error(const PipelineShape& s) {
    const std::string p = std::to_string(s.stages), vpp = std::to_string(s.chunks);
    if (s.stages < 1) return "parallel.pp: " + p + " stages; it takes 1 or more";
    if (s.chunks < 1) return "parallel.vpp: " + vpp + " model chunks per stage; it takes 1 or more";
    if (s.chunks > 1 && s.stages == 1)
        return "parallel.vpp: " + vpp + " model chunks per stage interleave a pipeline: it needs parallel.pp > 1";
    if (s.stages > s.layers || s.chunks > s.layers / s.stages)  // (and pp · vpp cannot overflow below)
        return "parallel.pp: pp · vpp = " + p + " · " + vpp +
               " model chunks of at least one block each, but model.layers is " + std::to_string(s.layers);
    if (s.layers % (s.stages * s.chunks) != 0)
        return "model.layers: " + std::to_string(s.layers) +
               " blocks do not split into pp · vpp = " + std::to_string(s.stages * s.chunks) + " equal model chunks";
    if (s.micro_batches < 1) return "train.grad_accum: " + std::to_string(s.micro_batches) + "; it takes 1 or more";
    if (s.chunks > 1 && s.micro_batches % s.stages != 0)
        return "train.grad_accum: " + std::to_string(s.micro_batches) +
               " micro-batches; the interleaved schedule (parallel.vpp > 1) takes a multiple of parallel.pp = " + p +
               " (as Megatron's)";
    return "";
}

namespace {

// The k-th (chunk, micro-batch) pair of the interleaved order: groups of p
// micro-batches, each group through chunk 0, 1, … (backwards: the chunks in
// reverse).
PipelineAction interleaved_action(const PipelineShape& s, int k, PipelineAction::Kind kind) {
    const int group = s.stages * s.chunks;
    int chunk = k % group / s.stages;
    if (kind == PipelineAction::backward) chunk = s.chunks - 1 - chunk;
    return {kind, chunk, k / group * s.stages + k % s.stages};
}

int warmup_count(const PipelineShape& s, int stage, int total) {
    if (s.chunks == 1) return std::min(s.stages - stage - 1, total);
    if (s.micro_batches == s.stages) return total;
    return std::min((s.stages - stage - 1) * 2 + (s.chunks - 1) * s.stages, total);
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(const PipelineShape& s, int stage) {
    const int total = s.micro_batches * s.chunks;
    const int warmup = warmup_count(s, stage, total);
    std::vector<PipelineAction> actions;
    auto forward = [&](int k) { actions.push_back(interleaved_action(s, k, PipelineAction::forward)); };
    auto backward = [&](int k) { actions.push_back(interleaved_action(s, k, PipelineAction::backward)); };
    for (int k = 0; k < warmup; k++) forward(k);
    for (int k = 0; k < total - warmup; k++) {
        forward(warmup + k);
        backward(k);
    }
    for (int k = total - warmup; k < total; k++) backward(k);
    return actions;
}

std::vector<int> pipeline_in_flight(const PipelineShape& s, int stage) {
    std::vector<int> now(size_t(s.chunks), 0), peak(size_t(s.chunks), 0);
    for (const PipelineAction& a : pipeline_schedule(s, stage)) {
        int& n = now[size_t(a.chunk)];
        n += a.kind == PipelineAction::forward ? 1 : -1;
        peak[size_t(a.chunk)] = std::max(peak[size_t(a.chunk)], n);
    }
    return peak;
}

int pipeline_peak_in_flight(const PipelineShape& s, int stage) {
    int now = 0, peak = 0;
    for (const PipelineAction& a : pipeline_schedule(s, stage)) {
        now += a.kind == PipelineAction::forward ? 1 : -1;
        peak = std::max(peak, now);
    }
    return peak;
}

double pipeline_bubble_theory(const PipelineShape& s) {
    return double(s.stages - 1) / (double(s.micro_batches) * s.chunks);
}

double simulate_pipeline(const PipelineShape& s, double forward_cost, double backward_cost) {
    const int p = s.stages, chunks = p * s.chunks;
    std::vector<std::vector<PipelineAction>> schedules;
    for (int i = 0; i < p; i++) schedules.push_back(pipeline_schedule(s, i));
    // when each (kind, model chunk, micro-batch) finished
    std::map<std::tuple<int, int, int>, double> done;
    std::vector<size_t> next(size_t(p), 0);
    std::vector<double> free_at(size_t(p), 0.0);
    size_t left = 0;
    for (const auto& schedule : schedules) left += schedule.size();
    while (left > 0) {
        bool progressed = false;
        for (int i = 0; i < p; i++) {
            if (next[size_t(i)] == schedules[size_t(i)].size()) continue;
            const PipelineAction& a = schedules[size_t(i)][next[size_t(i)]];
            const int chunk = s.model_chunk(i, a.chunk);
            const bool forward = a.kind == PipelineAction::forward;
            // the input: the previous chunk's forward, or the next chunk's backward (the head's own forward)
            std::tuple<int, int, int> input = forward ? std::make_tuple(0, chunk - 1, a.micro_batch)
                                                      : std::make_tuple(chunk + 1 < chunks ? 1 : 0,
                                                                        chunk + 1 < chunks ? chunk + 1 : chunk,
                                                                        a.micro_batch);
            double ready = 0.0;
            if (!(forward && chunk == 0)) {
                const auto found = done.find(input);
                if (found == done.end()) continue;
                ready = found->second;
            }
            const double start = std::max(ready, free_at[size_t(i)]);
            free_at[size_t(i)] = start + (forward ? forward_cost : backward_cost);
            done[{forward ? 0 : 1, chunk, a.micro_batch}] = free_at[size_t(i)];
            next[size_t(i)]++;
            left--;
            progressed = true;
        }
        if (!progressed) return -1.0;
    }
    return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace tpsp
