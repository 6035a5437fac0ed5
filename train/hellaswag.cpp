#include "train/hellaswag.h"

#include <filesystem>
#include <memory>

#include "common/checksum.h"

#include "data/gpt2_tokenizer.h"

namespace tpsp {

std::string hellaswag_line(const HellaSwagScore& score) {
    char line[160];
    std::snprintf(line, sizeof(line), "hellaswag: acc_norm %d/%d (%.2f %%) | acc %d/%d (%.2f %%)",
                  score.correct_by_mean, score.examples, 100.0 * score.correct_by_mean / score.examples,
                  score.correct_by_sum, score.examples, 100.0 * score.correct_by_sum / score.examples);
    return line;
}

std::vector<HellaSwagExample> load_hellaswag(const std::string& path, int vocab_size, const std::string& bpe_dir,
                                             int seq_len) {
    std::unique_ptr<GPT2Tokenizer> gpt2;
    if (vocab_size != 256) {
        gpt2 = std::make_unique<GPT2Tokenizer>(bpe_dir);
        if (gpt2->vocab_size() != vocab_size)
            throw FileError(bpe_dir + ": GPT-2's tokenizer of " + std::to_string(gpt2->vocab_size()) +
                            " tokens, the model has " + std::to_string(vocab_size));
    }
    const auto encode = [&](std::string_view text) {
        if (gpt2) return gpt2->encode(text);
        std::vector<int> bytes;
        for (unsigned char c : text) bytes.push_back(c);
        return bytes;
    };
    std::vector<HellaSwagExample> examples = read_hellaswag(path, encode);
    check_hellaswag_fits(path, examples, seq_len);
    return examples;
}

std::string hellaswag_input_lines(const std::string& path, int vocab_size, const std::string& bpe_dir) {
    std::vector<std::string> paths = {path};
    if (vocab_size != 256)
        for (const char* name : {"encoder.json", "vocab.bpe"})
            paths.push_back((std::filesystem::path(bpe_dir) / name).string());
    std::string lines;
    for (const std::string& file : paths) {
        std::error_code error;
        const uintmax_t bytes = std::filesystem::file_size(file, error);
        try {
            if (error) throw FileError("cannot read its size");
            char crc[16];
            std::snprintf(crc, sizeof(crc), "%08x", crc32c_of_file(file, bytes));
            lines += file + ": " + std::to_string(bytes) + " bytes, CRC-32C " + crc + "\n";
        } catch (const FileError& e) {
            lines += file + ": unreadable (" + e.what() + ")\n";
        }
    }
    return lines;
}

int hellaswag_cut_examples(const std::vector<HellaSwagExample>& examples, int seq_len) {
    int cut = 0;
    for (const HellaSwagExample& e : examples)
        for (int k = 0; k < hellaswag_endings; k++)
            if (hellaswag_row(e, k, seq_len).cut) {
                cut++;
                break;
            }
    return cut;
}

void check_hellaswag_fits(const std::string& path, const std::vector<HellaSwagExample>& examples, int seq_len) {
    for (const HellaSwagExample& e : examples)
        for (int k = 0; k < hellaswag_endings; k++)
            if (int(e.endings[size_t(k)].size()) > seq_len)
                throw FileError(path + ":" + std::to_string(e.line) + ": ending " + std::to_string(k) + " is " +
                                std::to_string(e.endings[size_t(k)].size()) + " tokens: more than train.seq_len = " +
                                std::to_string(seq_len) + " positions after one token of context");
}

HellaSwagRow hellaswag_row(const HellaSwagExample& example, int ending, int seq_len) {
    const std::vector<int>& end = example.endings[size_t(ending)];
    HellaSwagRow row;
    row.ending_tokens = int(end.size());
    const size_t keep = std::min(example.context.size(), size_t(seq_len) + 1 - end.size());
    row.cut = keep < example.context.size();
    row.tokens.assign(example.context.end() - std::ptrdiff_t(keep), example.context.end());
    row.tokens.insert(row.tokens.end(), end.begin(), end.end());
    return row;
}

}  // namespace tpsp
