// tpsp: a GPT-2 trainer with every pass written by hand.
//
//   tpsp train   CONFIG.yaml [section.key=value ...]
//   tpsp eval    CONFIG.yaml checkpoint.init=FILE
//   tpsp memory  CONFIG.yaml [section.key=value ...]
//   tpsp bench   CONFIG.yaml [section.key=value ...] [--steps N] [--breakdown]
//   tpsp prepare --tokenizer byte|gpt2 INPUT... OUT_DIR [options]
//   tpsp sample  CHECKPOINT [--prompt TEXT] [--tokens N] ...
//   tpsp config-reference
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifdef TPSP_WITH_CUDA
#include "model/cuda_backend.h"
#endif
#include "data/gpt2_tokenizer.h"
#include "data/prepare.h"
#include "model/checkpoint.h"
#include "model/memory_report.h"
#include "train/benchmark.h"
#include "train/config.h"
#include "train/sample.h"
#include "train/trainer.h"

using namespace tpsp;

static const char* usage =
    "usage:\n"
    "  tpsp train   CONFIG.yaml [section.key=value ...]   train as the config says\n"
    "  tpsp eval    CONFIG.yaml checkpoint.init=FILE      validation loss of a checkpoint\n"
    "  tpsp memory  CONFIG.yaml [section.key=value ...]   print the activation table and its formula\n"
    "  tpsp bench   CONFIG.yaml [section.key=value ...] [--steps N] [--breakdown]\n"
    "                                                     time forward+backward: ms, tokens/s, MFU;\n"
    "                                                     --breakdown: and the time of each part\n"
    "  tpsp prepare --tokenizer byte|gpt2 INPUT... OUT_DIR [--val-fraction F] [--shard-tokens N]\n"
    "               [--tokenizer-dir DIR]                 text -> llm.c token shards\n"
    "  tpsp sample  CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
    "               [--tokenizer-dir DIR]                 generate text (KV cache), printed as it comes\n"
    "  tpsp config-reference                              every config key, its type and default\n";

// Splits "CONFIG key=value ... [--flag value ...]" into its parts.
struct ConfigArgs {
    std::string path;
    std::vector<std::string> overrides;
    std::vector<std::pair<std::string, std::string>> flags;
};

static ConfigArgs parse_config_args(int argc, char** argv, int first) {
    ConfigArgs args;
    for (int i = first; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--breakdown") {  // the one option without a value
            args.flags.push_back({a, ""});
        } else if (a.rfind("--", 0) == 0) {
            if (i + 1 >= argc) throw ConfigError("option " + a + " needs a value");
            args.flags.push_back({a, argv[++i]});
        } else if (a.find('=') != std::string::npos) {
            args.overrides.push_back(a);
        } else if (args.path.empty()) {
            args.path = a;
        } else {
            throw ConfigError("unexpected argument '" + a + "' (overrides look like section.key=value)");
        }
    }
    if (args.path.empty()) throw ConfigError("missing CONFIG.yaml\n" + std::string(usage));
    return args;
}

static bool built_with_cuda() {
#ifdef TPSP_WITH_CUDA
    return true;
#else
    return false;
#endif
}

static bool built_with_cudnn() {
#ifdef TPSP_WITH_CUDNN
    return true;
#else
    return false;
#endif
}

static int visible_gpus() {
#ifdef TPSP_WITH_CUDA
    return CudaBackend::device_count();
#else
    return 0;
#endif
}

// train.device resolved: auto is cuda where this build has it and a GPU is
// visible, else cpu. `needs_gpu`: the command computes (train, bench), so
// cuda must also have a GPU; `tpsp memory` reports a GPU run anywhere.
static Device resolve_device(const Config& cfg, bool needs_gpu) {
    const std::string& device = cfg.train.device;
    if (device == "cpu") return Device::cpu;
    if (device == "auto" && !(built_with_cuda() && visible_gpus() > 0)) {
        if (cfg.model.attention == "cudnn")
            throw ConfigError("model.attention: cudnn: train.device: auto found no GPU, and cuDNN's fused "
                              "attention has no CPU version (model.attention: explicit runs anywhere)");
        return Device::cpu;
    }
    if (!built_with_cuda() && needs_gpu)
        throw ConfigError("train.device: cuda: this tpsp was built without CUDA (configure with -DTPSP_CUDA=ON)");
    if (needs_gpu && visible_gpus() == 0)
        throw ConfigError("train.device: cuda: no CUDA device is visible (train.device: auto falls back to the CPU)");
    if (needs_gpu && cfg.model.attention == "cudnn" && !built_with_cudnn())
        throw ConfigError("model.attention: cudnn: this tpsp was built without cuDNN (configure with "
                          "-DCUDNN_ROOT=<cuDNN's folder>; model.attention: explicit needs none)");
    return Device::cuda;
}

static int command_memory(const ConfigArgs& args) {
    Config cfg = load_config(args.path, args.overrides);
    for (const auto& flag : args.flags) throw ConfigError("tpsp memory: unknown option " + flag.first);
    TensorParallelism tp{cfg.parallel.tp, 0, cfg.parallel.sequence_parallel, cfg.overlap()};
    MemoryReport report = memory_report(cfg.gpt(), cfg.run_shape(), tp, resolve_device(cfg, false));
    std::fputs(report.text.c_str(), stdout);
    return report.block_bytes == report.block_formula_bytes ? 0 : 1;
}

static int command_bench(const ConfigArgs& args) {
    Config cfg = load_config(args.path, args.overrides);
    BenchOptions options;
    for (const auto& [flag, value] : args.flags) {
        if (flag == "--steps") options.steps = std::max(1, std::atoi(value.c_str()));
        else if (flag == "--breakdown") options.breakdown = true;
        else throw ConfigError("tpsp bench: unknown option " + flag);
    }
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    const bool on_gpu = resolve_device(cfg, true) == Device::cuda;  // only in a CUDA build
#ifdef TPSP_WITH_CUDA
    if (on_gpu) run_benchmark<CudaBackend>(cfg.gpt(), cfg.run_shape(), options, args.path.c_str());
#endif
    if (!on_gpu) run_benchmark<CpuBackend>(cfg.gpt(), cfg.run_shape(), options, args.path.c_str());
    return 0;
}

static int command_train(const ConfigArgs& args) {
    for (const auto& flag : args.flags) throw ConfigError("tpsp train: unknown option " + flag.first);
    Config cfg = load_config(args.path, args.overrides);
    [[maybe_unused]] const bool on_gpu = resolve_device(cfg, true) == Device::cuda;  // only in a CUDA build
#ifdef TPSP_WITH_CUDA
    if (on_gpu) return train_on<CudaBackend>(cfg);
#endif
    return train_on<CpuBackend>(cfg);
}

static int command_prepare(int argc, char** argv) {
    std::vector<std::string> paths;  // the inputs, then OUT_DIR last
    PrepareOptions options;
    options.tokenizer.clear();
    options.tokenizer_dir = "data/gpt2_tokenizer";
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        bool has_value = i + 1 < argc;
        if (a == "--tokenizer" && has_value) options.tokenizer = argv[++i];
        else if (a == "--tokenizer-dir" && has_value) options.tokenizer_dir = argv[++i];
        else if (a == "--val-fraction" && has_value) options.val_fraction = std::atof(argv[++i]);
        else if (a == "--shard-tokens" && has_value) options.shard_tokens = std::atoll(argv[++i]);
        else if (a.rfind("--", 0) == 0) throw ConfigError("tpsp prepare: unknown option " + a);
        else paths.push_back(a);
    }
    if (options.tokenizer != "byte" && options.tokenizer != "gpt2")
        throw ConfigError("tpsp prepare: --tokenizer must be byte or gpt2 (got '" + options.tokenizer + "')");
    if (paths.size() < 2) throw ConfigError("tpsp prepare: need INPUT... and OUT_DIR");
    if (!(options.val_fraction > 0 && options.val_fraction < 1))
        throw ConfigError("tpsp prepare: --val-fraction must be in (0, 1)");
    if (options.shard_tokens < 1) throw ConfigError("tpsp prepare: --shard-tokens must be ≥ 1");
    std::string out_dir = paths.back();
    paths.pop_back();
    prepare_shards(paths, out_dir, options);
    return 0;
}

static int command_sample(int argc, char** argv) {
    std::string checkpoint;
    SampleOptions options;
    for (int i = 2; i < argc; i++) {
        std::string a = argv[i];
        bool has_value = i + 1 < argc;
        auto number = [&](const char* what) {
            char* end = nullptr;
            double v = std::strtod(argv[++i], &end);
            if (*end) throw ConfigError(std::string("tpsp sample: ") + what + ": expected a number, got '" + argv[i] + "'");
            return v;
        };
        if (a == "--prompt" && has_value) options.prompt = argv[++i];
        else if (a == "--tokens" && has_value) options.tokens = int(number("--tokens"));
        else if (a == "--temperature" && has_value) options.temperature = float(number("--temperature"));
        else if (a == "--top-k" && has_value) options.top_k = int(number("--top-k"));
        else if (a == "--seed" && has_value) options.seed = uint64_t(number("--seed"));
        else if (a == "--tokenizer-dir" && has_value) options.tokenizer_dir = argv[++i];
        else if (a.rfind("--", 0) == 0) throw ConfigError("tpsp sample: unknown option (or missing value) " + a);
        else if (checkpoint.empty()) checkpoint = a;
        else throw ConfigError("tpsp sample: unexpected argument '" + a + "'");
    }
    if (checkpoint.empty()) throw ConfigError("tpsp sample: missing CHECKPOINT");
    if (options.tokens < 0 || options.temperature < 0 || options.top_k < 0)
        throw ConfigError("tpsp sample: --tokens, --temperature and --top-k must be ≥ 0");
    return sample_command(checkpoint, options);
}

static int world_rank() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// Errors that reach main are the same on every rank (the config, the
// command line): rank 0 says it, every rank exits 1.
static int run_command(int argc, char** argv);

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int code = run_command(argc, argv);
    MPI_Finalize();
    return code;
}

static int run_command(int argc, char** argv) {
    const bool lead = world_rank() == 0;
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        if (lead) std::fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string command = argv[1];
    try {
        if (command == "train") return command_train(parse_config_args(argc, argv, 2));
        if (command == "eval") {
            ConfigArgs args = parse_config_args(argc, argv, 2);
            for (const auto& flag : args.flags) throw ConfigError("tpsp eval: unknown option " + flag.first);
            return evaluate(load_config(args.path, args.overrides));
        }
        if (command == "memory") return command_memory(parse_config_args(argc, argv, 2));
        if (command == "bench") return command_bench(parse_config_args(argc, argv, 2));
        if (command == "prepare") return command_prepare(argc, argv);
        if (command == "sample") return command_sample(argc, argv);
        if (command == "config-reference") {
            std::fputs(config_reference().c_str(), stdout);
            return 0;
        }
        if (lead) std::fprintf(stderr, "tpsp: unknown command '%s'\n%s", command.c_str(), usage);
        return 2;
    } catch (const ConfigError& e) {
        if (lead) std::fprintf(stderr, "tpsp: config error: %s\n", e.what());
    } catch (const FileError& e) {
        if (lead) std::fprintf(stderr, "tpsp: error: %s\n", e.what());
    } catch (const TokenizerError& e) {
        if (lead) std::fprintf(stderr, "tpsp: error: %s\n", e.what());
    } catch (const std::bad_alloc&) {
        if (lead) std::fprintf(stderr, "tpsp: error: out of memory (reduce train.batch_size or the model)\n");
    } catch (const std::runtime_error& e) {  // CUDA, cuBLAS, cuDNN, NCCL
        if (lead) std::fprintf(stderr, "tpsp: error: %s\n", e.what());
    } catch (const std::exception& e) {  // a check inside tpsp failed: still one line, not an abort
        if (lead) std::fprintf(stderr, "tpsp: internal error: %s\n", e.what());
    }
    return 1;
}
