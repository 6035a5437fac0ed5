#include "model/memory_report.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include "model/gpt_model.h"

namespace tpsp {

static std::string mib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
    return buf;
}

// docs/design.md §2's formula for one block's whole table; with e = 2 and
// dropout also in Korthikanti et al.'s form: 34sbh + 5as²b, sbh(34/t +
// 5as/(ht)), sbh(10 + 24/t + 5as/(ht)). cuDNN's fused attention keeps 4·b·a·s/t
// bytes of row statistics in place of the s² term; selective recomputation
// keeps neither. Without dropout there are no masks: 16e (4e) for 16e+2
// (4e+2), and S' alone, b·a·s²·e.
static std::string formula_text(int t, bool sp, int64_t e, AttentionKernel attention, Recompute recompute,
                                bool dropout) {
    const bool fused = attention == AttentionKernel::cudnn_fused;
    const std::string per_t = t == 1 ? "" : "/t";
    const std::string tokens = t == 1 || sp ? std::string(dropout ? "b·s·h·(16e+2)" : "b·s·h·16e") + per_t
                                            : std::string(dropout ? "b·s·h·(4e+2)" : "b·s·h·4e") + " + b·s·h·12e/t";
    const bool papers_form = e == 2 && dropout;
    if (!fused && recompute == Recompute::selective) {
        if (!papers_form) return tokens;
        return tokens + " = " + (t == 1 ? "34·b·s·h" : sp ? "s·b·h·34/t" : "s·b·h·(10 + 24/t)");
    }
    const std::string scores = (fused ? "4·b·a·s" : dropout ? "b·a·s²·(2e+1)" : "b·a·s²·e") + per_t;
    const std::string general = tokens + " + " + scores;
    if (!papers_form) return general;
    if (fused)
        return general + " = " +
               (t == 1 ? "34·b·s·h + 4·b·a·s"
                : sp   ? "s·b·h·34/t + 4·b·a·s/t"
                       : "s·b·h·(10 + 24/t) + 4·b·a·s/t");
    return general + " = " +
           (t == 1 ? "34·b·s·h + 5·b·a·s²"
            : sp   ? "s·b·h·(34/t + 5·a·s/(h·t))"
                   : "s·b·h·(10 + 24/t + 5·a·s/(h·t))");
}

static const char* verdict(int64_t table, int64_t formula) { return table == formula ? "EQUAL" : "NOT EQUAL"; }

// Under full recomputation: which blocks keep what.
static std::string full_recompute_text(const GPTConfig& c, const RunShape& r, int64_t input_bytes) {
    const std::vector<BlockRun> runs = recomputed_runs(r, c.num_layers);
    std::string text = "full recomputation: " + std::to_string(runs.size()) +
                       " run(s) of blocks keep only their first " + "block's input (ln1_in, " +
                       std::to_string(input_bytes) + " bytes each):";
    for (const BlockRun& run : runs) {
        char blocks[32];
        if (run.end - run.begin > 1) std::snprintf(blocks, sizeof blocks, " %d-%d", run.begin, run.end - 1);
        else std::snprintf(blocks, sizeof blocks, " %d", run.begin);
        text += blocks;
    }
    const int recomputed = runs.empty() ? 0 : runs.back().end;
    if (recomputed < c.num_layers)
        text += "; blocks " + std::to_string(recomputed) + "-" + std::to_string(c.num_layers - 1) +
                " keep the whole table";
    return text + "\n";
}

// One line: what each recompute mode keeps per rank for the same shape, and
// the workspace it adds once. Full as configured, or uniform runs of one block.
static std::string compare_recompute_modes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                           int64_t e, int cp) {
    RunShape none = r, selective = r, full = r;
    none.recompute = Recompute::none;
    selective.recompute = Recompute::selective;
    if (full.recompute != Recompute::full) {
        full.recompute = Recompute::full;
        full.recompute_method = RecomputeMethod::uniform;
        full.recompute_layers = 1;
    }
    auto mode = [&](const RunShape& shape) {
        const int64_t workspace = recompute_workspace_formula_bytes(c, shape, tp, e) / cp;
        return recompute_description(shape) + " " + mib(saved_blocks_formula_bytes(c, shape, tp, e) / cp) +
               (workspace ? " (+ " + mib(workspace) + " of workspace, once)" : "");
    };
    return "model.recompute, what the L blocks keep per rank: " + mode(none) + " | " + mode(selective) + " | " +
           mode(full) + "\n";
}

// Act: float, or uint16_t standing in for bf16 (the same bytes, the same tables).
// r: the whole sequences; the tables are of a CP rank's s/cp positions, the
// formulas of the whole sequences divided by cp.
template <class Act>
static MemoryReport report(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                           const Dim& attention_scratch, const char* device, const ContextParallelism& cp) {
    BlockActivations<Act> block{};
    OutsideActivations<Act> outside{};
    Workspace<Act> workspace{};
    ParameterTensors params{};
    RunShape rank = r;
    rank.seq_len = r.seq_len / cp.size;
    std::vector<TensorSpec> block_table = block_activation_table(c, rank, tp, &block, BlockKeeps::whole_table, cp);
    std::vector<TensorSpec> outside_table = outside_activation_table(c, rank, tp, &outside);
    std::vector<TensorSpec> workspace_table_ = workspace_table(c, rank, tp, attention_scratch, &workspace, cp);
    const DType activation = dtype_of<Act>();
    const int64_t e = int64_t(sizeof(Act));
    const bool sp = tp.sequence_parallel || tp.size == 1, dropout = r.dropout > 0.0f;

    // the formulas' model: ring attention under selective recomputation keeps what cuDNN's fused
    // kernel keeps, each query row's log-sum-exp (4·b·a·s/t bytes), and no s² tensor (§9)
    GPTConfig f = c;
    if (cp.ring && r.recompute == Recompute::selective) f.attention = AttentionKernel::cudnn_fused;
    MemoryReport m;
    m.block_bytes = int64_t(table_bytes(block_table));
    m.block_formula_bytes = block_activation_formula_bytes(r.batch, r.seq_len, c.channels, c.num_heads, e, tp.size, sp,
                                                           f.attention, r.recompute, dropout) /
                            cp.size;
    m.blocks_bytes = 0;
    for (int l = 0; l < c.num_layers; l++) {
        BlockActivations<Act> kept{};
        m.blocks_bytes += int64_t(
            table_bytes(block_activation_table(c, rank, tp, &kept, block_keeps(r, c.num_layers, l), cp)));
    }
    m.blocks_formula_bytes = saved_blocks_formula_bytes(f, r, tp, e) / cp.size;
    m.recompute_bytes = 0;
    for (const TensorSpec& spec : workspace_table_)
        if (spec.name.rfind("recompute[", 0) == 0) m.recompute_bytes += int64_t(spec.bytes());
    m.recompute_formula_bytes = recompute_workspace_formula_bytes(f, r, tp, e) / cp.size;
    m.outside_bytes = int64_t(table_bytes(outside_table));
    m.workspace_bytes = int64_t(table_bytes(workspace_table_));
    m.parameter_bytes = int64_t(table_bytes(parameter_table(c, tp.size, &params)));

    char line[512];
    const char* mode = tp.size == 1 ? "one rank" : sp ? "TP+SP" : "TP only";
    std::snprintf(line, sizeof line,
                  "model: L=%d a=%d h=%d V=%d Vp=%d | run: b=%d s=%d dropout=%g recompute=%s | %s, t=%d%s, per rank | "
                  "%s: %s activations (e=%d)\n\n",
                  c.num_layers, c.num_heads, c.channels, c.vocab_size, c.padded_vocab_size, r.batch, r.seq_len,
                  r.dropout, recompute_description(r).c_str(), mode, tp.size,
                  cp.size > 1 ? (", cp=" + std::to_string(cp.size) + (cp.ring ? " (p2p ring attention" : " (a2a") +
                                 ": each rank s/cp positions)")
                                    .c_str()
                              : "",
                  device, dtype_name(activation), int(e));
    m.text = line;
    m.text += format_table("saved activations of one transformer block's whole table:", block_table, activation);
    const std::string formula = cp.size > 1
                                    ? "(" + formula_text(tp.size, sp, e, f.attention, r.recompute, dropout) + ") / cp"
                                    : formula_text(tp.size, sp, e, f.attention, r.recompute, dropout);
    std::snprintf(line, sizeof line,
                  "\nformula per block: %s = %lld bytes\n"
                  "table per block:   %lld bytes  ->  %s\n",
                  formula.c_str(), (long long)m.block_formula_bytes, (long long)m.block_bytes,
                  verdict(m.block_bytes, m.block_formula_bytes));
    m.text += line;
    if (r.recompute == Recompute::full) m.text += full_recompute_text(c, r, block_table.front().bytes());
    std::snprintf(line, sizeof line, "the %d blocks keep: tables %lld bytes, formula %lld bytes  ->  %s\n\n",
                  c.num_layers, (long long)m.blocks_bytes, (long long)m.blocks_formula_bytes,
                  verdict(m.blocks_bytes, m.blocks_formula_bytes));
    m.text += line;
    m.text += format_table("saved outside the blocks (not part of the per-block formula):", outside_table, activation);
    m.text += '\n';
    m.text += format_table("workspace, reused from block to block (gradients, scratch, recomputation; not saved):",
                           workspace_table_, activation);
    std::snprintf(line, sizeof line, "recomputation's workspace: tables %lld bytes, formula %lld bytes  ->  %s\n",
                  (long long)m.recompute_bytes, (long long)m.recompute_formula_bytes,
                  verdict(m.recompute_bytes, m.recompute_formula_bytes));
    m.text += line;
    std::snprintf(line, sizeof line,
                  "\nsaved activations: %d blocks %s + outside %s = %s\n"
                  "workspace %s | parameters %s (and as much again for gradients)\n",
                  c.num_layers, mib(m.blocks_bytes).c_str(), mib(m.outside_bytes).c_str(),
                  mib(m.blocks_bytes + m.outside_bytes).c_str(), mib(m.workspace_bytes).c_str(),
                  mib(m.parameter_bytes).c_str());
    m.text += line;
    if (c.attention == AttentionKernel::cudnn_fused)
        m.text += "(cuDNN's fused attention keeps no s² tensors: selective recomputes nothing more)\n";
    m.text += compare_recompute_modes(c, r, tp, e, cp.size);
    return m;
}

MemoryReport memory_report(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, Device device,
                           const ContextParallelism& cp) {
    // the attention core's: every position, a/(t·cp) heads; under ring attention
    // a/t heads of this rank's s/cp positions, and the ring kernels' own scratch
    const int64_t b = r.batch, h = c.channels, a = c.num_heads;
    const int64_t s = cp.ring ? r.seq_len / cp.size : r.seq_len;
    const int64_t t = int64_t(tp.size) * (cp.ring ? 1 : cp.size);
    if (device == Device::cuda)
        return report<uint16_t>(c, r, tp,
                                attention_scratch_for(c, cp.ring ? cuda_ring_attention_scratch(b, s, h, a, t)
                                                                 : cuda_attention_scratch(b, s, h, a, t)),
                                "cuda", cp);
    if (c.attention == AttentionKernel::cudnn_fused)
        throw std::invalid_argument("model.attention: cudnn is cuDNN's fused attention: it needs the GPU");
    return report<float>(
        c, r, tp,
        cp.ring ? CpuBackend::ring_attention_scratch(b, s, h, a, t) : CpuBackend::attention_scratch(b, s, h, a, t),
        "cpu", cp);
}

// The tables of the blocks a part keeps: its activation sets × one chunk's blocks.
template <class Act>
static int64_t part_blocks_table_bytes(const GPTConfig& c, const RunShape& rank, const TensorParallelism& tp,
                                       const ContextParallelism& cp, const ModelPart& part) {
    const int chunk_layers = part.chunks[0].end - part.chunks[0].begin;
    int64_t bytes = 0;
    for (int l = 0; l < chunk_layers; l++) {
        BlockActivations<Act> kept{};
        bytes += int64_t(
            table_bytes(block_activation_table(c, rank, tp, &kept, block_keeps(rank, chunk_layers, l), cp)));
    }
    return part.block_sets * bytes;
}

template <class Act>
static PipelineMemoryReport stage_reports(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                          const ContextParallelism& cp, const PipelineShape& pipeline) {
    RunShape rank = r;
    rank.seq_len = r.seq_len / cp.size;
    const int64_t e = int64_t(sizeof(Act));
    GPTConfig f = c;  // the formulas' model, as report()'s
    if (cp.ring && r.recompute == Recompute::selective) f.attention = AttentionKernel::cudnn_fused;
    PipelineMemoryReport m;
    m.one_stage_bytes = part_blocks_table_bytes<Act>(c, rank, tp, cp, whole_model(c));
    char line[320];
    std::snprintf(line, sizeof line,
                  "\npipeline: pp=%d, vpp=%d (%s), m=%d micro-batches, %d blocks per model chunk; saved "
                  "activations of the blocks per rank of each stage:\n",
                  pipeline.stages, pipeline.chunks, pipeline.chunks > 1 ? "interleaved 1F1B" : "1F1B",
                  pipeline.micro_batches, pipeline.layers_per_chunk());
    m.text = line;
    for (int stage = 0; stage < pipeline.stages; stage++) {
        const ModelPart part = pipeline_part(pipeline, stage);
        m.stage_bytes.push_back(part_blocks_table_bytes<Act>(c, rank, tp, cp, part));
        m.stage_formula_bytes.push_back(part_saved_blocks_formula_bytes(f, r, tp, e, part) / cp.size);
        std::snprintf(line, sizeof line,
                      "  stage %d: %d micro-batches of a chunk in flight at most (%d blocks each): tables %lld "
                      "bytes (%s), formula %lld bytes  ->  %s\n",
                      stage, part.block_sets, pipeline.layers_per_chunk(), (long long)m.stage_bytes.back(),
                      mib(m.stage_bytes.back()).c_str(), (long long)m.stage_formula_bytes.back(),
                      verdict(m.stage_bytes.back(), m.stage_formula_bytes.back()));
        m.text += line;
    }
    const double ratio = double(m.stage_bytes[0]) / double(m.one_stage_bytes);
    const double paper = pipeline.chunks > 1 ? 1.0 + double(pipeline.stages - 1) / (pipeline.stages * pipeline.chunks)
                                             : 1.0;
    std::snprintf(line, sizeof line,
                  "  the first stage keeps %s, the one-stage model's %d blocks %s: × %.4f (the paper: × %.4f %s)\n",
                  mib(m.stage_bytes[0]).c_str(), c.num_layers, mib(m.one_stage_bytes).c_str(), ratio, paper,
                  pipeline.chunks > 1 ? "= 1 + (p − 1)/(p·vpp), for m > p" : "for m ≥ p");
    m.text += line;
    return m;
}

PipelineMemoryReport pipeline_memory_report(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                                            Device device, const ContextParallelism& cp,
                                            const PipelineShape& pipeline) {
    if (device == Device::cuda) return stage_reports<uint16_t>(c, r, tp, cp, pipeline);
    return stage_reports<float>(c, r, tp, cp, pipeline);
}

}  // namespace tpsp
