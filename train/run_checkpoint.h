// A training run on disk: per saved step, llm.c's model file (model_N.bin,
// the whole model, readable by llm.c) beside tpsp's state file (state_N.bin:
// the step, the data loader's position and its batch shape, AdamW's moments), and `latest`
// naming the last complete pair. Both files record their CRC-32C, checked
// on every read (common/checksum.h), and hold the whole model in llm.c's
// order, independent of t: a run saved at one TP size resumes at any other.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/files.h"
#include "model/checkpoint.h"
#include "model/gpt.h"
#include "parallel/process_grid.h"
#include "train/adamw.h"
#include "train/run_directory.h"

namespace tpsp {

// state_N.bin, n = the whole model's parameter count:
//   int64 magic, step, loader position, n,                 64 bytes
//         train.batch_size, train.seq_len, dp, 0
//   AdamW's m [n] fp32, then v [n] fp32                   8n bytes, llm.c's order
//   uint32 CRC-32C of all the bytes above                  4 bytes
constexpr int64_t state_magic = 0x7470737073746133;  // "tpspsta3"
constexpr uintmax_t state_header_bytes = 64;
// Earlier state files of tpsp, which a resume refuses with one line: without
// the data's shape (a 32-byte header), and before that without the checksum.
constexpr int64_t state_magic_without_data_shape = 0x7470737073746132;  // "tpspsta2"
constexpr int64_t state_magic_without_checksum = 0x7470737073746174;    // "tpspstat"

inline uintmax_t state_file_bytes(int64_t n) { return state_header_bytes + uintmax_t(n) * 8 + 4; }

// Where the data loader stands, and the shape that gives its position a
// meaning: batch k of DP rank r starts at token (k·dp + r)·b·s of its shard
// (data/token_shards.h), so a resume with another b, s or dp would skip or
// repeat tokens.
struct DataPosition {
    int64_t batches_read = 0;
    int64_t batch_size = 0, seq_len = 0, dp = 0;
};

// A state file's size and the CRC-32C it records after its last byte, in
// one line, for ranks to compare (a FileError if it cannot be read).
inline std::string state_file_identity(const std::string& path) {
    check_regular_input(path, "state file");  // a FIFO would block the open
    std::error_code error;
    const uintmax_t bytes = std::filesystem::file_size(path, error);
    uint32_t crc = 0;
    std::ifstream in(path, std::ios::binary);
    if (error || bytes < 4 || !in.seekg(std::streamoff(bytes - 4)) || !in.read(reinterpret_cast<char*>(&crc), 4))
        throw FileError(path + ": cannot read its recorded CRC-32C");
    char crc_text[16];
    std::snprintf(crc_text, sizeof crc_text, "%08x", crc);
    return std::to_string(bytes) + " bytes, CRC-32C " + crc_text;
}

inline std::string step_file(const std::string& dir, const char* stem, int step) {
    char name[64];
    std::snprintf(name, sizeof name, "/%s_%08d.bin", stem, step);
    return dir + name;
}

// Assembles the whole model's tensor from the shards of one TP group, on the
// host, and under a pipeline from every stage's part: each stage's TP rank 0
// of replica 0 assembles its part, and world rank 0 (stage 0's) receives the
// others' in stage order. stage_parts: every stage's part (pipeline_part),
// empty without a pipeline.
template <class Backend>
class ShardGatherer {
public:
    ShardGatherer(const GPTModel<Backend>& model, ProcessGrid& grid, std::vector<ModelPart> stage_parts = {})
        : model_(model), grid_(grid), stage_parts_(std::move(stage_parts)),
          full_(size_t(full_parameter_count(model.config))), local_(size_t(model.num_parameters)),
          shards_(size_t(model.num_parameters) * grid.tp) {}
    // Where gather() assembles the whole model (the same buffer every time).
    const float* full() const { return full_.data(); }
    // Collective over the TP group of replica 0 of every stage; the result is valid on world rank 0.
    // local: this rank's shard, in the backend's memory.
    const float* gather(const float* local) {
        Backend::download(local_.data(), local, local_.size() * sizeof(float));
        return gather_local();
    }
    // This rank's shard on the host, for a caller that assembles it there itself; then gather_local().
    float* local() { return local_.data(); }
    const float* gather_local() {
        grid_.tp_group.gather(local_.data(), shards_.data(), size_t(model_.num_parameters), 0);
        if (grid_.tp_rank != 0) return full_.data();
        for (int r = 0; r < grid_.tp; r++)
            copy_parameter_shards(model_.config, grid_.tp, r, model_.part, full_.data(),
                                  shards_.data() + size_t(r) * model_.num_parameters, ShardDirection::shard_to_full);
        if (grid_.pp > 1) gather_stages();
        return full_.data();
    }

private:
    // stage q's part of its full_, into stage 0's (the tied wte: the last stage's copy is the same bits)
    void gather_stages() {
        Communicator& stages = grid_.stage_group;
        const size_t n = full_.size();
        if (grid_.pp_rank != 0) {
            Communicator::Transfer sent = stages.start_send(full_.data(), n, 0, 0);
            stages.wait(sent);
            return;
        }
        std::vector<float> theirs(n), part;
        for (int q = 1; q < grid_.pp; q++) {
            Communicator::Transfer received = stages.start_receive(theirs.data(), n, q, 0, "checkpoint gather");
            stages.wait(received);
            const ModelPart& p = stage_parts_[size_t(q)];
            ParameterTensors unused{};
            part.assign(table_bytes(parameter_table(model_.config, 1, p, &unused)) / sizeof(float), 0.0f);
            copy_parameter_shards(model_.config, 1, 0, p, theirs.data(), part.data(), ShardDirection::full_to_shard);
            copy_parameter_shards(model_.config, 1, 0, p, full_.data(), part.data(), ShardDirection::shard_to_full);
        }
    }

    const GPTModel<Backend>& model_;
    ProcessGrid& grid_;
    std::vector<ModelPart> stage_parts_;
    std::vector<float> full_, local_, shards_;
};

// A file a save is about to replace (one of a timeline that a rewound
// `latest` left), kept under a temporary name by a hard link until the save
// is whole, so that a failed save can put it back.
class KeptFile {
public:
    explicit KeptFile(const std::string& path)
        : path_(path), copy_(path + ".old" + temporary_infix + std::to_string(::getpid())) {
        std::remove(copy_.c_str());
        kept_ = ::link(path.c_str(), copy_.c_str()) == 0;  // fails where there is no such file
    }
    // the save failed after this file was replaced: the old one is back (or, with none, the new one gone)
    void put_back() const {
        if (!kept_ || std::rename(copy_.c_str(), path_.c_str()) != 0) std::remove(path_.c_str());
    }
    void drop() const {
        if (kept_) std::remove(copy_.c_str());
    }

private:
    std::string path_, copy_;
    bool kept_ = false;
};

// The two files of a save under their names, then `latest` naming them; a
// failure on the way (a full disk met when a file is flushed, synced or
// renamed) takes back what was committed, and puts back a file of the same
// step that it replaced, so the directory is as it was before the save began.
inline void commit_pair(AtomicFile& model_file, AtomicFile& state, const std::string& model_path,
                        const std::string& state_path, const std::string& dir, int step) {
    const KeptFile old_model(model_path), old_state(state_path);
    bool model_committed = false, state_committed = false;
    try {
        model_file.commit();
        model_committed = true;
        state.commit();
        state_committed = true;
        const std::string latest = std::to_string(step) + "\n";
        write_file_atomically(dir + "/latest", {{latest.data(), latest.size()}});  // last: the pair is complete
    } catch (const FileError&) {
        if (state_committed) old_state.put_back();
        if (model_committed) old_model.put_back();
        old_model.drop();
        old_state.drop();
        throw;
    }
    old_model.drop();
    old_state.drop();
}

// Saves step `step` into dir: the model file, the state file, then `latest`.
// Collective over the TP group of replica 0 (dp rank 0, cp rank 0: every
// replica holds the same model); world rank 0 writes. Weights or
// moments that are not finite are never written: the two files are
// committed under their names together, once both are whole and finite. The
// writer's first error (a FileError) is thrown after the last gather, so
// that no rank of the group is left waiting in one.
// With the distributed optimizer the moments are first assembled from the
// replicas' pieces (dp_group: the replica group, dp × cp; collective over
// it): the file holds the whole state, whatever dp, cp and the optimizer,
// and resumes under any.
template <class Backend>
void save_run(const std::string& dir, GPTModel<Backend>& model, const AdamWOptimizer<Backend>& opt, ProcessGrid& grid,
              ShardGatherer<Backend>& gatherer, int step, const DataPosition& data, typename Backend::Comm& dp_group) {
    // one moment of this rank's TP shard assembled from the replicas' pieces, in the gatherer's host buffer
    const auto assemble = [&](const float* moment) { opt.gather_moment(moment, gatherer.local(), dp_group.host()); };
    if (grid.replica_rank != 0) {  // every DP (and CP) replica holds the same model
        if (opt.sharded())
            for (const float* moment : {opt.m, opt.v}) assemble(moment);  // its part of the DP gathers
        return;
    }
    const int64_t n = full_parameter_count(model.config);
    std::string error;
    auto on_writer = [&](auto&& write) {
        if (grid.world_rank != 0 || !error.empty()) return;
        try {
            write();
        } catch (const FileError& e) {
            error = e.what();
        }
    };
    const std::string model_path = step_file(dir, "model", step), state_path = step_file(dir, "state", step);
    std::unique_ptr<AtomicFile> model_file, state;
    const float* params = gatherer.gather(model.params.wte);
    on_writer([&] {
        check_finite_parameters(model.config, params, model_path + ": not written", "the weights");
        model_file = std::make_unique<AtomicFile>(model_path);
        write_checkpoint(model.config, params, *model_file);
    });
    // the moments pass through the gatherer's one buffer in turn
    Crc32c state_crc;
    on_writer([&] {
        state = std::make_unique<AtomicFile>(state_path);
        const int64_t head[8] = {state_magic, step, data.batches_read, n, data.batch_size, data.seq_len, data.dp, 0};
        state->write(head, sizeof head);
        state_crc.update(head, sizeof head);
    });
    for (const auto& moment : {std::pair{opt.m, "AdamW's m"}, std::pair{opt.v, "AdamW's v"}}) {
        if (opt.sharded()) assemble(moment.first);
        const float* full = opt.sharded() ? gatherer.gather_local() : gatherer.gather(moment.first);
        const char* name = moment.second;  // a plain variable: clang 14 (the fuzz build) captures no bindings
        on_writer([&] {
            check_finite_parameters(model.config, full, state_path + ": not written", name);
            state->write(full, size_t(n) * 4);
            state_crc.update(full, size_t(n) * 4);
        });
    }
    on_writer([&] {
        const uint32_t crc = state_crc.value();
        state->write(&crc, sizeof crc);
        commit_pair(*model_file, *state, model_path, state_path, dir, step);
    });
    if (!error.empty()) throw FileError(error);
}

// This rank's shard of a checkpoint's weights, into the model.
template <class Backend>
void load_weights(GPTModel<Backend>& model, const std::string& path) {
    std::vector<float> shard(static_cast<size_t>(model.num_parameters));
    read_checkpoint_shard(model.config, model.tp.size, model.tp.rank, path, shard.data(), &model.part);
    Backend::upload(model.params.wte, shard.data(), shard.size() * sizeof(float));
}

struct ResumedRun {
    int step;
    DataPosition data;
};

// The run saved in dir, at its `latest` step, into the model and optimizer (this rank's shards).
template <class Backend>
ResumedRun load_run(const std::string& dir, GPTModel<Backend>& model, AdamWOptimizer<Backend>& opt) {
    const int step = latest_step(dir);
    if (step < 0) throw FileError(dir + "/latest: missing or unreadable: not a tpsp run directory");
    load_weights(model, step_file(dir, "model", step));
    const std::string path = step_file(dir, "state", step);
    const int64_t n = full_parameter_count(model.config);
    check_regular_input(path, "state file");
    std::ifstream in(path, std::ios::binary);
    int64_t head[8] = {};
    if (in.read(reinterpret_cast<char*>(head), 8) &&
        (head[0] == state_magic_without_checksum || head[0] == state_magic_without_data_shape))
        throw FileError(path + ": optimizer state of an earlier tpsp, which recorded no " +
                        (head[0] == state_magic_without_checksum ? "checksum" : "shape of its data") +
                        ": this one cannot resume it; start from its weights with checkpoint.init=" +
                        step_file(dir, "model", step));
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec), expected = state_file_bytes(n);
    if (ec || size != expected)
        throw FileError(path + ": optimizer state is " + std::to_string(ec ? 0 : size) + " bytes, expected " +
                        std::to_string(expected));
    uint32_t recorded = 0;
    in.seekg(std::streamoff(expected - 4));
    in.read(reinterpret_cast<char*>(&recorded), 4);
    check_crc32c(path, crc32c_of_file(path, expected - 4), recorded,
                 "its last 4 bytes");  // before anything is believed
    in.seekg(0);
    in.read(reinterpret_cast<char*>(head), sizeof head);
    if (head[0] != state_magic || head[1] != step || head[3] != n)
        throw FileError(path + ": not the optimizer state of step " + std::to_string(step) + " of this model");
    std::vector<float> full(static_cast<size_t>(n)), shard(static_cast<size_t>(model.num_parameters));
    for (const auto& [moment, name] : {std::pair{opt.m, "AdamW's m"}, std::pair{opt.v, "AdamW's v"}}) {
        in.read(reinterpret_cast<char*>(full.data()), n * 4);
        if (!in) throw FileError(path + ": optimizer state is truncated");
        check_finite_parameters(model.config, full.data(), path, name);
        copy_parameter_shards(model.config, model.tp.size, model.tp.rank, model.part, full.data(), shard.data(),
                              ShardDirection::full_to_shard);
        if (opt.sharded()) opt.scatter_moment(shard.data(), moment);
        else Backend::upload(moment, shard.data(), shard.size() * sizeof(float));
    }
    return {step, {head[2], head[4], head[5], head[6]}};
}

}  // namespace tpsp
