#include "model/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "common/json_depth.h"
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

// model.safetensors into `file`, which the caller finishes and commits.
void write_safetensors(AtomicFile& file, const float* full, const std::vector<HfTensor>& tensors, ExportDtype dtype) {
    const std::string header = safetensors_header(tensors, dtype);
    uint64_t length = header.size();
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = uint8_t(length >> (8 * i));
    file.write(le, 8);
    file.write(header.data(), header.size());
    for (const HfTensor& t : tensors) {
        const std::vector<char> bytes = tensor_bytes(t, full, dtype);
        file.write(bytes.data(), bytes.size());
    }
}

// GPT2Config's keys (transformers' names; the dropouts are GPT-2's, for a
// user who fine-tunes it there; evaluation turns them off).
std::string config_json(const GPTConfig& c, ExportDtype dtype) {
    const nlohmann::json eos = c.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json();  // <|endoftext|>
    const nlohmann::ordered_json config = {
        {"activation_function", "gelu_new"},
        {"architectures", {"GPT2LMHeadModel"}},
        {"attn_pdrop", 0.1},
        {"bos_token_id", eos},
        {"embd_pdrop", 0.1},
        {"eos_token_id", eos},
        {"initializer_range", 0.02},
        {"layer_norm_epsilon", 1e-05},
        {"model_type", "gpt2"},
        {"n_ctx", c.max_seq_len},
        {"n_embd", c.channels},
        {"n_head", c.num_heads},
        {"n_inner", nullptr},
        {"n_layer", c.num_layers},
        {"n_positions", c.max_seq_len},
        {"resid_pdrop", 0.1},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", true},
        {"torch_dtype", dtype == ExportDtype::float32 ? "float32" : "bfloat16"},
        {"vocab_size", c.vocab_size},
    };
    return config.dump(2) + "\n";
}

std::string generation_config_json(const GPTConfig& c) {
    const nlohmann::json eos = c.vocab_size == 50257 ? nlohmann::json(50256) : nlohmann::json();
    const nlohmann::ordered_json config = {{"_from_model_config", true}, {"bos_token_id", eos}, {"eos_token_id", eos}};
    return config.dump(2) + "\n";
}

// GPT-2's BPE files: OpenAI's encoder.json and vocab.bpe are transformers' vocab.json and merges.txt.
const std::pair<const char*, const char*> tokenizer_files[] = {{"encoder.json", "vocab.json"},
                                                               {"vocab.bpe", "merges.txt"}};

}  // namespace

std::string export_hugging_face(const std::string& checkpoint, const std::string& out_dir,
                                const ExportOptions& options) {
    // everything read and checked before OUT_DIR is touched
    const GPTConfig config = read_checkpoint_config(checkpoint);
    std::vector<float> full(size_t(full_parameter_count(config)));
    read_checkpoint_shard(config, 1, 0, checkpoint, full.data());
    std::map<std::string, std::string> texts = {
        {"config.json", config_json(config, options.dtype)},
        {"generation_config.json", generation_config_json(config)},
    };
    if (config.vocab_size == 50257) {
        for (const auto& [from, to] : tokenizer_files) {
            const fs::path source = fs::path(options.tokenizer_dir) / from;
            if (!fs::is_regular_file(source))
                throw FileError(source.string() +
                                ": missing: a model of GPT-2's vocabulary exports its tokenizer "
                                "files; give --tokenizer-dir (scripts/fetch_gpt2_tokenizer.sh fetches them)");
            texts[to] = read_whole_file(source.string(), "tokenizer file");
        }
    }
    std::vector<std::string> outputs = {"model.safetensors"};
    for (const auto& text : texts) outputs.push_back(text.first);
    std::vector<fs::path> stale;  // an earlier export's tokenizer files that this one does not write
    for (const auto& [from, to] : tokenizer_files)
        if (!texts.count(to)) stale.push_back(fs::path(out_dir) / to);
    for (const std::string& name : outputs) {
        const fs::path path = fs::path(out_dir) / name;
        if (fs::exists(fs::symlink_status(path)) && !options.replace)
            throw FileError(path.string() + ": exists (an earlier export?): give --replace to overwrite it");
    }
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (!fs::is_directory(out_dir)) throw FileError(out_dir + ": cannot make the export's directory");

    // every file on disk under its temporary name, then all renamed: a
    // failure on the way leaves the earlier export (or nothing) as it was
    std::vector<std::unique_ptr<AtomicFile>> files;
    const std::vector<HfTensor> tensors = hf_tensors(config);
    files.push_back(std::make_unique<AtomicFile>((fs::path(out_dir) / "model.safetensors").string()));
    write_safetensors(*files.back(), full.data(), tensors, options.dtype);
    for (const auto& [name, text] : texts) {
        files.push_back(std::make_unique<AtomicFile>((fs::path(out_dir) / name).string()));
        files.back()->write(text.data(), text.size());
    }
    for (auto& file : files) file->finish();
    for (auto& file : files) file->commit();
    for (const fs::path& path : stale)
        if (fs::exists(fs::symlink_status(path)) && !fs::remove(path, ec))
            throw FileError(path.string() + ": cannot remove an earlier export's tokenizer file");
    std::string said = "exported " + checkpoint + " (" + std::to_string(tensors.size()) + " tensors, " +
                       (options.dtype == ExportDtype::float32 ? "float32" : "bfloat16") + ") to " + out_dir + ":";
    for (const std::string& name : outputs) said += " " + name;
    return said + "\n";
}

// ----------------------------------------------------------------------------
// the safetensors reader

namespace {

// A value of an outside file as an error message shows it: JSON, control
// characters escaped (one line), cut short.
std::string shown(const nlohmann::json& value) {
    std::string text = value.dump(-1, ' ', true);
    return text.size() > 60 ? text.substr(0, 60) + "…" : text;
}
// A tensor's name: as it is, unless it holds what would break the line.
std::string shown_name(const std::string& name) {
    for (unsigned char ch : name)
        if (ch < 0x20 || ch == 0x7f) return shown(nlohmann::json(name));
    return name.size() > 200 ? shown(nlohmann::json(name)) : name;
}

// JSON of an outside file, parsed once its nesting is known to be within `depth`.
nlohmann::json parse_outside_json(const std::string& path, std::string_view text, int depth, const char* what) {
    if (json_nesting_depth(text) > depth)
        throw FileError(path + ": " + what + " nests deeper than " + std::to_string(depth) + " levels");
    const nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    if (value.is_discarded() || !value.is_object()) throw FileError(path + ": " + what + " is not a JSON object");
    return value;
}

// Bytes per element of safetensors' dtypes; 0 for a name it does not have.
int dtype_bytes(const std::string& dtype) {
    static const std::map<std::string, int> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
    };
    const auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

// A non-negative integer of the header that fits in 63 bits, or a FileError.
uint64_t header_count(const std::string& path, const std::string& name, const nlohmann::json& value, const char* what) {
    if (!value.is_number_unsigned() || value.get<uint64_t>() > (uint64_t(1) << 62))
        throw FileError(path + ": tensor " + shown_name(name) + ": " + what + " holds " + shown(value) +
                        ", not a count");
    return value.get<uint64_t>();
}

SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& entry) {
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
        throw FileError(path + ": tensor " + shown_name(name) +
                        ": its header entry lacks dtype, shape or data_offsets");
    SafetensorsTensor t;
    t.name = name;
    if (!entry["dtype"].is_string()) throw FileError(path + ": tensor " + shown_name(name) + ": dtype is not a string");
    t.dtype = entry["dtype"].get<std::string>();
    if (dtype_bytes(t.dtype) == 0)
        throw FileError(path + ": tensor " + shown_name(name) + ": unknown dtype " + t.dtype);
    const nlohmann::json& shape = entry["shape"];
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!shape.is_array() || shape.size() > 8) throw FileError(path + ": tensor " + shown_name(name) + ": bad shape");
    if (!offsets.is_array() || offsets.size() != 2)
        throw FileError(path + ": tensor " + shown_name(name) + ": data_offsets is not [begin, end]");
    uint64_t bytes = uint64_t(dtype_bytes(t.dtype));
    for (const nlohmann::json& d : shape) {
        const uint64_t extent = header_count(path, name, d, "shape");
        t.shape.push_back(int64_t(extent));
        bytes = extent == 0 || bytes <= (uint64_t(1) << 62) / extent ? bytes * extent : uint64_t(1) << 63;
    }
    t.begin = header_count(path, name, offsets[0], "data_offsets");
    t.end = header_count(path, name, offsets[1], "data_offsets");
    if (t.end < t.begin || t.end - t.begin != bytes)
        throw FileError(path + ": the header lies about its offsets: tensor " + name + " of shape " + shown(shape) +
                        " " + t.dtype + " is " + std::to_string(bytes) + " bytes, its data_offsets " + shown(offsets) +
                        " span " + std::to_string(t.end - std::min(t.begin, t.end)));
    return t;
}

}  // namespace

std::vector<SafetensorsTensor> parse_safetensors(const std::string& path, std::string_view bytes, size_t& data_start) {
    if (bytes.size() < 8)
        throw FileError(path + ": truncated: " + std::to_string(bytes.size()) + " bytes, not even the header's length");
    uint64_t length = 0;
    for (int i = 0; i < 8; i++) length |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
    if (length > safetensors_max_header)
        throw FileError(path + ": a header of " + std::to_string(length) + " bytes: over safetensors' limit of " +
                        std::to_string(safetensors_max_header));
    if (length > bytes.size() - 8)
        throw FileError(path + ": truncated: the header is " + std::to_string(length) + " bytes, the file holds " +
                        std::to_string(bytes.size() - 8) + " after the length");
    // {"name": {"shape": [..]}}: 3 levels; __metadata__ a map of strings
    const nlohmann::json header = parse_outside_json(path, bytes.substr(8, size_t(length)), 3, "the header");
    std::vector<SafetensorsTensor> tensors;
    for (const auto& [name, entry] : header.items())
        if (name != "__metadata__") tensors.push_back(parse_entry(path, name, entry));
    std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;  // an empty tensor before its neighbour
    });
    data_start = size_t(8 + length);
    const uint64_t data_bytes = bytes.size() - data_start;
    uint64_t at = 0;
    for (const SafetensorsTensor& t : tensors) {
        if (t.begin != at)
            throw FileError(path + ": the header lies about its offsets: tensor " + shown_name(t.name) + " begins at " +
                            std::to_string(t.begin) + ", the tensor before it ends at " + std::to_string(at));
        at = t.end;
    }
    if (at > data_bytes)
        throw FileError(path + ": truncated: the tensors end at byte " + std::to_string(at) +
                        " of the data, the file " + "holds " + std::to_string(data_bytes));
    if (at < data_bytes)
        throw FileError(path + ": the header lies about its offsets: " + std::to_string(data_bytes - at) +
                        " bytes after the last tensor belong to none");
    return tensors;
}

// ----------------------------------------------------------------------------
// import

namespace {

float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float magnitude;
    if (exponent == 0) {
        magnitude = std::ldexp(float(mantissa), -24);  // subnormal
    } else if (exponent == 31) {
        magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    } else {
        magnitude = std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
    }
    uint32_t bits;
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

// Element i of a tensor's bytes as fp32 (F32, F16 and BF16 only).
float element(const char* data, const std::string& dtype, int64_t i) {
    if (dtype == "F32") {
        float v;
        std::memcpy(&v, data + 4 * i, 4);
        return v;
    }
    uint16_t h;
    std::memcpy(&h, data + 2 * i, 2);
    if (dtype == "F16") return half_to_float(h);
    const uint32_t widened = uint32_t(h) << 16;  // BF16
    float v;
    std::memcpy(&v, &widened, 4);
    return v;
}

// A key of config.json: its value, or `fallback` where it is absent (transformers' default).
nlohmann::json config_value(const nlohmann::json& config, const char* key, const nlohmann::json& fallback) {
    return config.contains(key) ? config[key] : fallback;
}

// The model config.json describes, refused unless it is a GPT-2 that tpsp's model computes.
GPTConfig gpt2_config(const std::string& path, const ImportOptions& options) {
    const nlohmann::json config = parse_outside_json(path, read_whole_file(path, "Hugging Face config"), 8,
                                                     "config.json");
    const nlohmann::json model_type = config_value(config, "model_type", "");
    if (model_type != "gpt2")
        throw FileError(path + ": another architecture (model_type " + shown(model_type) +
                        "): tpsp imports GPT-2 (model_type \"gpt2\")");
    const auto refuse_unless = [&](const char* key, const nlohmann::json& fallback, const std::set<nlohmann::json>& ok,
                                   const char* why) {
        const nlohmann::json value = config_value(config, key, fallback);
        if (!ok.count(value)) throw FileError(path + ": " + key + " " + shown(value) + ": tpsp's GPT-2 has " + why);
    };
    refuse_unless("activation_function", "gelu_new", {"gelu_new", "gelu_pytorch_tanh"}, "GELU's tanh form (gelu_new)");
    refuse_unless("layer_norm_epsilon", 1e-5, {1e-5}, "LayerNorm's ε = 1e-5");
    refuse_unless("scale_attn_weights", true, {true}, "scores scaled by 1/√head size");
    refuse_unless("scale_attn_by_inverse_layer_idx", false, {false}, "no per-layer score scale");
    refuse_unless("tie_word_embeddings", true, {true}, "the LM head tied to wte");
    refuse_unless("add_cross_attention", false, {false}, "no cross-attention");
    const auto size = [&](const char* key) {
        const nlohmann::json value = config_value(config, key, nullptr);
        if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 || value.get<uint64_t>() > (1u << 30))
            throw FileError(path + ": " + key + " " + shown(value) + ": not a size");
        return int(value.get<uint64_t>());
    };
    GPTConfig c;
    c.channels = size("n_embd");
    c.num_heads = size("n_head");
    c.num_layers = size("n_layer");
    c.max_seq_len = size("n_positions");
    c.vocab_size = size("vocab_size");
    const nlohmann::json inner = config_value(config, "n_inner", nullptr);
    if (!inner.is_null() && inner != 4 * int64_t(c.channels))
        throw FileError(path + ": n_inner " + shown(inner) +
                        ": tpsp's GPT-2 has an MLP of 4 · n_embd = " + std::to_string(4 * int64_t(c.channels)));
    if (c.channels % c.num_heads != 0)
        throw FileError(path + ": n_head " + std::to_string(c.num_heads) + " does not divide n_embd " +
                        std::to_string(c.channels));
    c.padded_vocab_size = options.padded_vocab_size ? options.padded_vocab_size : (c.vocab_size + 127) / 128 * 128;
    if (c.padded_vocab_size < c.vocab_size)
        throw FileError("--padded-vocab " + std::to_string(c.padded_vocab_size) + ": less than vocab_size " +
                        std::to_string(c.vocab_size));
    if (c.channels > ModelLimits::channels || c.num_layers > ModelLimits::layers ||
        c.max_seq_len > ModelLimits::seq_len || c.padded_vocab_size > ModelLimits::padded_vocab)
        throw FileError(path + ": a model beyond tpsp's limits (n_embd " + std::to_string(c.channels) + ", n_layer " +
                        std::to_string(c.num_layers) + ", n_positions " + std::to_string(c.max_seq_len) +
                        ", vocabulary " + std::to_string(c.padded_vocab_size) + ")");
    return c;
}

// The tensor's name as the export writes it: the Hub's GPT-2 files leave out "transformer.".
std::string export_name(const std::string& name) {
    if (name.rfind("transformer.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return name;
    return "transformer." + name;
}

// The causal masks of older GPT-2 files (h.N.attn.bias, h.N.attn.masked_bias
// of one of the model's layers): buffers, not weights.
bool is_attention_mask(const std::string& name, int layers) {
    for (int l = 0; l < layers; l++)
        for (const char* part : {".attn.bias", ".attn.masked_bias"})
            if (name == "transformer.h." + std::to_string(l) + part) return true;
    return false;
}

}  // namespace

std::string import_hugging_face(const std::string& hf_dir, const std::string& out_file, const ImportOptions& options) {
    const std::string config_path = (fs::path(hf_dir) / "config.json").string();
    const std::string weights_path = (fs::path(hf_dir) / "model.safetensors").string();
    if (!fs::is_regular_file(config_path))
        throw FileError(config_path + ": missing: not a Hugging Face model directory");
    const GPTConfig config = gpt2_config(config_path, options);
    if (!fs::is_regular_file(weights_path))
        throw FileError(weights_path + ": missing (tpsp reads safetensors, not pytorch_model.bin)");
    if (fs::exists(fs::symlink_status(out_file)) && !options.replace)
        throw FileError(out_file + ": exists: give --replace to overwrite it");
    const std::string bytes = read_whole_file(weights_path, "safetensors file");
    size_t data_start = 0;
    const std::vector<SafetensorsTensor> stored = parse_safetensors(weights_path, bytes, data_start);
    std::map<std::string, const SafetensorsTensor*> by_name;
    const SafetensorsTensor* lm_head = nullptr;
    for (const SafetensorsTensor& t : stored) {
        const std::string name = export_name(t.name);
        if (is_attention_mask(name, config.num_layers)) continue;
        if (name == "lm_head.weight") {
            lm_head = &t;
            continue;
        }
        if (!by_name.emplace(name, &t).second)
            throw FileError(weights_path + ": the tensor " + shown_name(name) +
                            " is there twice (with and without "
                            "\"transformer.\")");
    }
    const std::vector<HfTensor> expected = hf_tensors(config);
    std::set<std::string> expected_names;
    for (const HfTensor& e : expected) expected_names.insert(e.name);
    for (const auto& [name, t] : by_name)
        if (!expected_names.count(name))
            throw FileError(weights_path + ": an extra tensor " + shown_name(t->name) + ", which GPT-2 of " +
                            config_path + " does not have");
    // every tensor found and of its shape and dtype before anything is
    // allocated: the model config.json describes is then as big as the file
    std::vector<const SafetensorsTensor*> sources;
    for (const HfTensor& e : expected) {
        const auto found = by_name.find(e.name);
        if (found == by_name.end())
            throw FileError(weights_path + ": missing the tensor " + e.name + " (or " + e.name.substr(12) + ")");
        const SafetensorsTensor& t = *found->second;
        if (t.shape != e.shape)
            throw FileError(weights_path + ": tensor " + shown_name(t.name) + " has shape " + shown(t.shape) + ", " +
                            config_path + " makes it " + nlohmann::json(e.shape).dump());
        if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
            throw FileError(weights_path + ": tensor " + shown_name(t.name) + " is " + t.dtype +
                            ", a dtype tpsp does not convert (F32, F16, BF16)");
        sources.push_back(&t);
    }
    std::vector<float> full(size_t(full_parameter_count(config)), 0.0f);  // the padded vocabulary rows stay 0
    for (size_t i = 0; i < expected.size(); i++) {
        const HfTensor& e = expected[i];
        const SafetensorsTensor& t = *sources[i];
        const char* data = bytes.data() + data_start + t.begin;
        float* dst = full.data() + e.offset;
        for (int64_t r = 0; r < e.rows; r++)  // llm.c's [rows, cols]; a Conv1D weight is stored [cols, rows]
            for (int64_t k = 0; k < e.cols; k++)
                dst[r * e.cols + k] = element(data, t.dtype, e.transpose ? k * e.rows + r : r * e.cols + k);
    }
    if (lm_head) {
        const SafetensorsTensor& wte = *by_name.at("transformer.wte.weight");
        if (lm_head->shape != wte.shape || lm_head->dtype != wte.dtype ||
            bytes.compare(data_start + lm_head->begin, lm_head->end - lm_head->begin, bytes, data_start + wte.begin,
                          wte.end - wte.begin) != 0)
            throw FileError(weights_path +
                            ": lm_head.weight differs from wte: an untied LM head, which GPT-2 in "
                            "tpsp (llm.c) does not have");
    }
    check_finite_parameters(config, full.data(), weights_path, "the Hugging Face model");
    save_checkpoint(config, full.data(), out_file);
    return "imported " + hf_dir + " (GPT-2: " + std::to_string(config.num_layers) + " layers, " +
           std::to_string(config.num_heads) + " heads, " + std::to_string(config.channels) + " channels, vocabulary " +
           std::to_string(config.vocab_size) + " padded to " + std::to_string(config.padded_vocab_size) + ", context " +
           std::to_string(config.max_seq_len) + ") to " + out_file + "\n";
}

}  // namespace tpsp
