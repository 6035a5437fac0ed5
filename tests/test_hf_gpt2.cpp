// `tpsp export` and `tpsp import` (model/hf_gpt2.h). The export is read
// back by a reader written here from the
// safetensors format's description, not from tpsp's writer: the 8-byte
// length, the JSON header (parsed with nlohmann's ordered_json, so the order
// of its keys is seen), the offsets, and every tensor against the
// checkpoint's, transposed where transformers' Conv1D stores [in, out].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "model/checkpoint.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
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

// ----------------------------------------------------------------------------
// export's review points: nothing is made for a checkpoint it cannot read;
// --replace leaves no tokenizer file of an earlier export behind; bf16's
// exact ties go to the even neighbour

TEST(HuggingFaceExport, AnUnreadableCheckpointMakesNoDirectory) {
    const fs::path scratch = scratch_dir();
    std::ofstream(scratch / "bad.bin") << "not a checkpoint";
    EXPECT_THROW(tpsp::export_hugging_face((scratch / "bad.bin").string(), (scratch / "hf").string(), {}),
                 tpsp::FileError);
    EXPECT_FALSE(fs::exists(scratch / "hf"));
}

TEST(HuggingFaceExport, ReplacingAGpt2VocabularyExportRemovesItsTokenizerFiles) {
    const fs::path scratch = scratch_dir();
    const Exported e = export_small_model(scratch, ExportDtype::float32);
    std::ofstream(e.dir / "vocab.json") << "{}";  // as an earlier export of a GPT-2-vocabulary model left them
    std::ofstream(e.dir / "merges.txt") << "#version: 0.2\n";
    ExportOptions replace;
    replace.replace = true;
    tpsp::export_hugging_face((scratch / "model.bin").string(), e.dir.string(), replace);
    EXPECT_FALSE(fs::exists(e.dir / "vocab.json"));
    EXPECT_FALSE(fs::exists(e.dir / "merges.txt"));
    EXPECT_TRUE(fs::exists(e.dir / "model.safetensors"));
}

TEST(HuggingFaceExport, Bfloat16RoundsExactTiesToEven) {
    const fs::path scratch = scratch_dir();
    const tpsp::GPTConfig c = small_model();
    std::vector<float> w = distinct_weights(c);
    // fp32 bits → the bf16 bits expected, worked by hand: a tie (low half 0x8000) goes to the even upper half
    const std::pair<uint32_t, uint16_t> cases[] = {
        {0x3f808000u, 0x3f80},  // tie, 0x3f80 even: down
        {0x3f818000u, 0x3f82},  // tie, 0x3f81 odd: up
        {0x3f808001u, 0x3f81},  // above the tie: up
        {0x3f807fffu, 0x3f80},  // below the tie: down
        {0xbf818000u, 0xbf82},  // negative tie, odd: away from zero, to even
        {0x3f7f8000u, 0x3f80},  // tie, odd: up, carrying into the exponent
    };
    for (size_t i = 0; i < std::size(cases); i++) std::memcpy(&w[i], &cases[i].first, 4);  // wte's first row
    tpsp::save_checkpoint(c, w.data(), (scratch / "model.bin").string());
    ExportOptions options;
    options.dtype = ExportDtype::bfloat16;
    tpsp::export_hugging_face((scratch / "model.bin").string(), (scratch / "hf").string(), options);
    const Safetensors file = read_safetensors(scratch / "hf" / "model.safetensors");
    const uint64_t begin = file.header.at("transformer.wte.weight").at("data_offsets")[0].get<uint64_t>();
    for (size_t i = 0; i < std::size(cases); i++) {
        uint16_t got;
        std::memcpy(&got, file.data.data() + begin + 2 * i, 2);
        EXPECT_EQ(got, cases[i].second) << std::hex << "fp32 0x" << cases[i].first;
    }
}

// ----------------------------------------------------------------------------
// import

namespace {

// A tensor to store in a safetensors file written here, by the format's description.
struct StoredTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};

// The tensors of a safetensors file, in the order of their offsets.
std::vector<StoredTensor> stored_tensors(const fs::path& path) {
    const Safetensors file = read_safetensors(path);
    std::vector<StoredTensor> tensors;
    for (const auto& [name, info] : file.header.items()) {
        if (name == "__metadata__") continue;
        const auto range = info.at("data_offsets").get<std::vector<uint64_t>>();
        tensors.push_back({name, info.at("dtype").get<std::string>(), info.at("shape").get<std::vector<int64_t>>(),
                           file.data.substr(range[0], range[1] - range[0])});
    }
    return tensors;
}

// The file's bytes: the tensors back to back in the order given, the header's entries in that order too.
std::string safetensors_bytes(const std::vector<StoredTensor>& tensors) {
    nlohmann::ordered_json header;
    header["__metadata__"] = {{"format", "pt"}};
    std::string data;
    for (const StoredTensor& t : tensors) {
        header[t.name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
        data += t.bytes;
    }
    std::string json = header.dump();
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; i++) bytes[size_t(i)] = char(uint8_t(uint64_t(json.size()) >> (8 * i)));
    return bytes + json + data;
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// The small model's checkpoint as training leaves one (the padded vocabulary
// rows 0), exported into scratch/hf.
struct RoundTrip {
    fs::path scratch, checkpoint, hf;
    tpsp::GPTConfig config;
};

RoundTrip exported_checkpoint(ExportDtype dtype = ExportDtype::float32) {
    RoundTrip r{scratch_dir(), {}, {}, small_model()};
    r.checkpoint = r.scratch / "model.bin", r.hf = r.scratch / "hf";
    std::vector<float> w = distinct_weights(r.config);
    const int64_t wte = llmc_offsets(r.config).at("wte"), C = r.config.channels;
    std::fill(w.begin() + wte + r.config.vocab_size * C, w.begin() + wte + r.config.padded_vocab_size * C, 0.0f);
    tpsp::save_checkpoint(r.config, w.data(), r.checkpoint.string());
    ExportOptions options;
    options.dtype = dtype;
    tpsp::export_hugging_face(r.checkpoint.string(), r.hf.string(), options);
    return r;
}

tpsp::ImportOptions padded_to(int vp) {
    tpsp::ImportOptions options;
    options.padded_vocab_size = vp;
    return options;
}

}  // namespace

// export → import gives the checkpoint back, byte for byte (its header and CRC too).
TEST(HuggingFaceImport, AnExportImportsBackToTheSameCheckpointByteForByte) {
    const RoundTrip r = exported_checkpoint();
    const fs::path back = r.scratch / "back.bin";
    const std::string said = tpsp::import_hugging_face(r.hf.string(), back.string(), padded_to(64));
    EXPECT_NE(said.find("vocabulary 61 padded to 64"), std::string::npos) << said;
    EXPECT_EQ(file_bytes(back), file_bytes(r.checkpoint));
}

// The Hub's GPT-2 files: names without "transformer.", the causal masks as
// attn.bias / attn.masked_bias, a written lm_head equal to wte, in no
// particular order; and F16 values: all read into the same checkpoint.
TEST(HuggingFaceImport, TheHubsLayoutWithMasksAndATiedHeadImportsToTheSameCheckpoint) {
    const RoundTrip r = exported_checkpoint();
    std::vector<StoredTensor> tensors = stored_tensors(r.hf / "model.safetensors");
    for (StoredTensor& t : tensors) t.name = t.name.substr(std::string("transformer.").size());
    const int64_t T = r.config.max_seq_len;
    for (int l = 0; l < r.config.num_layers; l++) {
        const std::string h = "h." + std::to_string(l);
        tensors.push_back({h + ".attn.bias", "F32", {1, 1, T, T}, std::string(size_t(T * T * 4), '\0')});
        tensors.push_back({h + ".attn.masked_bias", "F32", {}, std::string(4, '\0')});
    }
    for (const StoredTensor& t : std::vector<StoredTensor>(tensors))
        if (t.name == "wte.weight") tensors.push_back({"lm_head.weight", t.dtype, t.shape, t.bytes});
    std::reverse(tensors.begin(), tensors.end());
    write_bytes(r.hf / "model.safetensors", safetensors_bytes(tensors));
    tpsp::import_hugging_face(r.hf.string(), (r.scratch / "hub.bin").string(), padded_to(64));
    EXPECT_EQ(file_bytes(r.scratch / "hub.bin"), file_bytes(r.checkpoint));

    // F16: every weight of ln_f.weight stored as the half it rounds to, read back as that value
    for (StoredTensor& t : tensors)
        if (t.name == "ln_f.weight") {
            t.dtype = "F16";
            t.bytes = std::string();
            for (int i = 0; i < r.config.channels; i++) {
                const uint16_t half = uint16_t(0x3c00 + i);  // 1 + i/1024
                t.bytes.append(reinterpret_cast<const char*>(&half), 2);
            }
        }
    write_bytes(r.hf / "model.safetensors", safetensors_bytes(tensors));
    tpsp::import_hugging_face(r.hf.string(), (r.scratch / "f16.bin").string(), padded_to(64));
    std::vector<float> w(size_t(tpsp::full_parameter_count(r.config)));
    tpsp::read_checkpoint_shard(r.config, 1, 0, (r.scratch / "f16.bin").string(), w.data());
    const int64_t lnfw = llmc_offsets(r.config).at("lnfw");
    for (int i = 0; i < r.config.channels; i++) EXPECT_EQ(w[size_t(lnfw + i)], 1.0f + float(i) / 1024.0f) << i;
}

// bfloat16 exported, imported: each weight the bf16 the export wrote, widened.
TEST(HuggingFaceImport, ABfloat16ExportImportsAsItsRoundedWeights) {
    const RoundTrip r = exported_checkpoint(ExportDtype::bfloat16);
    tpsp::import_hugging_face(r.hf.string(), (r.scratch / "back.bin").string(), padded_to(64));
    std::vector<float> original(size_t(tpsp::full_parameter_count(r.config))), back(original.size());
    tpsp::read_checkpoint_shard(r.config, 1, 0, r.checkpoint.string(), original.data());
    tpsp::read_checkpoint_shard(r.config, 1, 0, (r.scratch / "back.bin").string(), back.data());
    int wrong = 0;
    for (size_t i = 0; i < back.size(); i++) {
        uint32_t bits;
        std::memcpy(&bits, &back[i], 4);
        if ((bits & 0xffffu) != 0 || std::fabs(back[i] - original[i]) > std::fabs(original[i]) / 256.0f) wrong++;
    }
    EXPECT_EQ(wrong, 0) << "not bf16 values, or not the checkpoint's rounded";
}

// Every refusal is one line naming the file and the fault, and writes nothing.
TEST(HuggingFaceImport, EachFileItCannotReadIsOneLineAndWritesNothing) {
    const RoundTrip r = exported_checkpoint();
    const std::string config = file_bytes(r.hf / "config.json"), weights = file_bytes(r.hf / "model.safetensors");
    const std::vector<StoredTensor> tensors = stored_tensors(r.hf / "model.safetensors");
    const auto with_tensors = [&](const std::function<void(std::vector<StoredTensor>&)>& change) {
        std::vector<StoredTensor> changed = tensors;
        change(changed);
        return safetensors_bytes(changed);
    };
    const auto with_config = [&](const std::string& key, const nlohmann::json& value) {
        nlohmann::json c = nlohmann::json::parse(config);
        c[key] = value;
        return c.dump();
    };
    std::string lying = weights;  // wte's end offset one element short: its span no longer matches its shape
    const std::string wte_offsets =
        "\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[61,32],\"data_offsets\":[";
    const size_t at = lying.find(wte_offsets);
    ASSERT_NE(at, std::string::npos);
    const size_t comma = lying.find(',', at + wte_offsets.size()), close = lying.find(']', comma);
    const uint64_t end = std::stoull(lying.substr(comma + 1, close - comma - 1));
    lying.replace(comma + 1, close - comma - 1, std::to_string(end - 4));
    lying.insert(close, std::string(std::to_string(end).size() - std::to_string(end - 4).size(), ' '));
    // the header and data rewritten by hand: change(header, data) on the parsed header
    const auto rewritten = [&](const std::function<void(nlohmann::ordered_json&, std::string&)>& change) {
        const Safetensors file = read_safetensors(r.hf / "model.safetensors");
        nlohmann::ordered_json header = file.header;
        std::string data = file.data;
        change(header, data);
        std::string json = header.dump();
        json.append((8 - json.size() % 8) % 8, ' ');
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; i++) bytes[size_t(i)] = char(uint8_t(uint64_t(json.size()) >> (8 * i)));
        return bytes + json + data;
    };
    const auto move_from = [](nlohmann::ordered_json& header, uint64_t from, int64_t by) {
        for (auto& [name, info] : header.items())
            if (name != "__metadata__" && info["data_offsets"][0].get<uint64_t>() >= from)
                for (int i = 0; i < 2; i++) info["data_offsets"][i] = info["data_offsets"][i].get<uint64_t>() + by;
    };
    // 4 bytes of nothing before ln_f.bias: a gap
    const std::string gap = rewritten([&](nlohmann::ordered_json& header, std::string& data) {
        const uint64_t at = header["transformer.ln_f.bias"]["data_offsets"][0];
        move_from(header, at, 4);
        data.insert(at, 4, '\0');
    });
    // ln_f.bias pointed at ln_f.weight's bytes (same shape): an overlap, its own bytes gone
    const std::string overlap = rewritten([&](nlohmann::ordered_json& header, std::string& data) {
        const uint64_t at = header["transformer.ln_f.bias"]["data_offsets"][0];
        const uint64_t size = header["transformer.ln_f.bias"]["data_offsets"][1].get<uint64_t>() - at;
        header["transformer.ln_f.bias"]["data_offsets"] = header["transformer.ln_f.weight"]["data_offsets"];
        move_from(header, at + 1, -int64_t(size));
        data.erase(at, size);
    });
    // a shape nested 2000 deep: refused before it is parsed (nlohmann's dump would recurse through it)
    std::string deep_json = "{\"transformer.wpe.weight\":{\"dtype\":\"F32\",\"shape\":" + std::string(2000, '[') +
                            std::string(2000, ']') + ",\"data_offsets\":[0,0]}}";
    std::string deep(8, '\0');
    for (int i = 0; i < 8; i++) deep[size_t(i)] = char(uint8_t(uint64_t(deep_json.size()) >> (8 * i)));
    deep += deep_json;
    std::string huge = weights;  // a header length of 100 MB + 8
    const uint64_t too_long = tpsp::safetensors_max_header + 8;
    for (int i = 0; i < 8; i++) huge[size_t(i)] = char(uint8_t(too_long >> (8 * i)));

    struct Case {
        const char* what;
        std::string config, weights, line;
    };
    const std::vector<Case> cases = {
        {"another architecture", with_config("model_type", "llama"), weights,
         "config.json: another architecture (model_type \"llama\"): tpsp imports GPT-2"},
        {"another activation", with_config("activation_function", "relu"), weights,
         "config.json: activation_function \"relu\": tpsp's GPT-2 has GELU's tanh form"},
        {"an untied head", with_config("tie_word_embeddings", false), weights,
         "config.json: tie_word_embeddings false"},
        {"a config.json of a model far bigger than the file (refused before it is allocated)",
         with_config("n_layer", 4000), weights, "model.safetensors: missing the tensor transformer.h.10."},
        {"a missing config key", with_config("n_embd", nullptr), weights, "config.json: n_embd null: not a size"},
        {"a missing tensor", config,
         with_tensors([](auto& t) { t.erase(t.begin()); }),  // the first by name: h.0.attn.c_attn.bias
         "model.safetensors: missing the tensor transformer.h.0.attn.c_attn.bias"},
        {"an extra tensor", config, with_tensors([](auto& t) {
             t.push_back({"transformer.h.9.mlp.c_fc.bias", "F32", {1}, std::string(4, '\0')});
         }),
         "model.safetensors: an extra tensor transformer.h.9.mlp.c_fc.bias"},
        {"a wrong shape", config, with_tensors([](auto& t) {
             for (StoredTensor& x : t)
                 if (x.name == "transformer.wpe.weight") x.shape = {32, 16};
         }),
         "model.safetensors: tensor transformer.wpe.weight has shape [32,16], "},
        {"a dtype it does not convert", config, with_tensors([](auto& t) {
             for (StoredTensor& x : t)
                 if (x.name == "transformer.ln_f.bias") x.dtype = "I32";
         }),
         "model.safetensors: tensor transformer.ln_f.bias is I32, a dtype tpsp does not convert"},
        {"an untied lm_head", config, with_tensors([](auto& t) {
             for (const StoredTensor& x : std::vector<StoredTensor>(t))
                 if (x.name == "transformer.wte.weight") {
                     t.push_back(x);
                     t.back().name = "lm_head.weight";
                     t.back().bytes[0] ^= 1;
                 }
         }),
         "model.safetensors: lm_head.weight differs from wte"},
        {"a truncated file", config, weights.substr(0, weights.size() - 3), "model.safetensors: truncated"},
        {"a truncated header", config, weights.substr(0, 20), "model.safetensors: truncated: the header is"},
        {"a header that lies about its offsets", config, lying,
         "model.safetensors: the header lies about its offsets: tensor transformer.wte.weight"},
        {"a gap between two tensors", config, gap,
         "model.safetensors: the header lies about its offsets: tensor transformer.ln_f.bias begins at "},
        {"two tensors on the same bytes", config, overlap, "model.safetensors: the header lies about its offsets"},
        {"a header nested 2000 deep", config, deep, "model.safetensors: the header nests deeper than 3 levels"},
        {"a tensor under both names", config, with_tensors([](auto& t) {
             for (const StoredTensor& x : std::vector<StoredTensor>(t))
                 if (x.name == "transformer.wpe.weight") t.push_back({"wpe.weight", x.dtype, x.shape, x.bytes});
         }),
         "model.safetensors: the tensor transformer.wpe.weight is there twice"},
        {"a name with a line break", config, with_tensors([](auto& t) {
             t.push_back({"evil\nname", "F32", {1}, std::string(4, '\0')});
         }),
         "model.safetensors: an extra tensor \"evil\\nname\""},
        {"a mask of a layer the model lacks", config, with_tensors([](auto& t) {
             t.push_back({"h.7.attn.bias", "F32", {1}, std::string(4, '\0')});
         }),
         "model.safetensors: an extra tensor h.7.attn.bias"},
        {"a header over 100 MB", config, huge,
         "model.safetensors: a header of 100000008 bytes: over safetensors' limit"},
        {"a non-finite weight", config, with_tensors([](auto& t) {
             const float inf = std::numeric_limits<float>::infinity();
             for (StoredTensor& x : t)
                 if (x.name == "transformer.ln_f.weight") std::memcpy(x.bytes.data(), &inf, 4);
         }),
         "model.safetensors: tensor lnfw of the Hugging Face model holds inf"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        std::ofstream(r.hf / "config.json") << c.config;
        write_bytes(r.hf / "model.safetensors", c.weights);
        const fs::path out = r.scratch / "out.bin";
        try {
            tpsp::import_hugging_face(r.hf.string(), out.string(), padded_to(64));
            ADD_FAILURE() << "imported";
        } catch (const tpsp::FileError& error) {
            const std::string line = error.what();
            EXPECT_NE(line.find(c.line), std::string::npos) << line;
            EXPECT_EQ(line.find('\n'), std::string::npos) << line;
        }
        EXPECT_FALSE(fs::exists(out));
    }
}
