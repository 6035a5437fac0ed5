// HellaSwag scored by the model being trained or evaluated, as llm.c scores
// it: each (example, ending) is one row of a batch [b, s], the context's
// tokens then the ending's; the model's loss at each of the ending's tokens
// (the cross-entropy of that token given everything before it) is summed
// over the ending; acc picks the ending of the lowest sum, acc_norm the
// lowest mean (data/hellaswag.h). A row longer than s + 1 tokens loses its
// context's first tokens (counted in `cut`); positions after a row's end are
// padding whose losses are never read (attention is causal, so they change
// nothing before them).
//
// The DP ranks split the examples (example i on DP rank i mod dp) and their
// counts are summed; every TP rank of a group scores the same rows and holds
// every position's loss, so the figures are the same at any t and dp. Under
// a pipeline each batch goes through the stages (PipelineStep::forward_only)
// and the stage holding the head scores it; its counts reach every stage.
#pragma once
#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "common/errors.h"
#include "data/hellaswag.h"
#include "model/gpt.h"
#include "parallel/communicator.h"
#include "train/pipeline_step.h"

namespace tpsp {

struct HellaSwagScore {
    int examples = 0, correct_by_mean = 0, correct_by_sum = 0;
    int cut = 0;  // examples whose context lost tokens to fit train.seq_len
};

// "hellaswag: acc_norm K/N (P %) | acc K/N (P %)"
std::string hellaswag_line(const HellaSwagScore& score);

// The file read with the model's tokenizer: bytes for a vocabulary of 256,
// GPT-2's BPE (encoder.json and vocab.bpe in bpe_dir) for 50257; each
// example checked to fit (check_hellaswag_fits).
std::vector<HellaSwagExample> load_hellaswag(const std::string& path, int vocab_size, const std::string& bpe_dir,
                                             int seq_len);

// The HellaSwag file's size and CRC-32C, and those of GPT-2's BPE files that
// encode it (vocabulary 50257), a line each, for the ranks to compare: a
// node whose copy differs would score other tokens.
std::string hellaswag_input_lines(const std::string& path, int vocab_size, const std::string& bpe_dir);

// How many examples lose the start of their context at this sequence length.
int hellaswag_cut_examples(const std::vector<HellaSwagExample>& examples, int seq_len);

// Refuses (a FileError naming the file's line) an example whose ending
// alone does not fit in s positions after one token of context.
void check_hellaswag_fits(const std::string& path, const std::vector<HellaSwagExample>& examples, int seq_len);

// One row: the context's tokens, then the ending's, the first cut from the left to fit s + 1.
struct HellaSwagRow {
    std::vector<int> tokens;
    int ending_tokens = 0;  // the last ones of tokens
    bool cut = false;
};
HellaSwagRow hellaswag_row(const HellaSwagExample& example, int ending, int seq_len);

// Collective over the DP group (and the stages, under a pipeline): every
// rank of the job calls it with the same examples.
template <class Backend>
HellaSwagScore score_hellaswag(GPTModel<Backend>& model, const std::vector<HellaSwagExample>& examples, int dp_rank,
                               int dp, Communicator& dp_group, PipelineStep<Backend>* pipeline = nullptr,
                               Communicator* stages = nullptr) {
    if (model.cp.size > 1) throw ConfigError("HellaSwag: scored at parallel.cp = 1 only");
    const int B = model.shape.batch, T = model.shape.seq_len;
    std::vector<int> inputs(size_t(B) * T), targets(inputs.size());
    std::vector<float> losses(inputs.size());
    // this rank's rows: (example, ending), and each row's loss sum once scored
    std::vector<std::array<int, 2>> rows;
    for (size_t e = size_t(dp_rank); e < examples.size(); e += size_t(dp))
        for (int k = 0; k < hellaswag_endings; k++) rows.push_back({int(e), k});
    std::vector<double> sums(rows.size());
    std::vector<int> counts(rows.size());
    for (size_t first = 0; first < rows.size(); first += size_t(B)) {
        std::fill(inputs.begin(), inputs.end(), 0);
        std::fill(targets.begin(), targets.end(), 0);
        const size_t n = std::min(size_t(B), rows.size() - first);
        std::vector<HellaSwagRow> batch;
        for (size_t r = 0; r < n; r++) {
            batch.push_back(hellaswag_row(examples[size_t(rows[first + r][0])], rows[first + r][1], T));
            const std::vector<int>& tokens = batch.back().tokens;
            for (size_t p = 0; p + 1 < tokens.size(); p++) {
                inputs[r * T + p] = tokens[p];
                targets[r * T + p] = tokens[p + 1];
            }
        }
        if (pipeline) pipeline->forward_only(inputs.data(), targets.data());
        else model.forward(inputs.data(), targets.data(), {}, false);
        if (model.part.head) model.token_losses(losses.data());
        for (size_t r = 0; r < n; r++) {
            const int length = int(batch[r].tokens.size()), m = batch[r].ending_tokens;
            double sum = 0.0;
            for (int p = length - m - 1; p < length - 1; p++) sum += losses[r * T + size_t(p)];
            sums[first + r] = sum;
            counts[first + r] = m;
        }
    }
    double correct[3] = {0.0, 0.0, 0.0};  // by mean, by sum, and the examples cut
    for (size_t r = 0; r < rows.size(); r += hellaswag_endings) {
        std::array<double, hellaswag_endings> example_sums;
        std::array<int, hellaswag_endings> example_counts;
        for (int k = 0; k < hellaswag_endings; k++) {
            example_sums[size_t(k)] = sums[r + size_t(k)];
            example_counts[size_t(k)] = counts[r + size_t(k)];
        }
        const HellaSwagChoice choice = choose_ending(example_sums, example_counts);
        const HellaSwagExample& example = examples[size_t(rows[r][0])];
        correct[0] += choice.by_mean == example.label;
        correct[1] += choice.by_sum == example.label;
        for (int k = 0; k < hellaswag_endings; k++)
            if (hellaswag_row(example, k, T).cut) {
                correct[2] += 1;
                break;
            }
    }
    if (!model.part.head) std::fill_n(correct, 3, 0.0);  // another stage's losses
    dp_group.all_reduce_sum(correct, 3);
    if (stages) stages->all_reduce_sum(correct, 3);
    return {int(examples.size()), int(correct[0]), int(correct[1]), int(correct[2])};
}

}  // namespace tpsp
