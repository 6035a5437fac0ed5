// `tpsp memory`: the activation tables one rank allocates, beside the
// formulas of docs/design.md §2 for its mode that they must equal.
#pragma once
#include <string>

#include "model/gpt.h"

namespace tpsp {

struct MemoryReport {
    int64_t block_bytes;              // one block's whole table, summed
    int64_t block_formula_bytes;      // docs/design.md §2's formula for it, for this mode and t
    int64_t blocks_bytes;             // what the L blocks keep (under full recomputation, less than L whole tables)
    int64_t blocks_formula_bytes;     // saved_blocks_formula_bytes
    int64_t recompute_bytes;          // the workspace's recompute tables
    int64_t recompute_formula_bytes;  // recompute_workspace_formula_bytes
    int64_t outside_bytes, workspace_bytes, parameter_bytes;
    std::string text;
    // every table equals its formula
    bool equal() const {
        return block_bytes == block_formula_bytes && blocks_bytes == blocks_formula_bytes &&
               recompute_bytes == recompute_formula_bytes;
    }
};

// Which model the report is for: the CPU's (fp32 activations, e = 4) or the
// CUDA backend's (bf16 activations, e = 2). Either can be reported anywhere.
enum class Device { cpu, cuda };

// Built from the same tables the GPT constructor lays its arenas out from.
// shape: the whole sequences; under context parallelism (cp) a rank keeps
// s/cp positions of them, and every formula is divided by cp (§9).
MemoryReport memory_report(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp, Device device,
                           const ContextParallelism& cp = {});

// Under a pipeline (docs/design.md §10): each stage's saved activations of
// its blocks, the tables of its activation sets (the most micro-batches its
// schedule keeps in flight, chunks together) beside part_saved_blocks_formula_bytes,
// and the first stage's beside the one-stage model's, whose ratio the paper
// gives: 1 under 1F1B with m ≥ p, 1 + (p − 1)/(p·vpp) interleaved (m > p).
struct PipelineMemoryReport {
    std::vector<int64_t> stage_bytes, stage_formula_bytes;
    int64_t one_stage_bytes = 0;  // the whole model's blocks at pp = 1
    std::string text;
    bool equal() const { return stage_bytes == stage_formula_bytes; }
};
PipelineMemoryReport pipeline_memory_report(const GPTConfig& config, const RunShape& shape, const TensorParallelism& tp,
                                            Device device, const ContextParallelism& cp, const PipelineShape& pipeline);

}  // namespace tpsp
