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

// docs/design.md §2's formula for the mode; with e = 2 also in Korthikanti et al.'s
// form: 34sbh + 5as²b, sbh(34/t + 5as/(ht)), sbh(10 + 24/t + 5as/(ht)).
// cuDNN's fused attention keeps 4·b·a·s/t bytes of row statistics in place
// of the b·a·s²·(2e+1)/t of S', its mask and S; selective recomputation keeps neither.
static std::string formula_text(int t, bool sp, int64_t e, AttentionKernel attention, Recompute recompute) {
    const bool fused = attention == AttentionKernel::cudnn_fused;
    const std::string per_t = t == 1 ? "" : "/t";
    if (!fused && recompute == Recompute::selective) {
        const std::string general = t == 1 || sp ? "b·s·h·(16e+2)" + per_t : "b·s·h·(4e+2) + b·s·h·12e/t";
        if (e != 2) return general;
        return general + " = " + (t == 1 ? "34·b·s·h" : sp ? "s·b·h·34/t" : "s·b·h·(10 + 24/t)");
    }
    const std::string scores = (fused ? "4·b·a·s" : "b·a·s²·(2e+1)") + per_t;
    const std::string general = t == 1 || sp ? "b·s·h·(16e+2)" + per_t + " + " + scores
                                             : "b·s·h·(4e+2) + b·s·h·12e/t + " + scores;
    if (e != 2) return general;
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

// One line: what each recompute mode keeps per rank for the same shape, and
// the workspace selective needs once (S', its mask and S of one block).
static std::string compare_recompute_modes(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, bool sp,
                                           int64_t e) {
    const int64_t b = r.batch, s = r.seq_len, h = c.channels, a = c.num_heads, t = tp.size, L = c.num_layers;
    if (c.attention == AttentionKernel::cudnn_fused)
        return "recompute: cuDNN's fused attention keeps no s² tensors; selective recomputes nothing more\n";
    const int64_t none = block_activation_formula_bytes(b, s, h, a, e, t, sp, c.attention, Recompute::none);
    const int64_t selective = block_activation_formula_bytes(b, s, h, a, e, t, sp, c.attention, Recompute::selective);
    const int64_t scores_once = b * a * s * s * (2 * e + 1) / t;
    char line[256];
    std::snprintf(line, sizeof line,
                  "model.recompute, the L blocks' saved activations per rank: none %s | selective %s (and %s of "
                  "workspace, once)\n",
                  mib(L * none).c_str(), mib(L * selective).c_str(), mib(scores_once).c_str());
    return line;
}

// Act: float, or uint16_t standing in for bf16 (the same bytes, the same tables).
template <class Act>
static MemoryReport report(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp,
                           const Dim& attention_scratch, const char* device) {
    BlockActivations<Act> block{};
    OutsideActivations<Act> outside{};
    Workspace<Act> workspace{};
    ParameterTensors params{};
    std::vector<TensorSpec> block_table = block_activation_table(c, r, tp, &block);
    std::vector<TensorSpec> outside_table = outside_activation_table(c, r, tp, &outside);
    std::vector<TensorSpec> workspace_table_ = workspace_table(c, r, tp, attention_scratch, &workspace);
    const DType activation = dtype_of<Act>();
    const int64_t e = int64_t(sizeof(Act));

    MemoryReport m;
    m.block_bytes = int64_t(table_bytes(block_table));
    const bool sp = tp.sequence_parallel || tp.size == 1;
    m.block_formula_bytes = block_activation_formula_bytes(r.batch, r.seq_len, c.channels, c.num_heads, e, tp.size, sp,
                                                           c.attention, r.recompute);
    m.blocks_bytes = m.block_bytes * c.num_layers;
    m.outside_bytes = int64_t(table_bytes(outside_table));
    m.workspace_bytes = int64_t(table_bytes(workspace_table_));
    m.parameter_bytes = int64_t(table_bytes(parameter_table(c, tp.size, &params)));

    char line[512];
    const char* mode = tp.size == 1 ? "one rank" : sp ? "TP+SP" : "TP only";
    std::snprintf(line, sizeof line,
                  "model: L=%d a=%d h=%d V=%d Vp=%d | run: b=%d s=%d dropout=%g recompute=%s | %s, t=%d, per rank | "
                  "%s: %s activations (e=%d)\n\n",
                  c.num_layers, c.num_heads, c.channels, c.vocab_size, c.padded_vocab_size, r.batch, r.seq_len,
                  r.dropout, r.recompute == Recompute::selective ? "selective" : "none", mode, tp.size, device,
                  dtype_name(activation), int(e));
    m.text = line;
    m.text += format_table("saved activations of one transformer block (each of the L blocks):", block_table,
                           activation);
    const std::string formula = formula_text(tp.size, sp, e, c.attention, r.recompute);
    std::snprintf(line, sizeof line,
                  "\nformula per block: %s = %lld bytes\n"
                  "table per block:   %lld bytes  ->  %s\n\n",
                  formula.c_str(), (long long)m.block_formula_bytes, (long long)m.block_bytes,
                  m.block_bytes == m.block_formula_bytes ? "EQUAL" : "NOT EQUAL");
    m.text += line;
    m.text += format_table("saved outside the blocks (not part of the per-block formula):", outside_table, activation);
    m.text += '\n';
    m.text += format_table("workspace, reused from block to block (gradients, scratch; not saved):", workspace_table_,
                           activation);
    std::snprintf(line, sizeof line,
                  "\nsaved activations: %d blocks × %s + outside %s = %s\n"
                  "workspace %s | parameters %s (and as much again for gradients)\n",
                  c.num_layers, mib(m.block_bytes).c_str(), mib(m.outside_bytes).c_str(),
                  mib(m.blocks_bytes + m.outside_bytes).c_str(), mib(m.workspace_bytes).c_str(),
                  mib(m.parameter_bytes).c_str());
    m.text += line;
    m.text += compare_recompute_modes(c, r, tp, sp, e);
    return m;
}

MemoryReport memory_report(const GPTConfig& c, const RunShape& r, const TensorParallelism& tp, Device device) {
    const int64_t b = r.batch, s = r.seq_len, h = c.channels, a = c.num_heads, t = tp.size;
    if (device == Device::cuda)
        return report<uint16_t>(c, r, tp, attention_scratch_for(c, cuda_attention_scratch(b, s, h, a, t)), "cuda");
    if (c.attention == AttentionKernel::cudnn_fused)
        throw std::invalid_argument("model.attention: cudnn is cuDNN's fused attention: it needs the GPU");
    return report<float>(c, r, tp, CpuBackend::attention_scratch(b, s, h, a, t), "cpu");
}

}  // namespace tpsp
