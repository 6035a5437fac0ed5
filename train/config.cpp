#include "train/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/files.h"
#include "parallel/pipeline_schedule.h"

namespace tpsp {

namespace {

// One config key: its dotted name, its type, a one-line description, how to
// reach its field, and what values are possible.
struct Key {
    std::string name;
    std::string type;  // "int", "float", "bool", "string"
    std::string help;
    std::function<void(Config&, const std::string&)> set;  // throws std::invalid_argument("expected …")
    std::function<std::string(Config)> show;               // of a copy: the fields are reached through Config&
};

// Out of long long's range, strtoll gives its limit, which the caller's range
// check then refuses with the text as written.
long long parse_int(const std::string& text) {
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end) throw std::invalid_argument("expected an integer, got '" + text + "'");
    return v;
}

// 0 … 2^64 − 1; strtoull would take "-1" as 2^64 − 1.
uint64_t parse_uint64(const std::string& text) {
    const std::string range = "must be in [0, 18446744073709551615], got " + text;
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || *end) throw std::invalid_argument("expected an integer, got '" + text + "'");
    if (errno == ERANGE || text.find('-') != std::string::npos) throw std::invalid_argument(range);
    return uint64_t(v);
}

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}
double parse_float(const std::string& text) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end || errno) throw std::invalid_argument("expected a number, got '" + text + "'");
    return v;
}

bool parse_bool(const std::string& text) {
    if (text == "true") return true;
    if (text == "false") return false;
    throw std::invalid_argument("expected true or false, got '" + text + "'");
}

// Builders for the four kinds of key. `min` is the smallest allowed value,
// `max` the largest.
Key int_key(std::string name, int& (*field)(Config&), long long min, std::string help, long long max = INT_MAX) {
    return {name, "int", help,
            [=](Config& c, const std::string& text) {
                long long v = parse_int(text);
                if (v < min) throw std::invalid_argument("must be ≥ " + std::to_string(min) + ", got " + text);
                if (v > max) throw std::invalid_argument("must be at most " + std::to_string(max) + ", got " + text);
                field(c) = int(v);
            },
            [=](Config c) { return std::to_string(field(c)); }};
}

// The range is checked on the float that is stored: 0.999999999 is 1 as a
// float, which β1 < 1 must refuse.
Key float_key(std::string name, float& (*field)(Config&), double min, double below, std::string help) {
    return {name, "float", help,
            [=](Config& c, const std::string& text) {
                const std::string range = "must be in [" + number_text(min) + ", " + number_text(below) + "), got " +
                                          text;
                double v = parse_float(text);
                if (!(v >= min && v < below)) throw std::invalid_argument(range);
                const float stored = float(v);  // in float's range: `below` is
                if (!(stored >= min && stored < below))
                    throw std::invalid_argument(range + ", which is " + number_text(stored) + " as a float");
                field(c) = stored;
            },
            [=](Config c) {
                char buf[32];
                std::snprintf(buf, sizeof buf, "%g", field(c));
                return std::string(buf);
            }};
}

Key bool_key(std::string name, bool& (*field)(Config&), std::string help) {
    return {name, "bool", help, [=](Config& c, const std::string& text) { field(c) = parse_bool(text); },
            [=](Config c) { return std::string(field(c) ? "true" : "false"); }};
}

Key string_key(std::string name, std::string& (*field)(Config&), std::vector<std::string> choices, std::string help) {
    return {name, "string", help,
            [=](Config& c, const std::string& text) {
                if (!choices.empty() && std::find(choices.begin(), choices.end(), text) == choices.end()) {
                    std::string list;
                    for (const std::string& s : choices) list += (list.empty() ? "" : " | ") + s;
                    throw std::invalid_argument("must be one of " + list + ", got '" + text + "'");
                }
                field(c) = text;
            },
            [=](Config c) { return "\"" + field(c) + "\""; }};
}

// One row per key, in the order the reference lists them.
// clang-format off
const std::vector<Key>& keys() {
    static const std::vector<Key> all = {
        int_key("model.layers", [](Config& c) -> int& { return c.model.layers; }, 1, "transformer blocks L"),
        int_key("model.heads", [](Config& c) -> int& { return c.model.heads; }, 1, "attention heads a"),
        int_key("model.channels", [](Config& c) -> int& { return c.model.channels; }, 1, "hidden size h (C)"),
        int_key("model.vocab_size", [](Config& c) -> int& { return c.model.vocab_size; }, 2, "real vocabulary V"),
        int_key("model.padded_vocab_size", [](Config& c) -> int& { return c.model.padded_vocab_size; }, 0,
                "rows of wte, ≥ V; 0 rounds V up to a multiple of 128"),
        int_key("model.max_seq_len", [](Config& c) -> int& { return c.model.max_seq_len; }, 0,
                "rows of wpe; 0 means train.seq_len"),
        float_key("model.dropout", [](Config& c) -> float& { return c.model.dropout; }, 0.0, 1.0,
                  "dropout probability at all four sites"),
        string_key("model.attention", [](Config& c) -> std::string& { return c.model.attention; },
                   {"explicit", "cudnn"},
                   "explicit: kernels that save S', its mask and S; cudnn: cuDNN's fused attention (GPU)"),
        string_key("model.recompute", [](Config& c) -> std::string& { return c.model.recompute; },
                   {"none", "selective", "full"},
                   "selective: keep no S', mask or S, recompute them from qkv; full: recomputed blocks keep only "
                   "their input and run forward again in backward (the same bits either way)"),
        string_key("model.recompute_method", [](Config& c) -> std::string& { return c.model.recompute_method; },
                   {"uniform", "block"},
                   "full recomputation: uniform runs of N blocks keep one input each; block: the first N blocks "
                   "keep only their input"),
        int_key("model.recompute_layers", [](Config& c) -> int& { return c.model.recompute_layers; }, 1,
                "N of model.recompute_method (≤ model.layers)"),
        string_key("data.train", [](Config& c) -> std::string& { return c.data.train; }, {},
                   "glob of training token shards (llm.c format)"),
        string_key("data.val", [](Config& c) -> std::string& { return c.data.val; }, {},
                   "glob of validation token shards; \"\" for none"),
        string_key("data.tokenizer", [](Config& c) -> std::string& { return c.data.tokenizer; }, {},
                   "llm.c gpt2_tokenizer.bin that decodes samples of a GPT-2-vocabulary model"),
        string_key("data.hellaswag", [](Config& c) -> std::string& { return c.data.hellaswag; }, {},
                   "HellaSwag's validation file (JSON lines: ctx, endings, label), scored every "
                   "train.hellaswag_every steps and by tpsp eval --hellaswag; \"\" for none"),
        string_key("data.bpe_dir", [](Config& c) -> std::string& { return c.data.bpe_dir; }, {},
                   "GPT-2's encoder.json and vocab.bpe, to encode HellaSwag for a model of GPT-2's vocabulary"),
        int_key("train.batch_size", [](Config& c) -> int& { return c.train.batch_size; }, 1, "micro-batch b"),
        int_key("train.seq_len", [](Config& c) -> int& { return c.train.seq_len; }, 1, "sequence length s"),
        int_key("train.grad_accum", [](Config& c) -> int& { return c.train.grad_accum; }, 1,
                "micro-batches per optimizer step"),
        int_key("train.steps", [](Config& c) -> int& { return c.train.steps; }, 1, "optimizer steps"),
        int_key("train.warmup_steps", [](Config& c) -> int& { return c.train.warmup_steps; }, 0,
                "linear warmup from 0 to lr"),
        float_key("train.lr", [](Config& c) -> float& { return c.train.lr; }, 0.0, 1e9, "peak learning rate"),
        float_key("train.min_lr_ratio", [](Config& c) -> float& { return c.train.min_lr_ratio; }, 0.0, 1.0000001,
                  "cosine decays to lr × this"),
        string_key("train.lr_schedule", [](Config& c) -> std::string& { return c.train.lr_schedule; },
                   {"cosine", "constant"}, "after warmup: cosine decay or constant"),
        float_key("train.beta1", [](Config& c) -> float& { return c.train.beta1; }, 0.0, 1.0, "AdamW β1"),
        float_key("train.beta2", [](Config& c) -> float& { return c.train.beta2; }, 0.0, 1.0, "AdamW β2"),
        float_key("train.eps", [](Config& c) -> float& { return c.train.eps; }, 0.0, 1.0, "AdamW ε"),
        float_key("train.weight_decay", [](Config& c) -> float& { return c.train.weight_decay; }, 0.0, 1e9,
                  "decoupled weight decay"),
        bool_key("train.decay_all", [](Config& c) -> bool& { return c.train.decay_all; },
                 "decay every tensor, not only the matrices"),
        float_key("train.grad_clip", [](Config& c) -> float& { return c.train.grad_clip; }, 0.0, 1e30,
                  "clip the global gradient norm to this; 0 is off"),
        int_key("train.val_every", [](Config& c) -> int& { return c.train.val_every; }, 0,
                "validation loss every N steps (and at the end); 0 is never"),
        int_key("train.val_batches", [](Config& c) -> int& { return c.train.val_batches; }, 1,
                "batches per validation"),
        int_key("train.hellaswag_every", [](Config& c) -> int& { return c.train.hellaswag_every; }, 0,
                "HellaSwag's score of data.hellaswag every N steps (and at the end); 0 is never"),
        {"train.seed", "int", "seed of the initial weights and of the dropout masks, 0 … 2^64 − 1",
         [](Config& c, const std::string& text) { c.train.seed = parse_uint64(text); },
         [](const Config& c) { return std::to_string(c.train.seed); }},
        int_key("train.threads", [](Config& c) -> int& { return c.train.threads; }, 0,
                "OpenMP threads per rank; 0 is OpenMP's default; at most 1024 (more than any node's cores; "
                "100000 crashed in OpenMP's start-up)", 1024),
        string_key("train.device", [](Config& c) -> std::string& { return c.train.device; }, {"cpu", "cuda", "auto"},
                   "cpu (fp32 activations), cuda (bf16, one GPU per rank), or auto: cuda where this build has "
                   "it and a GPU is present"),
        int_key("parallel.tp", [](Config& c) -> int& { return c.parallel.tp; }, 1, "tensor-parallel size t"),
        bool_key("parallel.sequence_parallel", [](Config& c) -> bool& { return c.parallel.sequence_parallel; },
                 "shard LayerNorm/dropout/residual along the sequence (SP)"),
        int_key("parallel.cp", [](Config& c) -> int& { return c.parallel.cp; }, 1,
                "context-parallel size: every sequence cut across cp ranks (world = dp × cp × tp)"),
        int_key("parallel.pp", [](Config& c) -> int& { return c.parallel.pp; }, 1,
                "pipeline stages p: the blocks cut into p consecutive parts, 1F1B over train.grad_accum "
                "micro-batches (world = pp × dp × cp × tp)"),
        int_key("parallel.vpp", [](Config& c) -> int& { return c.parallel.vpp; }, 1,
                "model chunks per pipeline stage: above 1, the interleaved 1F1B schedule (needs pp > 1 and "
                "train.grad_accum a multiple of pp)"),
        string_key("parallel.cp_comm_type", [](Config& c) -> std::string& { return c.parallel.cp_comm_type; },
                   {"a2a", "p2p"}, "how attention sees the whole sequence: a2a (sp2hp / hp2sp all-to-alls: "
                                   "tp · cp must divide the heads); p2p (ring attention: the K/V blocks go round "
                                   "the CP ring, overlapped; tp alone must divide the heads)"),
        bool_key("parallel.tp_comm_overlap", [](Config& c) -> bool& { return c.parallel.tp_comm_overlap; },
                 "master switch of communication overlap (needs SP); off turns every tp_comm_* off"),
        bool_key("parallel.tp_comm_overlap_ag", [](Config& c) -> bool& { return c.parallel.tp_comm_overlap_ag; },
                 "all-gathers as a ring of exchanges inside the GEMM that needs them"),
        bool_key("parallel.tp_comm_overlap_rs", [](Config& c) -> bool& { return c.parallel.tp_comm_overlap_rs; },
                 "reduce-scatters after row-parallel GEMMs overlapped with them"),
        bool_key("parallel.tp_comm_bulk_dgrad", [](Config& c) -> bool& { return c.parallel.tp_comm_bulk_dgrad; },
                 "re-all-gather of the LN output during the dgrad GEMM"),
        bool_key("parallel.tp_comm_bulk_wgrad", [](Config& c) -> bool& { return c.parallel.tp_comm_bulk_wgrad; },
                 "reduce-scatter of the dgrad during the wgrad GEMM"),
        bool_key("parallel.tp_comm_overlap_rs_dgrad",
                 [](Config& c) -> bool& { return c.parallel.tp_comm_overlap_rs_dgrad; },
                 "reduce-scatter the dgrad chunk by chunk inside its GEMM; turns both bulk switches off"),
        string_key("parallel.tp_comm_rs_method", [](Config& c) -> std::string& { return c.parallel.tp_comm_rs_method; },
                   {"ring", "pipeline"}, "how tp_comm_overlap_rs overlaps: ring exchange or pipelined chunks"),
        int_key("parallel.tp_comm_num_splits", [](Config& c) -> int& { return c.parallel.tp_comm_num_splits; }, 1,
                "chunks of the pipelined reduce-scatters; at most 64 and at most model.channels "
                "(each chunk is a slice of the h columns)", 64),
        bool_key("parallel.distributed_optimizer",
                 [](Config& c) -> bool& { return c.parallel.distributed_optimizer; },
                 "each data-parallel rank keeps AdamW's state for its shard of the gradients only, "
                 "reduce-scatters the gradients and all-gathers the updated parameters"),
        bool_key("parallel.overlap_grad_reduce", [](Config& c) -> bool& { return c.parallel.overlap_grad_reduce; },
                 "start each gradient bucket's data-parallel reduction as soon as backward has made it final, "
                 "hidden behind the rest of backward"),
        bool_key("parallel.overlap_param_gather",
                 [](Config& c) -> bool& { return c.parallel.overlap_param_gather; },
                 "start the updated parameters' all-gathers after the update and let the next forward wait, "
                 "block by block, only for what it reads (needs parallel.distributed_optimizer)"),
        int_key("parallel.bucket_size", [](Config& c) -> int& { return c.parallel.bucket_size; }, 1,
                "parameters per data-parallel gradient bucket (at least, within one tensor: layer slices from "
                "the last layer back; a tensor's first bucket may hold fewer)"),
        int_key("parallel.timeout_s", [](Config& c) -> int& { return c.parallel.timeout_s; }, 1,
                "seconds a rank waits for its peers in one transfer before it ends the job (an MPI wait; an NCCL operation, through a watchdog)"),
        float_key("parallel.emulated_link.gbps", [](Config& c) -> float& { return c.parallel.emulated_link_gbps; }, 0.0,
                  1e9, "measuring aid: hold transfers to a link of this many gigabits/s; 0 is off, else at least 0.001"),
        float_key("parallel.emulated_link.latency_us",
                  [](Config& c) -> float& { return c.parallel.emulated_link_latency_us; }, 0.0, 1e6,
                  "the emulated link's latency per transfer, µs; below 1 s"),
        string_key("checkpoint.dir", [](Config& c) -> std::string& { return c.checkpoint.dir; }, {},
                   "where checkpoints go; \"\" for none"),
        int_key("checkpoint.every", [](Config& c) -> int& { return c.checkpoint.every; }, 0,
                "save every N steps (and at the end); 0 only at the end"),
        string_key("checkpoint.init", [](Config& c) -> std::string& { return c.checkpoint.init; }, {},
                   "start from these weights (llm.c checkpoint)"),
        string_key("checkpoint.resume", [](Config& c) -> std::string& { return c.checkpoint.resume; }, {},
                   "continue the run saved in this directory"),
        bool_key("checkpoint.overwrite", [](Config& c) -> bool& { return c.checkpoint.overwrite; },
                 "a new run replaces what an earlier run left: the checkpoints in checkpoint.dir, the "
                 "logging.metrics file (else an error)"),
        int_key("checkpoint.keep_last", [](Config& c) -> int& { return c.checkpoint.keep_last; }, 0,
                "after each save keep only the newest N checkpoints; 0 keeps all"),
        int_key("logging.every", [](Config& c) -> int& { return c.logging.every; }, 1, "print every N steps"),
        string_key("logging.metrics", [](Config& c) -> std::string& { return c.logging.metrics; }, {},
                   "write JSON lines of metrics here (appended to on resume; a new run refuses a file that "
                   "holds metrics unless checkpoint.overwrite)"),
        string_key("logging.trace", [](Config& c) -> std::string& { return c.logging.trace; }, {},
                   "write a Chrome trace (Perfetto) of every rank's compute and communication here"),
        int_key("logging.sample_every", [](Config& c) -> int& { return c.logging.sample_every; }, 0,
                "print a short sample every N steps; 0 is never"),
        int_key("logging.sample_tokens", [](Config& c) -> int& { return c.logging.sample_tokens; }, 1,
                "tokens per sample"),
        int_key("logging.trace_steps", [](Config& c) -> int& { return c.logging.trace_steps; }, 1,
                "steps the trace covers (from the first)"),
    };
    return all;
}
// clang-format on

const Key* find_key(const std::string& name) {
    for (const Key& k : keys())
        if (k.name == name) return &k;
    return nullptr;
}

void apply(Config& c, const std::string& where, const std::string& name, const std::string& value) {
    const Key* key = find_key(name);
    if (!key) throw ConfigError(where + ": unknown key " + name);
    try {
        key->set(c, value);
    } catch (const std::invalid_argument& e) {
        throw ConfigError(where + ": " + name + ": " + e.what());
    }
}

// Whether some key's name continues `name` with a dot ("parallel.emulated_link").
bool is_section(const std::string& name) {
    for (const Key& k : keys())
        if (k.name.rfind(name + ".", 0) == 0) return true;
    return false;
}

// Applies every key of a YAML map; a nested map ("emulated_link: {gbps: 5}")
// names its keys with one more dot.
void apply_map(Config& c, const std::string& path, const std::string& prefix, const YAML::Node& map) {
    std::set<std::string> seen;  // yaml-cpp keeps a repeated key: the second would win, silently
    for (const auto& entry : map) {
        std::string key = prefix + "." + entry.first.as<std::string>();
        std::string at = path + ":" + std::to_string(entry.first.Mark().line + 1);
        if (!seen.insert(key).second) throw ConfigError(at + ": " + key + " is given twice");
        if (entry.second.IsMap()) {
            if (find_key(key)) throw ConfigError(at + ": " + key + ": expected a single value");
            if (!is_section(key)) throw ConfigError(at + ": unknown key " + key);
            apply_map(c, path, key, entry.second);  // as deep as the key names go: never deeper than they
            continue;
        }
        if (!find_key(key)) throw ConfigError(at + ": unknown key " + key);
        if (!entry.second.IsScalar()) throw ConfigError(at + ": " + key + ": expected a single value");
        apply(c, at, key, entry.second.Scalar());
    }
}

// Relations between keys, named by the key that has to change.
void validate(const Config& c, const std::string& where) {
    auto fail = [&](const std::string& key, const std::string& what) {
        throw ConfigError(where + ": " + key + ": " + what);
    };
    if (c.model.channels % c.model.heads != 0)
        fail("model.heads",
             std::to_string(c.model.heads) + " does not divide model.channels = " + std::to_string(c.model.channels));
    if (c.model.padded_vocab_size != 0 && c.model.padded_vocab_size < c.model.vocab_size)
        fail("model.padded_vocab_size", "must be ≥ model.vocab_size = " + std::to_string(c.model.vocab_size));
    if (c.model.vocab_size > 65536) fail("model.vocab_size", "token shards hold uint16 tokens: at most 65536");
    if (c.model.channels > ModelLimits::channels)
        fail("model.channels", "at most " + std::to_string(ModelLimits::channels));
    if (c.model.layers > ModelLimits::layers) fail("model.layers", "at most " + std::to_string(ModelLimits::layers));
    if (c.train.seq_len > ModelLimits::seq_len)
        fail("train.seq_len", "at most " + std::to_string(ModelLimits::seq_len));
    if (c.model.max_seq_len > ModelLimits::seq_len)
        fail("model.max_seq_len", "at most " + std::to_string(ModelLimits::seq_len));
    if (c.model.padded_vocab_size > ModelLimits::padded_vocab)
        fail("model.padded_vocab_size", "at most " + std::to_string(ModelLimits::padded_vocab));
    // the largest activation, [s, b, max(4h, Vp)], is indexed with int in the kernels
    const int64_t widest = std::max<int64_t>(
        4 * int64_t(c.model.channels), c.model.padded_vocab_size ? c.model.padded_vocab_size : c.model.vocab_size);
    if (int64_t(c.train.batch_size) * c.train.seq_len * widest >= (int64_t(1) << 31))
        fail("train.batch_size",
             "b·s·max(4h, Vp) = " + std::to_string(int64_t(c.train.batch_size) * c.train.seq_len * widest) +
                 " elements: at most 2^31 − 1 in one activation tensor");
    // AdamW divides m̂ by √v̂ + ε, and m = v = 0 wherever a gradient has always
    // been 0 (the padded vocabulary rows): ε = 0 makes those weights 0/0
    if (!(c.train.eps > 0.0f))
        fail("train.eps", "must be above 0 (with 0, AdamW divides 0 by 0 where a gradient has always been 0)");
    if (c.model.max_seq_len != 0 && c.model.max_seq_len < c.train.seq_len)
        fail("model.max_seq_len", "must be ≥ train.seq_len = " + std::to_string(c.train.seq_len));
    const int t = c.parallel.tp;
    const int padded = c.model.padded_vocab_size ? c.model.padded_vocab_size : (c.model.vocab_size + 127) / 128 * 128;
    auto must_divide = [&](const std::string& what, int value) {
        if (value % t != 0)
            fail("parallel.tp", std::to_string(t) + " does not divide " + what + " = " + std::to_string(value));
    };
    must_divide("model.heads", c.model.heads);
    must_divide("model.channels", c.model.channels);
    must_divide("the padded vocabulary (model.padded_vocab_size)", padded);
    if (c.parallel.sequence_parallel) must_divide("train.seq_len (sequence parallelism shards it)", c.train.seq_len);
    const int cp = c.parallel.cp;
    if (cp > 1) {
        const bool ring = c.parallel.cp_comm_type == "p2p";
        if (ring && c.model.attention == "cudnn")
            fail("model.attention",
                 "cudnn runs under parallel.cp_comm_type: a2a only: ring attention (p2p) merges "
                 "each K/V block's part by the rows' running max and sum, which tpsp's "
                 "explicit kernels keep (model.attention: explicit)");
        if (!ring && c.model.heads % (t * cp) != 0)
            fail("parallel.cp", "tp · cp = " + std::to_string(t * cp) +
                                    " does not divide model.heads = " + std::to_string(c.model.heads) +
                                    " (a2a gives each rank heads / (tp · cp) heads; p2p needs only tp to divide them)");
        // (stricter than TP-only needs, where tp does not cut positions: one rule for both modes)
        if (c.train.seq_len % (2 * cp * t) != 0)
            fail("parallel.cp", "2 · cp · tp = " + std::to_string(2 * cp * t) + " does not divide train.seq_len = " +
                                    std::to_string(c.train.seq_len) + " (2 · cp chunks of positions, cut by tp)");
    }
    if (const std::string error = pipeline_shape_error(
            {c.parallel.pp, c.parallel.vpp, c.train.grad_accum, c.model.layers});
        !error.empty()) {
        const size_t colon = error.find(':');
        fail(error.substr(0, colon), error.substr(colon + 2));
    }
    if (c.parallel.pp > 1 && c.model.recompute == "full" &&
        c.model.recompute_layers > c.model.layers / (c.parallel.pp * c.parallel.vpp))
        fail("model.recompute_layers", std::to_string(c.model.recompute_layers) +
                                           " blocks to recompute, more than a model chunk's " +
                                           std::to_string(c.model.layers / (c.parallel.pp * c.parallel.vpp)) +
                                           " (model.layers / (pp · vpp)): full recomputation runs within a chunk");
    if (c.train.hellaswag_every > 0 && c.data.hellaswag.empty())
        fail("data.hellaswag", "train.hellaswag_every needs the HellaSwag file");
    if (!c.data.hellaswag.empty() && c.model.vocab_size != 256 && c.model.vocab_size != 50257)
        fail("data.hellaswag", "a model of " + std::to_string(c.model.vocab_size) +
                                   " tokens: HellaSwag is encoded with bytes (vocab_size 256) or GPT-2's BPE (50257)");
    if (c.train.hellaswag_every > 0 && cp > 1) fail("train.hellaswag_every", "HellaSwag is scored at parallel.cp = 1");
    if (c.logging.sample_every > 0 && c.model.vocab_size != 256 && c.data.tokenizer.empty())
        fail("data.tokenizer", "logging.sample_every needs the tokenizer file that decodes GPT-2 tokens");
    if (c.parallel.tp_comm_overlap && !c.parallel.sequence_parallel)
        fail("parallel.tp_comm_overlap", "the overlap schedules need parallel.sequence_parallel: true");
    if (!c.checkpoint.resume.empty() && c.checkpoint.dir.empty())
        fail("checkpoint.dir",
             "checkpoint.resume continues a run, but with no checkpoint.dir it would save nothing "
             "(checkpoint.dir=" +
                 c.checkpoint.resume + " continues it where it was saved)");
    if (!c.checkpoint.init.empty() && !c.checkpoint.resume.empty())
        fail("checkpoint.init", "give checkpoint.init or checkpoint.resume, not both");
    if (c.model.attention == "cudnn" && c.train.device == "cpu")
        fail("model.attention", "cudnn is cuDNN's fused attention on the GPU: it needs train.device: cuda");
    if (c.model.attention == "cudnn" && (c.model.channels / c.model.heads) % 8 != 0)
        fail("model.attention",
             "cuDNN's fused attention needs a head size (model.channels / model.heads) "
             "that is a multiple of 8");
    if (c.model.recompute == "full" && c.model.recompute_layers > c.model.layers)
        fail("model.recompute_layers", std::to_string(c.model.recompute_layers) +
                                           " is more than model.layers = " + std::to_string(c.model.layers));
    if (c.model.recompute != "full" && (c.model.recompute_method != "uniform" || c.model.recompute_layers != 1))
        fail("model.recompute_method",
             "model.recompute_method and model.recompute_layers choose the blocks of model.recompute: full");
    // below a megabit/s a transfer's delay overflows the clock's range and becomes none
    if (c.parallel.emulated_link_gbps > 0 && c.parallel.emulated_link_gbps < 1e-3f)
        fail("parallel.emulated_link.gbps", "0 (off) or at least 0.001");
    if (c.parallel.tp_comm_num_splits > c.model.channels)
        fail("parallel.tp_comm_num_splits", std::to_string(c.parallel.tp_comm_num_splits) +
                                                " is more than model.channels = " + std::to_string(c.model.channels) +
                                                ": a chunk would hold no column");
    if (c.parallel.overlap_param_gather && !c.parallel.distributed_optimizer)
        fail("parallel.overlap_param_gather",
             "needs parallel.distributed_optimizer: true (without it every rank updates the whole model and "
             "gathers nothing)");
    if (c.train.device != "cpu" && c.parallel.emulated_link_gbps > 0)
        fail("parallel.emulated_link.gbps", "the emulated link is a CPU measuring aid: it needs train.device: cpu");
}

// The line (from 1) where a YAML text's second document begins, or 0 if it
// holds one. yaml-cpp's Load reads the first document alone and drops the
// rest without a word, even when the first is empty (`---` then `---`, or a
// `...` before the config); its LoadAll hangs on some malformed inputs (found
// by fuzzing), so the markers are found here, in the text. A config is one
// document: directives (`%YAML 1.2`) and comments, at most one `---` before
// its content, and after a `...` nothing but comments; a directive after the
// content begins a second document too.
int second_document_line(const std::string& text) {
    auto has_content = [](const std::string& part) {
        const size_t first = part.find_first_not_of(" \t\r");
        return first != std::string::npos && part[first] != '#';
    };
    bool begun = false, ended = false;                    // the one document: begun by `---` or content, ended by `...`
    const bool bom = text.rfind("\xEF\xBB\xBF", 0) == 0;  // a UTF-8 byte order mark, which yaml-cpp skips
    std::istringstream lines(bom ? text.substr(3) : text);
    int number = 0;
    for (std::string line; std::getline(lines, line);) {
        number++;
        const bool marker = (line.rfind("---", 0) == 0 || line.rfind("...", 0) == 0) &&
                            (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
        if (line.rfind('%', 0) == 0) {  // a directive: before the document, or it begins another
            if (begun || ended) return number;
            continue;
        }
        if (marker && line[0] == '-') {
            if (begun || ended) return number;
            begun = true;
        } else if (marker) {
            if (ended) return number;
            begun = false, ended = true;
        }
        if (!has_content(marker ? line.substr(3) : line)) continue;
        if (ended) return number;
        begun = true;
    }
    return 0;
}

// The file's one YAML document; a second one is refused, not dropped.
YAML::Node load_one_document(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw YAML::BadFile(path);
    std::stringstream text;
    text << in.rdbuf();
    if (const int line = second_document_line(text.str()))
        throw ConfigError(path + ":" + std::to_string(line) +
                          ": a second YAML document begins here (after a `---` or `...`), which would be dropped; a "
                          "config is one document");
    return YAML::Load(text.str());
}

}  // namespace

GPTConfig Config::gpt() const {
    GPTConfig g;
    g.num_layers = model.layers;
    g.num_heads = model.heads;
    g.channels = model.channels;
    g.vocab_size = model.vocab_size;
    g.padded_vocab_size = model.padded_vocab_size ? model.padded_vocab_size : (model.vocab_size + 127) / 128 * 128;
    g.max_seq_len = model.max_seq_len ? model.max_seq_len : train.seq_len;
    g.attention = model.attention == "cudnn" ? AttentionKernel::cudnn_fused : AttentionKernel::explicit_scores;
    return g;
}

RunShape Config::run_shape() const {
    const Recompute recompute = model.recompute == "selective" ? Recompute::selective
                                : model.recompute == "full"    ? Recompute::full
                                                               : Recompute::none;
    return {train.batch_size,
            train.seq_len,
            model.dropout,
            recompute,
            model.recompute_method == "block" ? RecomputeMethod::block : RecomputeMethod::uniform,
            model.recompute_layers};
}

OverlapSettings Config::overlap() const {
    OverlapSettings o;
    if (!parallel.tp_comm_overlap) return o;
    o.ag = parallel.tp_comm_overlap_ag;
    o.rs = parallel.tp_comm_overlap_rs;
    o.rs_pipeline = parallel.tp_comm_rs_method == "pipeline";
    o.rs_dgrad = parallel.tp_comm_overlap_rs_dgrad;
    o.bulk_dgrad = parallel.tp_comm_bulk_dgrad && !o.rs_dgrad;
    o.bulk_wgrad = parallel.tp_comm_bulk_wgrad && !o.rs_dgrad;
    o.num_splits = parallel.tp_comm_num_splits;
    return o;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
    Config c;
    if (!path.empty()) {
        YAML::Node root;
        try {
            check_regular_input(path, "config");
        } catch (const FileError& e) {
            throw ConfigError(e.what());
        }
        try {
            root = load_one_document(path);
        } catch (const YAML::BadFile&) {
            throw ConfigError(path + ": cannot open config");
        } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own message for it says "bad file"
            throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) +
                              ": malformed YAML: nested too deeply (no config key is more than three levels down)");
        } catch (const YAML::Exception& e) {
            throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
        }
        if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
        if (!root.IsMap()) throw ConfigError(path + ": the config must be a map of sections");
        std::set<std::string> sections;
        try {
            for (const auto& section : root) {
                std::string name = section.first.as<std::string>();
                std::string where = path + ":" + std::to_string(section.first.Mark().line + 1);
                if (!sections.insert(name).second) throw ConfigError(where + ": section " + name + " is given twice");
                if (!section.second.IsMap())
                    throw ConfigError(where + ": " + name + ": expected a section (a map of keys)");
                apply_map(c, path, name, section.second);
            }
        } catch (const YAML::Exception& e) {  // a key that is no string (a list, a map), found by fuzzing
            throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg + " (keys are names)");
        }
    }
    for (const std::string& o : overrides) {
        size_t eq = o.find('=');
        if (eq == std::string::npos) throw ConfigError("override '" + o + "': expected section.key=value");
        apply(c, "override " + o.substr(0, eq), o.substr(0, eq), o.substr(eq + 1));
    }
    validate(c, path.empty() ? "config" : path);
    c.file = path;
    return c;
}

std::string resolved_config_text(const Config& config) {
    std::string text;
    for (const Key& k : keys()) text += k.name + "=" + k.show(config) + "\n";
    return text;
}

std::string config_reference() {
    Config defaults;
    std::string out = "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const Key& k : keys())
        out += "| `" + k.name + "` | " + k.type + " | `" + k.show(defaults) + "` | " + k.help + " |\n";
    return out;
}

}  // namespace tpsp
