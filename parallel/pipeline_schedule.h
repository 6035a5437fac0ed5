// Pipeline parallelism's schedules (docs/design.md §10): which blocks each
// stage holds, and the order in which a stage runs the forwards and
// backwards of its micro-batches. Knows nothing about GPT beyond its layer
// count; the trainer runs what these functions return.
//
// p stages, each holding vpp model chunks of L/(p·vpp) consecutive blocks:
// model chunk c·p + i lives on stage i as its chunk c, so a micro-batch goes
// through stage 0, 1, …, p − 1, then stage 0 again (its chunk 1), and so on.
// Without interleaving (vpp = 1) stage i holds blocks [i·L/p, (i+1)·L/p).
//
// 1F1B (Megatron's forward_backward_pipelining_without_interleaving), stage i
// of p, m micro-batches:
//   warm-up    min(p − i − 1, m) forwards
//   steady     one forward, one backward, until every forward has run
//   cool-down  the backwards left
// so at most min(p − i, m) micro-batches are in flight on stage i.
// Interleaved (…_with_interleaving): the same three phases over the m·vpp
// (chunk, micro-batch) pairs, taken in groups of p micro-batches chunk by
// chunk; warm-up (p − i − 1)·2 + (vpp − 1)·p pairs (all of them when m = p).
#pragma once
#include <string>
#include <vector>

namespace tpsp {

struct PipelineAction {
    enum Kind { forward, backward };
    Kind kind;
    int chunk;        // the stage's model chunk, 0 … vpp − 1
    int micro_batch;  // 0 … m − 1
    bool operator==(const PipelineAction&) const = default;
};

struct PipelineShape {
    int stages = 1;         // p
    int chunks = 1;         // vpp: model chunks per stage
    int micro_batches = 1;  // m
    int layers = 1;         // L
    int layers_per_chunk() const { return layers / (stages * chunks); }
    int model_chunk(int stage, int chunk) const { return chunk * stages + stage; }
    // the first block of a stage's chunk
    int first_layer(int stage, int chunk) const { return model_chunk(stage, chunk) * layers_per_chunk(); }
    // whether the chunk holds the embeddings (the model's first chunk) or the head (its last)
    bool first_in_model(int stage, int chunk) const { return model_chunk(stage, chunk) == 0; }
    bool last_in_model(int stage, int chunk) const { return model_chunk(stage, chunk) == stages * chunks - 1; }
};

// The layout's mistakes as one line each (empty when it is sound): L not a
// multiple of p·vpp, interleaving with m not a multiple of p, fewer than one
// stage or chunk, fewer micro-batches than one.
std::string pipeline_shape_error(const PipelineShape& shape);

// Stage `stage`'s actions in the order it runs them.
std::vector<PipelineAction> pipeline_schedule(const PipelineShape& shape, int stage);

// How many micro-batches each of the stage's chunks has in flight at most
// under its schedule (forwarded, not yet backwarded).
std::vector<int> pipeline_in_flight(const PipelineShape& shape, int stage);
// How many (chunk, micro-batch) pairs the stage has in flight at most, all
// chunks together: the blocks' activation sets it keeps (every chunk holds as
// many blocks, so a set serves any chunk). Stage 0 under 1F1B: min(p, m);
// interleaved: its warm-up + 1, p·vpp + p − 1 pairs of L/(p·vpp) blocks, the
// paper's L·(1 + (p − 1)/(p·vpp)) (where m > p; at m = p every forward runs first).
int pipeline_peak_in_flight(const PipelineShape& shape, int stage);

// The bubble the schedule implies, as a fraction of the ideal step (every
// stage busy all the time): (p − 1)/m for 1F1B, (p − 1)/(m·vpp) interleaved.
double pipeline_bubble_theory(const PipelineShape& shape);

// The schedules of every stage run together with forwards of `forward_cost`
// and backwards of `backward_cost` time units, each action starting once its
// input has arrived (a forward: the previous model chunk's forward of that
// micro-batch; a backward: the next one's backward) and the stage is free.
// Returns the step's length, or −1 if the stages would wait on each other
// forever. The tests prove the schedules sound with it; the benchmark
// compares the measured bubble with it.
double simulate_pipeline(const PipelineShape& shape, double forward_cost, double backward_cost);

}  // namespace tpsp
