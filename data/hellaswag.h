// HellaSwag (Zellers et al. 2019) in its published JSON-lines form: one
// example a line, {"ctx": "...", "endings": ["...", "...", "...", "..."],
// "label": 0..3, ...} (the other fields are not read). Each example becomes
// the tokens of its context and of its four endings as llm.c's
// dev/data/hellaswag.py makes them: the context's tokens, and each ending's
// tokens with a space before it (" " + ending), encoded on its own.
#pragma once
#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tpsp {

constexpr int hellaswag_endings = 4;

struct HellaSwagExample {
    std::vector<int> context;
    std::array<std::vector<int>, hellaswag_endings> endings;
    int label = 0;  // the index of the right ending
    int line = 0;   // of the file, for errors
};

// Reads the file, encoding text with `encode`. A line that is not such an
// example (not JSON, a missing field, a label outside 0..3, an empty
// context or ending, text the tokenizer refuses), or a file with no example, is a FileError "PATH:LINE: what is
// wrong". Blank lines are skipped.
std::vector<HellaSwagExample> read_hellaswag(const std::string& path,
                                             const std::function<std::vector<int>(std::string_view)>& encode);

// The model's choices for one example from its endings' losses: each
// ending's sum of the cross-entropies of its tokens, and their count. acc
// picks the lowest sum, acc_norm the lowest mean (llm.c's two figures); the
// first of equal ones wins.
struct HellaSwagChoice {
    int by_sum = 0, by_mean = 0;
};
HellaSwagChoice choose_ending(const std::array<double, hellaswag_endings>& loss_sums,
                              const std::array<int, hellaswag_endings>& token_counts);

}  // namespace tpsp
