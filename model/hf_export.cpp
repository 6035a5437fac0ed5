#include "model/hf_export.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "model/checkpoint.h"
#include "model/gpt.h"

namespace tpsp {

namespace {

namespace fs = std::filesystem;

// One tensor of the export: `rows` × `cols` values from `offset` of the
// llm.c buffer, written as they are or transposed ([cols, rows]: a Conv1D
// weight), under `shape`.
struct HfTensor {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset, rows, cols;
    bool transpose;
};

// Where each llm.c tensor starts in the whole model's buffer.
std::map<std::string, int64_t> llmc_offsets(const GPTConfig& config) {
    std::map<std::string, int64_t> offsets;
    ParameterTensors unused{};
    int64_t at = 0;
    for (const TensorSpec& tensor : parameter_table(config, 1, &unused)) {
        offsets[tensor.name] = at;
        at += tensor.elements();
    }
    return offsets;
}

// transformers' GPT-2 tensors, from the llm.c buffer.
std::vector<HfTensor> hf_tensors(const GPTConfig& c) {
    const std::map<std::string, int64_t> at = llmc_offsets(c);
    const int64_t C = c.channels, V = c.vocab_size, T = c.max_seq_len;
    std::vector<HfTensor> tensors = {
        {"transformer.wte.weight", {V, C}, at.at("wte"), V, C, false},  // the padded rows stay behind
        {"transformer.wpe.weight", {T, C}, at.at("wpe"), T, C, false},
        {"transformer.ln_f.weight", {C}, at.at("lnfw"), 1, C, false},
        {"transformer.ln_f.bias", {C}, at.at("lnfb"), 1, C, false},
    };
    // per layer: (HF name, llm.c name, llm.c's [out, in] of a Conv1D weight; 0 for a vector of `in`)
    struct Part {
        const char *hf, *llmc;
        int64_t out, in;
    };
    const Part parts[] = {
        {"ln_1.weight", "ln1w", 0, C},
        {"ln_1.bias", "ln1b", 0, C},
        {"attn.c_attn.weight", "qkvw", 3 * C, C},
        {"attn.c_attn.bias", "qkvb", 0, 3 * C},
        {"attn.c_proj.weight", "attprojw", C, C},
        {"attn.c_proj.bias", "attprojb", 0, C},
        {"ln_2.weight", "ln2w", 0, C},
        {"ln_2.bias", "ln2b", 0, C},
        {"mlp.c_fc.weight", "fcw", 4 * C, C},
        {"mlp.c_fc.bias", "fcb", 0, 4 * C},
        {"mlp.c_proj.weight", "fcprojw", C, 4 * C},
        {"mlp.c_proj.bias", "fcprojb", 0, C},
    };
    for (int l = 0; l < c.num_layers; l++)
        for (const Part& p : parts) {
            const std::string name = "transformer.h." + std::to_string(l) + "." + p.hf;
            if (p.out == 0) {
                tensors.push_back({name, {p.in}, at.at(p.llmc) + l * p.in, 1, p.in, false});
            } else {  // llm.c [out, in] → Conv1D [in, out]
                tensors.push_back({name, {p.in, p.out}, at.at(p.llmc) + l * p.out * p.in, p.out, p.in, true});
            }
        }
    // safetensors' order: by dtype (one here), then by name
    std::sort(tensors.begin(), tensors.end(), [](const HfTensor& a, const HfTensor& b) { return a.name < b.name; });
    return tensors;
}

// fp32 → bf16, rounded to nearest even (the weights are finite: checked on reading)
uint16_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// The tensor's values in its export layout, as bytes of the dtype.
std::vector<char> tensor_bytes(const HfTensor& t, const float* full, ExportDtype dtype) {
    const int64_t n = t.rows * t.cols;
    std::vector<float> values(static_cast<size_t>(n));
    const float* src = full + t.offset;
    for (int64_t r = 0; r < t.rows; r++)
        for (int64_t k = 0; k < t.cols; k++)
            values[size_t(t.transpose ? k * t.rows + r : r * t.cols + k)] = src[r * t.cols + k];
    std::vector<char> bytes;
    if (dtype == ExportDtype::float32) {
        bytes.resize(size_t(n) * 4);
        std::memcpy(bytes.data(), values.data(), bytes.size());
    } else {
        bytes.resize(size_t(n) * 2);
        for (int64_t i = 0; i < n; i++) {
            const uint16_t b = bf16_bits(values[size_t(i)]);
            std::memcpy(bytes.data() + 2 * i, &b, 2);
        }
    }
    return bytes;
}

int64_t element_bytes(ExportDtype dtype) { return dtype == ExportDtype::float32 ? 4 : 2; }

// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string safetensors_header(const std::vector<HfTensor>& tensors, ExportDtype dtype) {
    std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
    const char* dtype_name = dtype == ExportDtype::float32 ? "F32" : "BF16";
    int64_t offset = 0;
    for (const HfTensor& t : tensors) {
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); i++) {
            if (i > 0) shape += ',';
            shape += std::to_string(t.shape[i]);
        }
        const int64_t end = offset + t.rows * t.cols * element_bytes(dtype);
        json += ",\"" + t.name + "\":{\"dtype\":\"" + dtype_name + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
                std::to_string(offset) + "," + std::to_string(end) + "]}";
        offset = end;
    }
    json += "}";
    json.append((8 - json.size() % 8) % 8, ' ');
    return json;
}

void write_safetensors(const std::string& path, const float* full, const std::vector<HfTensor>& tensors,
                       ExportDtype dtype) {
    const std::string header = safetensors_header(tensors, dtype);
    AtomicFile file(path);
    uint64_t length = header.size();
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = uint8_t(length >> (8 * i));
    file.write(le, 8);
    file.write(header.data(), header.size());
    for (const HfTensor& t : tensors) {
        const std::vector<char> bytes = tensor_bytes(t, full, dtype);
        file.write(bytes.data(), bytes.size());
    }
    file.commit();
}

// GPT2Config's keys (transformers' names; the dropouts are GPT-2's, for a
// user who fine-tunes it there; evaluation turns them off).
std::string config_json(const GPTConfig& c, ExportDtype dtype) {
    const std::string eos = c.vocab_size == 50257 ? "50256" : "null";  // GPT-2's <|endoftext|>
    const auto n = [](int v) { return std::to_string(v); };
    return "{\n"
           "  \"activation_function\": \"gelu_new\",\n"
           "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
           "  \"attn_pdrop\": 0.1,\n"
           "  \"bos_token_id\": " +
           eos +
           ",\n"
           "  \"embd_pdrop\": 0.1,\n"
           "  \"eos_token_id\": " +
           eos +
           ",\n"
           "  \"initializer_range\": 0.02,\n"
           "  \"layer_norm_epsilon\": 1e-05,\n"
           "  \"model_type\": \"gpt2\",\n"
           "  \"n_ctx\": " +
           n(c.max_seq_len) +
           ",\n"
           "  \"n_embd\": " +
           n(c.channels) +
           ",\n"
           "  \"n_head\": " +
           n(c.num_heads) +
           ",\n"
           "  \"n_inner\": null,\n"
           "  \"n_layer\": " +
           n(c.num_layers) +
           ",\n"
           "  \"n_positions\": " +
           n(c.max_seq_len) +
           ",\n"
           "  \"resid_pdrop\": 0.1,\n"
           "  \"scale_attn_weights\": true,\n"
           "  \"tie_word_embeddings\": true,\n"
           "  \"torch_dtype\": \"" +
           std::string(dtype == ExportDtype::float32 ? "float32" : "bfloat16") +
           "\",\n"
           "  \"vocab_size\": " +
           n(c.vocab_size) +
           "\n"
           "}\n";
}

std::string generation_config_json(const GPTConfig& c) {
    const std::string eos = c.vocab_size == 50257 ? "50256" : "null";
    return "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": " + eos + ",\n  \"eos_token_id\": " + eos + "\n}\n";
}

void write_text(const std::string& path, const std::string& text) {
    AtomicFile file(path);
    file.write(text.data(), text.size());
    file.commit();
}

}  // namespace

std::string export_hugging_face(const std::string& checkpoint, const std::string& out_dir,
                                const ExportOptions& options) {
    const GPTConfig config = read_checkpoint_config(checkpoint);
    // GPT-2's BPE files: OpenAI's encoder.json and vocab.bpe are transformers' vocab.json and merges.txt
    std::vector<std::pair<fs::path, std::string>> copies;
    if (config.vocab_size == 50257) {
        for (const auto& [from, to] : {std::pair{"encoder.json", "vocab.json"}, std::pair{"vocab.bpe", "merges.txt"}}) {
            const fs::path source = fs::path(options.tokenizer_dir) / from;
            if (!fs::is_regular_file(source))
                throw FileError(source.string() +
                                ": missing: a model of GPT-2's vocabulary exports its tokenizer "
                                "files; give --tokenizer-dir (scripts/fetch_gpt2_tokenizer.sh fetches them)");
            copies.push_back({source, to});
        }
    }
    std::vector<std::string> outputs = {"model.safetensors", "config.json", "generation_config.json"};
    for (const auto& copy : copies) outputs.push_back(copy.second);
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (!fs::is_directory(out_dir)) throw FileError(out_dir + ": cannot make the export's directory");
    for (const std::string& name : outputs) {
        const fs::path path = fs::path(out_dir) / name;
        if (fs::exists(fs::symlink_status(path)) && !options.replace)
            throw FileError(path.string() + ": exists (an earlier export?): give --replace to overwrite it");
    }
    std::vector<float> full(size_t(full_parameter_count(config)));
    read_checkpoint_shard(config, 1, 0, checkpoint, full.data());
    const std::vector<HfTensor> tensors = hf_tensors(config);
    write_safetensors((fs::path(out_dir) / "model.safetensors").string(), full.data(), tensors, options.dtype);
    write_text((fs::path(out_dir) / "config.json").string(), config_json(config, options.dtype));
    write_text((fs::path(out_dir) / "generation_config.json").string(), generation_config_json(config));
    for (const auto& [source, name] : copies)
        write_text((fs::path(out_dir) / name).string(), read_whole_file(source.string(), "tokenizer file"));
    std::string said = "exported " + checkpoint + " (" + std::to_string(tensors.size()) + " tensors, " +
                       (options.dtype == ExportDtype::float32 ? "float32" : "bfloat16") + ") to " + out_dir + ":";
    for (const std::string& name : outputs) said += " " + name;
    return said + "\n";
}

}  // namespace tpsp
