// What the end-to-end tests share: running the tpsp executable on the
// prepared corpus in a fresh directory per test, and reading what it wrote.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/scratch_dir.h"

namespace tpsp::e2e {

namespace fs = std::filesystem;

inline const std::string tpsp_binary = TPSP_BINARY;
inline const std::string corpus = TPSP_CORPUS;
inline const std::string tiny = std::string(TPSP_SOURCE_DIR) + "/configs/tiny.yaml";

struct Outcome {
    int exit_code;
    std::string out, err;
};

inline std::string read_text(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

using tpsp::testing::scratch_dir;  // a fresh directory per test, under the build tree

inline Outcome run(const std::string& args, const fs::path& dir) {
    fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
    std::string command = args + " > " + out.string() + " 2> " + err.string();
    int status = std::system(command.c_str());
    Outcome r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
    fs::remove(out);
    fs::remove(err);
    return r;
}

// The tiny config on the prepared corpus, writing into dir.
inline std::string tiny_train(const fs::path& dir, const std::string& extra) {
    return tpsp_binary + " train " + tiny + " data.train='" + corpus + "/train_*.bin' data.val='" + corpus +
           "/val_*.bin' checkpoint.dir=" + (dir / "ckpt").string() +
           " logging.metrics=" + (dir / "metrics.jsonl").string() + " train.threads=2 logging.every=1000 " + extra;
}

// The field `name` of each line of a metrics file that has it, as written
// (the number's shortest round-trip text). Every line must be valid JSON.
inline std::vector<std::string> field(const fs::path& metrics, const std::string& name) {
    std::vector<std::string> values;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json record = nlohmann::json::parse(line);  // throws on a line that is not JSON
        if (record.contains(name)) values.push_back(record[name].dump());
    }
    return values;
}

inline int count_lines(const std::string& text) { return int(std::count(text.begin(), text.end(), '\n')); }

inline fs::path write_file(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
    return path;
}

}  // namespace tpsp::e2e
