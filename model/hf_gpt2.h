// tpsp's (llm.c's) checkpoints and Hugging Face transformers' GPT-2
// directories, both ways: `tpsp export` writes one that
// `GPT2LMHeadModel.from_pretrained(dir)` loads with no Python of ours, and
// `tpsp import` reads one (a GPT-2 from the Hub, or an export) into a
// checkpoint that checkpoint.init fine-tunes.
//
//   model.safetensors        the weights, under transformers' GPT-2 names
//   config.json              GPT2Config's keys for this model's shape
//   generation_config.json
//   vocab.json, merges.txt   GPT-2's BPE files, for a model of its vocabulary
//
// The safetensors format (huggingface/safetensors): 8 bytes, the header's
// length as a little-endian u64; the header, JSON, padded with spaces to a
// multiple of 8 bytes: {"__metadata__":{"format":"pt"}, then per tensor
// "name":{"dtype":"F32","shape":[...],"data_offsets":[begin,end]}}, the
// tensors in the order safetensors writes them (by dtype, then by name),
// their offsets into the bytes after the header, back to back from 0 to the
// end of the file; then the raw little-endian tensors.
//
// The names and layout are transformers': transformer.wte.weight [V, h]
// (llm.c's padded rows Vp − V dropped), transformer.wpe.weight,
// transformer.h.{i}.ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj, transformer.ln_f. GPT-2's linears are Conv1D modules whose
// weights are stored [in, out]: the transpose of llm.c's [out, in]. The LM
// head is tied to wte and, as transformers saves a tied head, not written.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tpsp {

enum class ExportDtype { float32, bfloat16 };

struct ExportOptions {
    ExportDtype dtype = ExportDtype::float32;           // the Hub's GPT-2 files are float32
    std::string tokenizer_dir = "data/gpt2_tokenizer";  // encoder.json and vocab.bpe, for GPT-2's vocabulary
    bool replace = false;                               // overwrite the files of an earlier export
};

// `tpsp export CHECKPOINT OUT_DIR`: reads the checkpoint whole (its CRC and
// finiteness checked) and the tokenizer files, then makes OUT_DIR if
// missing and writes every file above under a temporary name; only when all
// are on disk are they renamed into place. A file of an earlier export there
// is refused unless options.replace, which also removes tokenizer files this
// export does not write. Returns the lines to print (what was written).
std::string export_hugging_face(const std::string& checkpoint, const std::string& out_dir,
                                const ExportOptions& options);

struct ImportOptions {
    int padded_vocab_size = 0;  // Vp: 0 rounds V up to a multiple of 128, as model.padded_vocab_size does
    bool replace = false;       // overwrite an existing OUT.bin
};

// `tpsp import HF_DIR OUT.bin`: reads config.json (a GPT-2 whose function is
// tpsp's: gelu_new, ε 1e-5, n_inner 4h, a tied head) and model.safetensors
// (F32, F16 or BF16; the names with or without "transformer.", the causal
// masks older files hold as attn.bias / attn.masked_bias skipped, an
// lm_head.weight accepted only where it equals wte) and writes the llm.c
// checkpoint, the padded vocabulary rows zero. Every refusal is one
// FileError line naming the file and what is wrong. Returns the line to print.
std::string import_hugging_face(const std::string& hf_dir, const std::string& out_file, const ImportOptions& options);

// One tensor of a safetensors header: its bytes are [begin, end) of the data
// after the header.
struct SafetensorsTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
};

// The largest header safetensors reads (its MAX_HEADER_SIZE: 100 MB).
constexpr uint64_t safetensors_max_header = 100'000'000;

// Parses and checks the header of a safetensors file's bytes (`path` names
// it in errors): the length within the file and within 100 MB, JSON, every
// entry's dtype known, its shape's bytes equal to its offsets' span, the
// tensors back to back from 0 to the end of the file. Returns the tensors in
// the order of their offsets and sets data_start to the first data byte.
// A FileError line otherwise.
std::vector<SafetensorsTensor> parse_safetensors(const std::string& path, std::string_view bytes, size_t& data_start);

}  // namespace tpsp
