// `tpsp export`: a checkpoint as a Hugging Face GPT-2 directory
// (model/hf_export.h), read back by a reader written here from the
// safetensors format's description, not from tpsp's writer: the 8-byte
// length, the JSON header (parsed with nlohmann's ordered_json, so the order
// of its keys is seen), the offsets, and every tensor against the
// checkpoint's, transposed where transformers' Conv1D stores [in, out].
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "model/checkpoint.h"
#include "model/gpt.h"
#include "model/hf_export.h"
#include "tests/scratch_dir.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using tpsp::ExportDtype;
using tpsp::ExportOptions;

using tpsp::testing::scratch_dir;

namespace {

// V = 61 padded to 64, so that wte's padded rows must be dropped; 3 layers,
// so that "h.10"-style sorting is not needed but the layers' order is.
tpsp::GPTConfig small_model() {
    tpsp::GPTConfig c;
    c.max_seq_len = 16, c.vocab_size = 61, c.padded_vocab_size = 64, c.num_layers = 3, c.num_heads = 4;
    c.channels = 32;
    return c;
}

std::vector<float> distinct_weights(const tpsp::GPTConfig& c) {
    std::vector<float> w(size_t(tpsp::full_parameter_count(c)));
    for (size_t i = 0; i < w.size(); i++) w[i] = 0.001f * float(i % 9973) - 4.0f + 1e-7f * float(i);
    return w;
}

std::string file_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Safetensors {
    uint64_t header_length = 0;
    nlohmann::ordered_json header;
    std::string data;  // the bytes after the header
};

Safetensors read_safetensors(const fs::path& path) {
    const std::string bytes = file_bytes(path);
    Safetensors file;
    if (bytes.size() < 8) return file;
    for (int i = 0; i < 8; i++) file.header_length |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
    file.header = nlohmann::ordered_json::parse(bytes.substr(8, file.header_length));
    file.data = bytes.substr(8 + file.header_length);
    return file;
}

// Where each llm.c tensor starts in the whole model's buffer.
std::map<std::string, int64_t> llmc_offsets(const tpsp::GPTConfig& c) {
    std::map<std::string, int64_t> offsets;
    tpsp::ParameterTensors unused{};
    int64_t at = 0;
    for (const tpsp::TensorSpec& t : tpsp::parameter_table(c, 1, &unused)) {
        offsets[t.name] = at;
        at += t.elements();
    }
    return offsets;
}

// The value transformers reads at [i, j] of `name` (i the first index), from the llm.c buffer.
float expected_value(const tpsp::GPTConfig& c, const std::map<std::string, int64_t>& at, const std::vector<float>& w,
                     const std::string& name, int64_t i, int64_t j) {
    const int64_t C = c.channels;
    if (name == "transformer.wte.weight") return w[size_t(at.at("wte") + i * C + j)];
    if (name == "transformer.wpe.weight") return w[size_t(at.at("wpe") + i * C + j)];
    if (name == "transformer.ln_f.weight") return w[size_t(at.at("lnfw") + i)];
    if (name == "transformer.ln_f.bias") return w[size_t(at.at("lnfb") + i)];
    const size_t dot = name.find('.', std::string("transformer.h.").size());
    const int64_t l = std::stoll(name.substr(14, dot - 14));
    const std::string part = name.substr(dot + 1);
    const std::map<std::string, std::pair<std::string, int64_t>> vectors = {
        {"ln_1.weight", {"ln1w", C}},          {"ln_1.bias", {"ln1b", C}},
        {"ln_2.weight", {"ln2w", C}},          {"ln_2.bias", {"ln2b", C}},
        {"attn.c_attn.bias", {"qkvb", 3 * C}}, {"attn.c_proj.bias", {"attprojb", C}},
        {"mlp.c_fc.bias", {"fcb", 4 * C}},     {"mlp.c_proj.bias", {"fcprojb", C}},
    };
    if (auto v = vectors.find(part); v != vectors.end())
        return w[size_t(at.at(v->second.first) + l * v->second.second + i)];
    // a Conv1D weight at [in i, out j] is llm.c's [out j, in i]
    const std::map<std::string, std::pair<std::string, std::pair<int64_t, int64_t>>> matrices = {
        {"attn.c_attn.weight", {"qkvw", {3 * C, C}}},
        {"attn.c_proj.weight", {"attprojw", {C, C}}},
        {"mlp.c_fc.weight", {"fcw", {4 * C, C}}},
        {"mlp.c_proj.weight", {"fcprojw", {C, 4 * C}}},
    };
    const auto& [llmc_name, out_in] = matrices.at(part);
    const auto [out, in] = out_in;
    return w[size_t(at.at(llmc_name) + l * out * in + j * in + i)];
}

struct Exported {
    fs::path dir;
    tpsp::GPTConfig config;
    std::vector<float> weights;
};

Exported export_small_model(const fs::path& scratch, ExportDtype dtype) {
    Exported e{scratch / "hf", small_model(), {}};
    e.weights = distinct_weights(e.config);
    tpsp::save_checkpoint(e.config, e.weights.data(), (scratch / "model.bin").string());
    ExportOptions options;
    options.dtype = dtype;
    tpsp::export_hugging_face((scratch / "model.bin").string(), e.dir.string(), options);
    return e;
}

}  // namespace

// The file is the safetensors format exactly: the length, a header that is
// JSON padded with spaces to 8 bytes, "__metadata__" first, the tensors by
// name with their offsets back to back from 0 to the end of the file.
TEST(HuggingFaceExport, TheSafetensorsFileIsTheFormatAndHoldsEveryTensorUnderTransformersNames) {
    const Exported e = export_small_model(scratch_dir(), ExportDtype::float32);
    const Safetensors file = read_safetensors(e.dir / "model.safetensors");
    EXPECT_EQ(file.header_length % 8, 0u);
    ASSERT_TRUE(file.header.is_object());
    auto key = file.header.begin();
    ASSERT_EQ(key.key(), "__metadata__");
    EXPECT_EQ(key.value(), nlohmann::ordered_json({{"format", "pt"}}));
    std::string previous;
    uint64_t offset = 0;
    int tensors = 0;
    const int64_t C = e.config.channels;
    const std::map<std::string, std::vector<int64_t>> conv1d_shapes = {
        {"attn.c_attn.weight", {C, 3 * C}},
        {"attn.c_proj.weight", {C, C}},
        {"mlp.c_fc.weight", {C, 4 * C}},
        {"mlp.c_proj.weight", {4 * C, C}},
    };
    const std::map<std::string, int64_t> llmc = llmc_offsets(e.config);
    for (++key; key != file.header.end(); ++key, tensors++) {
        const std::string name = key.key();
        SCOPED_TRACE(name);
        EXPECT_LT(previous, name) << "the tensors are not in safetensors' order (by name)";
        previous = name;
        const nlohmann::ordered_json& info = key.value();
        EXPECT_EQ(info.at("dtype"), "F32");
        const std::vector<int64_t> shape = info.at("shape").get<std::vector<int64_t>>();
        const std::vector<uint64_t> range = info.at("data_offsets").get<std::vector<uint64_t>>();
        ASSERT_EQ(range.size(), 2u);
        EXPECT_EQ(range[0], offset) << "the tensors are not back to back";
        int64_t elements = 1;
        for (int64_t d : shape) elements *= d;
        ASSERT_EQ(range[1] - range[0], uint64_t(elements) * 4);
        offset = range[1];
        if (name == "transformer.wte.weight") {
            EXPECT_EQ(shape, (std::vector<int64_t>{e.config.vocab_size, C}));
        }
        for (const auto& [part, conv_shape] : conv1d_shapes) {
            if (name.size() > part.size() && name.compare(name.size() - part.size(), part.size(), part) == 0) {
                EXPECT_EQ(shape, conv_shape);
            }
        }
        const int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
        const float* values = reinterpret_cast<const float*>(file.data.data() + range[0]);
        int wrong = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                if (values[i * cols + j] != expected_value(e.config, llmc, e.weights, name, i, j)) wrong++;
        EXPECT_EQ(wrong, 0) << "values differ from the checkpoint's";
    }
    EXPECT_EQ(tensors, 4 + 12 * e.config.num_layers);
    EXPECT_EQ(offset, file.data.size()) << "the last tensor does not end the file";
    EXPECT_EQ(previous, "transformer.wte.weight");
}

TEST(HuggingFaceExport, ConfigJsonIsGpt2ConfigOfTheModelsShape) {
    const Exported e = export_small_model(scratch_dir(), ExportDtype::float32);
    const nlohmann::json config = nlohmann::json::parse(file_bytes(e.dir / "config.json"));
    EXPECT_EQ(config.at("model_type"), "gpt2");
    EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
    EXPECT_EQ(config.at("n_embd"), e.config.channels);
    EXPECT_EQ(config.at("n_head"), e.config.num_heads);
    EXPECT_EQ(config.at("n_layer"), e.config.num_layers);
    EXPECT_EQ(config.at("n_positions"), e.config.max_seq_len);
    EXPECT_EQ(config.at("vocab_size"), e.config.vocab_size);  // the real V, not Vp
    EXPECT_EQ(config.at("activation_function"), "gelu_new");
    EXPECT_EQ(config.at("layer_norm_epsilon"), 1e-5);
    EXPECT_EQ(config.at("tie_word_embeddings"), true);
    EXPECT_EQ(config.at("torch_dtype"), "float32");
    const nlohmann::json generation = nlohmann::json::parse(file_bytes(e.dir / "generation_config.json"));
    EXPECT_TRUE(generation.at("eos_token_id").is_null());  // not GPT-2's vocabulary: no <|endoftext|>
    EXPECT_FALSE(fs::exists(e.dir / "vocab.json"));
}

// bfloat16: every value the checkpoint's rounded to the nearest bf16 (ties
// to even), checked here against the two bf16 neighbours of each fp32 value.
TEST(HuggingFaceExport, Bfloat16HoldsEachWeightRoundedToTheNearestBf16) {
    const Exported e = export_small_model(scratch_dir(), ExportDtype::bfloat16);
    const Safetensors file = read_safetensors(e.dir / "model.safetensors");
    const nlohmann::ordered_json& wte = file.header.at("transformer.wte.weight");
    EXPECT_EQ(wte.at("dtype"), "BF16");
    const auto range = wte.at("data_offsets").get<std::vector<uint64_t>>();
    const int64_t C = e.config.channels;
    int wrong = 0;
    for (int64_t i = 0; i < e.config.vocab_size * C; i++) {
        uint16_t half;
        std::memcpy(&half, file.data.data() + range[0] + 2 * i, 2);
        const uint32_t widened = uint32_t(half) << 16;
        float got;
        std::memcpy(&got, &widened, 4);
        const float x = e.weights[size_t(i)];
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        const uint32_t down = bits & 0xffff0000u, up = down + 0x10000u;
        float below, above;
        std::memcpy(&below, &down, 4);
        std::memcpy(&above, &up, 4);
        const double to_below = std::fabs(double(x) - below), to_above = std::fabs(double(above) - x);
        const float nearest = to_below < to_above   ? below
                              : to_above < to_below ? above
                                                    : ((down >> 16) & 1 ? above : below);
        if (got != nearest) wrong++;
    }
    EXPECT_EQ(wrong, 0);
    const nlohmann::json config = nlohmann::json::parse(file_bytes(e.dir / "config.json"));
    EXPECT_EQ(config.at("torch_dtype"), "bfloat16");
}

// An earlier export is not overwritten without --replace; a model of GPT-2's
// vocabulary needs its tokenizer files, and nothing is written without them.
TEST(HuggingFaceExport, AnEarlierExportOrMissingTokenizerFilesAreOneLineAndNothingIsWritten) {
    const fs::path scratch = scratch_dir();
    const Exported e = export_small_model(scratch, ExportDtype::float32);
    const std::string before = file_bytes(e.dir / "model.safetensors");
    const std::string checkpoint = (scratch / "model.bin").string();
    try {
        tpsp::export_hugging_face(checkpoint, e.dir.string(), {});
        ADD_FAILURE() << "an earlier export was overwritten";
    } catch (const tpsp::FileError& error) {
        EXPECT_NE(std::string(error.what()).find("exists (an earlier export?): give --replace"), std::string::npos)
            << error.what();
    }
    EXPECT_EQ(file_bytes(e.dir / "model.safetensors"), before);
    ExportOptions replace;
    replace.replace = true;
    tpsp::export_hugging_face(checkpoint, e.dir.string(), replace);
    EXPECT_EQ(file_bytes(e.dir / "model.safetensors"), before);

    tpsp::GPTConfig gpt2_vocabulary = small_model();
    gpt2_vocabulary.vocab_size = 50257, gpt2_vocabulary.padded_vocab_size = 50304, gpt2_vocabulary.num_layers = 1;
    gpt2_vocabulary.channels = 8, gpt2_vocabulary.num_heads = 2;
    const std::vector<float> w = distinct_weights(gpt2_vocabulary);
    tpsp::save_checkpoint(gpt2_vocabulary, w.data(), (scratch / "gpt2.bin").string());
    ExportOptions no_tokenizer;
    no_tokenizer.tokenizer_dir = (scratch / "nowhere").string();
    try {
        tpsp::export_hugging_face((scratch / "gpt2.bin").string(), (scratch / "gpt2").string(), no_tokenizer);
        ADD_FAILURE() << "exported without GPT-2's tokenizer files";
    } catch (const tpsp::FileError& error) {
        EXPECT_NE(std::string(error.what()).find("nowhere/encoder.json: missing"), std::string::npos) << error.what();
    }
    EXPECT_FALSE(fs::exists(scratch / "gpt2"));
}

// The export computes tpsp's function: GPT-2 written as transformers defines
// it (tests/hf_gpt2_reference.py: transformers' names, Conv1D's [in, out],
// the tied head, layer_norm_epsilon and gelu_new from config.json; Python's
// standard library, float64) gives from the exported directory the logits
// that tpsp's CPU model gives from the checkpoint, on 16 positions, within
// 1e-4. The reference exits non-zero otherwise.
TEST(HuggingFaceExport, Gpt2AsTransformersDefinesItGivesTpspsLogitsFromTheExport) {
    const fs::path scratch = scratch_dir();
    const tpsp::GPTConfig config = small_model();
    const int T = 16;
    tpsp::GPT model(config, {1, T, 0.0f});
    model.init_random(7);
    tpsp::save_checkpoint(config, model.params.wte, (scratch / "model.bin").string());
    const std::vector<int> tokens = tpsp::testing::random_tokens(T + 1, config.vocab_size, 3);
    model.forward(tokens.data(), tokens.data() + 1, {0, 0, 0}, false);
    nlohmann::json exchange;
    exchange["tokens"] = std::vector<int>(tokens.begin(), tokens.begin() + T);
    for (int t = 0; t < T; t++) {  // B = 1: row t of logits [s, b, Vp], its first V columns
        const float* row = model.outside.logits + size_t(t) * config.padded_vocab_size;
        exchange["logits"].push_back(std::vector<float>(row, row + config.vocab_size));
    }
    std::ofstream(scratch / "tpsp_logits.json") << exchange.dump();
    tpsp::export_hugging_face((scratch / "model.bin").string(), (scratch / "hf").string(), {});
    const std::string command = std::string(TPSP_PYTHON) + " " + TPSP_HF_REFERENCE + " " + (scratch / "hf").string() +
                                " " + (scratch / "tpsp_logits.json").string();
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
}
