// llm.c's GPT-2 checkpoint: a header of 256 int32 (magic 20240326, version 3,
// maxT, V, L, NH, C, Vp), then every parameter as fp32 in llm.c's order.
// tpsp's files also record their CRC-32C in header[254..255], which llm.c
// never reads (common/checksum.h); a file without it (llm.c's) loads unverified.
#pragma once
#include <string>

#include "common/files.h"
#include "model/gpt.h"

namespace tpsp {

constexpr int checkpoint_magic = 20240326;
constexpr int checkpoint_version = 3;

// Reads only the header: the model's shape.
GPTConfig read_checkpoint_config(const std::string& path);
// Throws unless the checkpoint's header describes this model.
void check_checkpoint_model(const std::string& path, const GPTConfig& config);
// Number of parameters of the whole (unsharded) model.
int64_t full_parameter_count(const GPTConfig& config);
// Reads rank `rank` of t's shard of the parameters into shard (host memory).
// In this order: the header bounded and the file's size checked against it,
// the whole file read and its CRC-32C checked where it records one, the
// file's model compared with config, the weights checked finite.
// part: what a pipeline stage holds of the model (null: all of it)
void read_checkpoint_shard(const GPTConfig& config, int t, int rank, const std::string& path, float* shard,
                           const ModelPart* part = nullptr);
// Loads this rank's shard of the parameters into a CPU model.
void load_checkpoint(GPT& model, const std::string& path);
// Throws a FileError "PATH: tensor NAME of WHAT holds nan at element I" for the
// first NaN or infinity in `full` (the whole model's parameters, or a
// tensor of the same shape such as an AdamW moment, in llm.c's order).
void check_finite_parameters(const GPTConfig& config, const float* full, const std::string& path,
                             const std::string& what);
// Writes the whole model's parameters `full` (llm.c order) into file, its
// CRC-32C in the header; the caller commits the file.
void write_checkpoint(const GPTConfig& config, const float* full, AtomicFile& file);
// The same, to a temporary renamed to PATH: a crash never leaves half a file.
void save_checkpoint(const GPTConfig& config, const float* full, const std::string& path);

}  // namespace tpsp
