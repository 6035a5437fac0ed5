// A tpsp (llm.c) checkpoint as a Hugging Face transformers GPT-2 directory:
// `GPT2LMHeadModel.from_pretrained(dir)` loads it with no Python of ours.
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
// tensors in the order safetensors writes them (by name, one dtype here),
// their offsets into the bytes after the header, back to back; then the raw
// little-endian tensors.
//
// The names and layout are transformers': transformer.wte.weight [V, h]
// (llm.c's padded rows Vp − V dropped), transformer.wpe.weight,
// transformer.h.{i}.ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj, transformer.ln_f. GPT-2's linears are Conv1D modules whose
// weights are stored [in, out]: the transpose of llm.c's [out, in]. The LM
// head is tied to wte and, as transformers saves a tied head, not written.
#pragma once
#include <string>

namespace tpsp {

enum class ExportDtype { float32, bfloat16 };

struct ExportOptions {
    ExportDtype dtype = ExportDtype::float32;           // the Hub's GPT-2 files are float32
    std::string tokenizer_dir = "data/gpt2_tokenizer";  // encoder.json and vocab.bpe, for GPT-2's vocabulary
    bool replace = false;                               // overwrite the files of an earlier export
};

// `tpsp export CHECKPOINT OUT_DIR`: reads the checkpoint whole (its CRC and
// finiteness checked), then writes the files above into OUT_DIR (made if
// missing), each under a temporary name renamed when whole. A file of an
// earlier export there is refused unless options.replace. Returns the lines
// to print (what was written).
std::string export_hugging_face(const std::string& checkpoint, const std::string& out_dir,
                                const ExportOptions& options);

}  // namespace tpsp
