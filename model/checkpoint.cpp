#include "model/checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/checksum.h"
#include "common/files.h"

namespace tpsp {

static std::string describe(const GPTConfig& c) {
    return "maxT=" + std::to_string(c.max_seq_len) + " V=" + std::to_string(c.vocab_size) +
           " Vp=" + std::to_string(c.padded_vocab_size) + " L=" + std::to_string(c.num_layers) +
           " heads=" + std::to_string(c.num_heads) + " C=" + std::to_string(c.channels);
}

GPTConfig read_checkpoint_config(const std::string& path) {
    FILE* f = open_input_file(path, "checkpoint");
    int header[256];
    size_t got = std::fread(header, sizeof(int), 256, f);
    std::fclose(f);
    if (got != 256)
        throw FileError(path + ": truncated checkpoint header (" + std::to_string(got * 4) + " of 1024 bytes)");
    if (header[0] != checkpoint_magic)
        throw FileError(path + ": not an llm.c GPT-2 checkpoint (magic " + std::to_string(header[0]) + ", expected " +
                        std::to_string(checkpoint_magic) + ")");
    if (header[1] != checkpoint_version)
        throw FileError(path + ": checkpoint version " + std::to_string(header[1]) + " is not supported (need " +
                        std::to_string(checkpoint_version) + ": fp32 with padded vocabulary)");
    GPTConfig c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 ||
        c.padded_vocab_size < c.vocab_size || c.channels % c.num_heads != 0)
        throw FileError(path + ": checkpoint header describes an impossible model (" + describe(c) + ")");
    if (c.channels > ModelLimits::channels || c.num_layers > ModelLimits::layers ||
        c.max_seq_len > ModelLimits::seq_len || c.padded_vocab_size > ModelLimits::padded_vocab)
        throw FileError(path + ": checkpoint header describes a model beyond tpsp's limits (" + describe(c) + ")");
    // the size the header implies, checked before anything is allocated for it
    const uintmax_t expected = 1024 + uintmax_t(full_parameter_count(c)) * 4;
    std::error_code ec;
    const uintmax_t actual = std::filesystem::file_size(path, ec);
    if (ec || actual != expected)
        throw FileError(path + ": checkpoint is " + std::to_string(actual) + " bytes, its header says " +
                        std::to_string(expected) + (actual < expected ? " (truncated)" : " (trailing data)"));
    return c;
}

// Throws unless the checkpoint's model c is the model m.
static void check_same_model(const std::string& path, const GPTConfig& c, const GPTConfig& m) {
    if (c.max_seq_len != m.max_seq_len || c.vocab_size != m.vocab_size || c.num_layers != m.num_layers ||
        c.num_heads != m.num_heads || c.channels != m.channels || c.padded_vocab_size != m.padded_vocab_size)
        throw FileError(path + ": checkpoint is for another model (" + describe(c) + "; the config says " +
                        describe(m) + ")");
}

void check_checkpoint_model(const std::string& path, const GPTConfig& m) {
    check_same_model(path, read_checkpoint_config(path), m);
}

int64_t full_parameter_count(const GPTConfig& config) {
    ParameterTensors unused{};
    return int64_t(table_bytes(parameter_table(config, 1, &unused)) / 4);
}

void load_checkpoint(GPT& model, const std::string& path) {
    read_checkpoint_shard(model.config, model.tp.size, model.tp.rank, path, model.params.wte, &model.part);
}

void read_checkpoint_shard(const GPTConfig& config, int t, int rank, const std::string& path, float* shard,
                           const ModelPart* part) {
    const GPTConfig c = read_checkpoint_config(path);  // its header bounded, the file's size checked against it
    uint32_t header[256];
    std::vector<float> full(static_cast<size_t>(full_parameter_count(c)));
    FILE* f = open_input_file(path, "checkpoint");
    const bool whole = std::fread(header, 4, 256, f) == 256 &&
                       std::fread(full.data(), 4, full.size(), f) == full.size();
    std::fclose(f);
    if (!whole) throw FileError(path + ": checkpoint is truncated");
    verify_llmc_file(path, header, full.data(), full.size() * 4);  // before anything of it is believed
    check_same_model(path, c, config);
    check_finite_parameters(config, full.data(), path, "the weights");
    copy_parameter_shards(config, t, rank, part ? *part : whole_model(config), full.data(), shard,
                          ShardDirection::full_to_shard);
}

void check_finite_parameters(const GPTConfig& config, const float* full, const std::string& path,
                             const std::string& what) {
    ParameterTensors unused{};
    int64_t offset = 0;
    for (const TensorSpec& tensor : parameter_table(config, 1, &unused)) {
        for (int64_t i = 0; i < tensor.elements(); i++) {
            const float x = full[offset + i];
            if (std::isfinite(x)) continue;
            throw FileError(path + ": tensor " + tensor.name + " of " + what + " holds " +
                            (std::isnan(x) ? "nan" : "inf") + " at element " + std::to_string(i));
        }
        offset += tensor.elements();
    }
}

void write_checkpoint(const GPTConfig& c, const float* full, AtomicFile& file) {
    int header[256] = {};
    header[0] = checkpoint_magic;
    header[1] = checkpoint_version;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    const size_t bytes = size_t(full_parameter_count(c)) * 4;
    seal_llmc_header(reinterpret_cast<uint32_t*>(header), full, bytes);
    file.write(header, sizeof header);
    file.write(full, bytes);
}

void save_checkpoint(const GPTConfig& config, const float* full, const std::string& path) {
    AtomicFile file(path);
    write_checkpoint(config, full, file);
    file.commit();
}

}  // namespace tpsp
