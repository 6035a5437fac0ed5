// HellaSwag (data/hellaswag.h, train/hellaswag.h): the file's mistakes, the
// two choices from hand-made losses, and the scorer's choices against the
// losses computed here from the model's logits, one unpadded row at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "data/hellaswag.h"
#include "model/gpt.h"
#include "parallel/communicator.h"
#include "tests/scratch_dir.h"
#include "tests/test_support.h"
#include "train/hellaswag.h"

namespace fs = std::filesystem;
using tpsp::HellaSwagExample;

namespace {

std::vector<int> bytes_of(std::string_view text) { return std::vector<int>(text.begin(), text.end()); }

std::string read_error(const std::string& text) {
    const fs::path path = tpsp::testing::scratch_dir() / "hellaswag.jsonl";
    std::ofstream(path) << text;
    try {
        tpsp::read_hellaswag(path.string(), bytes_of);
    } catch (const tpsp::FileError& error) {
        const std::string line = error.what();
        return line.substr(line.find("hellaswag.jsonl:"));
    }
    return "read without an error";
}

}  // namespace

TEST(HellaSwag, TheFileIsReadAsLlmcEncodesIt) {
    const fs::path path = tpsp::testing::scratch_dir() / "hellaswag.jsonl";
    std::ofstream(path) << "{\"ctx\": \"Ab\", \"endings\": [\"c\", \"de\", \"f\", \"g\"], \"label\": 2, \"ind\": 7}\n"
                           "\n"
                           "{\"ctx\": \"x\", \"endings\": [\"1\", \"2\", \"3\", \"4\"], \"label\": 0}";
    const std::vector<HellaSwagExample> examples = tpsp::read_hellaswag(path.string(), bytes_of);
    ASSERT_EQ(examples.size(), 2u);
    EXPECT_EQ(examples[0].context, bytes_of("Ab"));
    EXPECT_EQ(examples[0].endings[1], bytes_of(" de"));  // a space before each ending
    EXPECT_EQ(examples[0].label, 2);
    EXPECT_EQ(examples[1].line, 3);
}

TEST(HellaSwag, AFileWithAMistakeIsOneLineNamingItsLineNumber) {
    const std::string good = "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\", \"d\", \"e\"], \"label\": 1}\n";
    std::string deep = good;  // (built step by step: GCC 12's -Wrestrict trips on the + chain)
    deep += "{\"ctx\": ";
    deep.append(3000, '[');
    deep.append(3000, ']');
    deep += "}\n";
    const std::pair<std::string, std::string> cases[] = {
        {good + "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\", \"d\", \"e\"], \"label\": 4}\n",
         "hellaswag.jsonl:2: label 4 is not an ending's index (0 to 3)"},
        {good + good + "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\", \"d\", \"e\"], \"label\": \"1\"}\n",
         "hellaswag.jsonl:3: no \"label\""},
        {"{\"endings\": [\"b\", \"c\", \"d\", \"e\"], \"label\": 1}\n", "hellaswag.jsonl:1: no \"ctx\""},
        {"{\"ctx\": \"a\", \"endings\": [\"b\", \"c\", \"d\"], \"label\": 1}\n", "hellaswag.jsonl:1: no \"endings\""},
        {"\n" + std::string("{\"ctx\": \"a\", \"endings\": [\"b\", \"\", \"d\", \"e\"], \"label\": 1}\n"),
         "hellaswag.jsonl:2: ending 1 is empty"},
        {"{\"ctx\": \"\", \"endings\": [\"b\", \"c\", \"d\", \"e\"], \"label\": 1}\n",
         "hellaswag.jsonl:1: \"ctx\" is empty"},
        {good + "{\"ctx\": \"a\", \"endings\": [\"b\", \"c\"\n", "hellaswag.jsonl:2: not a JSON object"},
        {"\n\n", "hellaswag.jsonl:1: no examples"},
        {deep, "hellaswag.jsonl:2: nests deeper than an example does"},
    };
    for (const auto& [text, line] : cases) {
        SCOPED_TRACE(text);
        const std::string error = read_error(text);
        EXPECT_EQ(error.rfind(line, 0), 0u) << error;
        EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    }
}

// acc: the lowest sum; acc_norm: the lowest mean; the first of equals.
TEST(HellaSwag, AccPicksTheLowestSumAndAccNormTheLowestMean) {
    // sums 4, 3, 9, 10 over 2, 1, 3, 2 tokens: means 2, 3, 3, 5
    tpsp::HellaSwagChoice choice = tpsp::choose_ending({4.0, 3.0, 9.0, 10.0}, {2, 1, 3, 2});
    EXPECT_EQ(choice.by_sum, 1);
    EXPECT_EQ(choice.by_mean, 0);
    choice = tpsp::choose_ending({6.0, 6.0, 3.0, 3.0}, {1, 1, 1, 1});
    EXPECT_EQ(choice.by_sum, 2);
    EXPECT_EQ(choice.by_mean, 2);
}

// The scorer packs rows into batches of b with padding and cuts long
// contexts; its choices must be those of each ending's losses computed here
// from a model of exactly that row: log-softmax of the logits, in double.
TEST(HellaSwag, TheScorersChoicesAreThoseOfTheLossesOfEachRowAlone) {
    tpsp::GPTConfig c;
    c.max_seq_len = 16, c.vocab_size = 61, c.padded_vocab_size = 64, c.num_layers = 2, c.num_heads = 2, c.channels = 16;
    const int T = c.max_seq_len;
    std::vector<HellaSwagExample> examples(3);
    const std::vector<int> tokens = tpsp::testing::random_tokens(200, c.vocab_size, 5);
    auto take = [&, at = size_t(0)](size_t n) mutable {
        std::vector<int> part(tokens.begin() + std::ptrdiff_t(at), tokens.begin() + std::ptrdiff_t(at + n));
        at += n;
        return part;
    };
    const size_t context_sizes[] = {3, 9, 24}, ending_sizes[][4] = {{1, 2, 3, 4}, {5, 1, 2, 7}, {3, 3, 1, 6}};
    for (size_t e = 0; e < examples.size(); e++) {
        examples[e].context = take(context_sizes[e]);  // the third's is cut: 24 + 6 > T + 1
        for (size_t k = 0; k < 4; k++) examples[e].endings[k] = take(ending_sizes[e][k]);
    }
    tpsp::GPT scorer(c, {3, T, 0.0f});  // 12 rows in batches of 3
    scorer.init_random(11);
    tpsp::Communicator alone;
    for (size_t e = 0; e < examples.size(); e++) {
        SCOPED_TRACE("example " + std::to_string(e));
        std::array<double, 4> sums{};
        std::array<int, 4> counts{};
        for (size_t k = 0; k < 4; k++) {
            std::vector<int> row = examples[e].context;
            row.insert(row.end(), examples[e].endings[k].begin(), examples[e].endings[k].end());
            if (row.size() > size_t(T) + 1) row.erase(row.begin(), row.end() - (T + 1));
            const int n = int(row.size()) - 1, m = int(examples[e].endings[k].size());
            tpsp::GPT alone_model(c, {1, n, 0.0f});
            alone_model.init_random(11);
            alone_model.forward(row.data(), row.data() + 1, {}, false);
            for (int p = n - m; p < n; p++) {  // position p predicts row[p + 1], a token of the ending
                const float* logits = alone_model.outside.logits + size_t(p) * c.padded_vocab_size;
                double most = logits[0], sum = 0.0;
                for (int v = 1; v < c.vocab_size; v++) most = std::max(most, double(logits[v]));
                for (int v = 0; v < c.vocab_size; v++) sum += std::exp(double(logits[v]) - most);
                sums[k] += most + std::log(sum) - double(logits[row[size_t(p) + 1]]);
            }
            counts[k] = m;
        }
        int by_sum = 0, by_mean = 0;
        for (int k = 1; k < 4; k++) {
            if (sums[size_t(k)] < sums[size_t(by_sum)]) by_sum = k;
            if (sums[size_t(k)] / counts[size_t(k)] < sums[size_t(by_mean)] / counts[size_t(by_mean)]) by_mean = k;
        }
        for (int label = 0; label < 4; label++) {
            HellaSwagExample labelled = examples[e];
            labelled.label = label;
            // as DP rank 1 of 2, this rank scores the second example only: its 4 rows across two batches of 3
            const std::vector<HellaSwagExample> pair = {examples[(e + 1) % 3], labelled};
            const tpsp::HellaSwagScore score = tpsp::score_hellaswag(scorer, pair, 1, 2, alone);
            EXPECT_EQ(score.correct_by_sum, label == by_sum) << "label " << label;
            EXPECT_EQ(score.correct_by_mean, label == by_mean) << "label " << label;
            EXPECT_EQ(score.cut, e == 2 ? 1 : 0);
        }
    }
}
