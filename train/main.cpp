// tpsp: a GPT-2 trainer with every pass written by hand.
//
//   tpsp train   CONFIG.yaml [section.key=value ...]
//   tpsp eval    CONFIG.yaml checkpoint.init=FILE [--hellaswag FILE.jsonl]
//   tpsp memory  CONFIG.yaml [section.key=value ...]
//   tpsp bench   CONFIG.yaml [section.key=value ...] [--steps N] [--breakdown]
//   tpsp prepare --tokenizer byte|gpt2 INPUT... OUT_DIR [options]
//   tpsp sample  CHECKPOINT [--prompt TEXT] [--tokens N] ...
//   tpsp export  CHECKPOINT OUT_DIR [--dtype float32|bfloat16]
//   tpsp import  HF_DIR OUT.bin [--padded-vocab N]
//   tpsp config-reference
//   tpsp versions
//
// The command line is CLI11's: every option is typed and a malformed value
// is one line naming the option. The experiment itself is the YAML config
// and its section.key=value overrides (train/config.h).
#include <mpi.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifdef TPSP_WITH_CUDA
#include "model/cuda_backend.h"
#endif
#include "common/files.h"
#include "data/gpt2_tokenizer.h"
#include "data/prepare.h"
#include "model/cpu_blas.h"
#include "model/hf_gpt2.h"
#include "model/memory_report.h"
#include "parallel/communicator.h"
#include "train/adamw.h"
#include "train/benchmark.h"
#include "train/config.h"
#include "train/sample.h"
#include "train/start_agreement.h"
#include "train/stop_signals.h"
#include "train/trainer.h"

using namespace tpsp;

namespace {

// CONFIG.yaml and its section.key=value overrides: the positionals of train, eval, memory and bench.
struct ConfigArgs {
    std::string path;
    std::vector<std::string> overrides;
    Config load() const { return load_config(path, overrides); }
};

void add_config_arguments(CLI::App* command, ConfigArgs& args) {
    command->add_option("config", args.path, "the experiment config (YAML)")->required();
    command->add_option("overrides", args.overrides, "section.key=value, applied after the file");
}

// A number option's lower bound, said in one line. A value that is not a
// number passes here and fails CLI11's conversion ("Could not convert").
CLI::Validator at_least(double min) {
    return CLI::Validator(
        [min](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (text.empty() || *end || value >= min) return "";
            char message[96];
            std::snprintf(message, sizeof message, "must be at least %g, got %s", min, text.c_str());
            return message;
        },
        "", "at least");
}

// An unsigned 64-bit option's range: CLI11 reads a larger number as 2^64 − 1,
// without a word.
CLI::Validator fits_uint64() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            errno = 0;
            char* end = nullptr;
            std::strtoull(text.c_str(), &end, 10);
            if (text.empty() || *end || text[0] == '-' || errno != ERANGE) return "";
            return "must be in [0, 18446744073709551615], got " + text;
        },
        "", "uint64");
}

bool built_with_cuda() {
#ifdef TPSP_WITH_CUDA
    return true;
#else
    return false;
#endif
}

bool built_with_mpi() {
#ifdef TPSP_SINGLE_PROCESS_MPI
    return false;
#else
    return true;
#endif
}

bool built_with_cudnn() {
#ifdef TPSP_WITH_CUDNN
    return true;
#else
    return false;
#endif
}

int visible_gpus() {
#ifdef TPSP_WITH_CUDA
    return CudaBackend::device_count();
#else
    return 0;
#endif
}

// train.device resolved: auto is cuda where this build has it and a GPU is
// visible, else cpu. `needs_gpu`: the command computes (train, bench), so
// cuda must also have a GPU; `tpsp memory` reports a GPU run anywhere.
Device resolve_device(const Config& cfg, bool needs_gpu) {
    const std::string& device = cfg.train.device;
    if (device == "cpu") return Device::cpu;
    if (device == "auto" && !(built_with_cuda() && visible_gpus() > 0)) {
        if (cfg.model.attention == "cudnn")
            throw ConfigError(
                "model.attention: cudnn: train.device: auto found no GPU, and cuDNN's fused "
                "attention has no CPU version (model.attention: explicit runs anywhere)");
        return Device::cpu;
    }
    if (!built_with_cuda() && needs_gpu)
        throw ConfigError("train.device: cuda: this tpsp was built without CUDA (configure with -DTPSP_CUDA=ON)");
    if (needs_gpu && visible_gpus() == 0)
        throw ConfigError("train.device: cuda: no CUDA device is visible (train.device: auto falls back to the CPU)");
    if (needs_gpu && cfg.model.attention == "cudnn" && !built_with_cudnn())
        throw ConfigError(
            "model.attention: cudnn: this tpsp was built without cuDNN (configure with "
            "-DCUDNN_ROOT=<cuDNN's folder>; model.attention: explicit needs none)");
    return Device::cuda;
}

int command_train(const Config& cfg) {
    [[maybe_unused]] const bool on_gpu = resolve_device(cfg, true) == Device::cuda;  // only in a CUDA build
#ifdef TPSP_WITH_CUDA
    if (on_gpu) return train_on<CudaBackend>(cfg);
#endif
    return train_on<CpuBackend>(cfg);
}

int command_memory(const Config& cfg) {
    const TensorParallelism tp{cfg.parallel.tp, 0, cfg.parallel.sequence_parallel, cfg.overlap()};
    const MemoryReport report = memory_report(
        cfg.gpt(), cfg.run_shape(), tp, resolve_device(cfg, false),
        {cfg.parallel.cp, 0, cfg.parallel.cp > 1 && cfg.parallel.cp_comm_type == "p2p"});
    std::fputs(report.text.c_str(), stdout);
    bool equal = report.equal();
    if (cfg.parallel.pp > 1) {
        const PipelineMemoryReport stages = pipeline_memory_report(
            cfg.gpt(), cfg.run_shape(), tp, resolve_device(cfg, false),
            {cfg.parallel.cp, 0, cfg.parallel.cp > 1 && cfg.parallel.cp_comm_type == "p2p"},
            {cfg.parallel.pp, cfg.parallel.vpp, cfg.train.grad_accum, cfg.model.layers});
        std::fputs(stages.text.c_str(), stdout);
        equal = equal && stages.equal();
    }
    const bool on_gpu = resolve_device(cfg, false) == Device::cuda;
    std::fputs(model_state_table(cfg.gpt(), cfg.parallel.tp, cfg.parallel.bucket_size, on_gpu).c_str(), stdout);
    return equal ? 0 : 1;
}

int command_bench(const Config& cfg, const std::string& path, const BenchOptions& options) {
    if (cfg.parallel.pp > 1 || cfg.parallel.cp > 1)
        throw ConfigError(std::string(cfg.parallel.pp > 1 ? "parallel.pp" : "parallel.cp") +
                          ": tpsp bench times one rank's forward and backward of the whole model; it would ignore "
                          "them: time a pipeline with scripts/bench_pp.sh, context parallelism with "
                          "scripts/bench_cp.sh");
    if (cfg.parallel.tp > 1 || cfg.parallel.tp_comm_overlap)
        throw ConfigError(
            "parallel.tp: tpsp bench times one rank's forward and backward (t = 1, no overlap); it "
            "would ignore parallel.tp and the tp_comm_* switches: time TP+SP with tpsp train under "
            "mpirun (scripts/bench_overlap.sh)");
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    const bool on_gpu = resolve_device(cfg, true) == Device::cuda;  // only in a CUDA build
#ifdef TPSP_WITH_CUDA
    if (on_gpu) run_benchmark<CudaBackend>(cfg.gpt(), cfg.run_shape(), options, path.c_str());
#endif
    if (!on_gpu) run_benchmark<CpuBackend>(cfg.gpt(), cfg.run_shape(), options, path.c_str());
    return 0;
}

// One file given twice (by two names, or through a link) would be trained on twice.
void refuse_repeated_inputs(const std::vector<std::string>& inputs) {
    for (size_t i = 0; i < inputs.size(); i++)
        for (size_t j = i + 1; j < inputs.size(); j++)
            if (same_file(inputs[i], inputs[j]))
                throw ConfigError("tpsp prepare: " + inputs[i] + " and " + inputs[j] + " are the same file");
}

int command_prepare(std::vector<std::string> paths, const PrepareOptions& options) {
    if (paths.size() < 2) throw ConfigError("tpsp prepare: need INPUT... and OUT_DIR");
    // every round(1/f)-th chunk goes to validation: at most every second one, and 1/f must fit an integer
    if (!(options.val_fraction >= 1e-9 && options.val_fraction <= 0.5)) {
        char given[32];
        std::snprintf(given, sizeof given, "%g", options.val_fraction);
        throw ConfigError(std::string("tpsp prepare: --val-fraction must be in [1e-9, 0.5], got ") + given);
    }
    const std::string out_dir = paths.back();
    paths.pop_back();
    refuse_repeated_inputs(paths);
    prepare_shards(paths, out_dir, options);
    return 0;
}

int command_blas_peak(bool this_process_only) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    if (!this_process_only) return measure_every_kernel_set(self.c_str(), omp_get_max_threads());
    std::printf("%.1f\n", measure_sgemm_flops(GemmLibrary::openblas) / 1e9);
    return 0;
}

// What this tpsp was built with and the libraries it loaded, one per line:
// the log of a run on another machine says what actually ran there.
int command_versions() {
    std::printf("build: CUDA %s, cuDNN %s, MPI %s\n", built_with_cuda() ? "on" : "off",
                built_with_cudnn() ? "on" : "off", built_with_mpi() ? "on" : "off (the one-process stand-in)");
    std::printf("CPU GEMMs: %s\n", blas_kernels_description().c_str());
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int length = 0;
    MPI_Get_library_version(mpi, &length);
    const std::string mpi_line(mpi, strcspn(mpi, "\n"));
    std::printf("MPI: %s\n", mpi_line.c_str());
#ifdef TPSP_WITH_CUDA
    for (const std::string& line : CudaBackend::library_versions()) std::printf("%s\n", line.c_str());
#endif
    return 0;
}

// The options of bench, prepare and sample, into the structs their commands take.
void add_bench_options(CLI::App* bench, BenchOptions& options) {
    bench->add_option("--steps", options.steps, "timed steps (after 2 of warm-up)")->check(at_least(1));
    bench->add_flag("--breakdown", options.breakdown, "and one more step, timed part by part");
}

void add_prepare_options(CLI::App* prepare, std::vector<std::string>& paths, PrepareOptions& options) {
    options.tokenizer_dir = "data/gpt2_tokenizer";
    prepare->add_option("paths", paths, "INPUT... OUT_DIR")->required();
    prepare->add_option("--tokenizer", options.tokenizer, "byte (vocabulary 256) or gpt2")
        ->required()
        ->check(CLI::IsMember({"byte", "gpt2"}));
    prepare->add_option("--tokenizer-dir", options.tokenizer_dir, "gpt2: encoder.json and vocab.bpe")
        ->capture_default_str();
    prepare->add_option("--val-fraction", options.val_fraction, "share of the tokens for validation, in [1e-9, 0.5]")
        ->capture_default_str();
    prepare->add_option("--shard-tokens", options.shard_tokens, "tokens per shard at most")
        ->check(at_least(1))
        ->capture_default_str();
    prepare->add_flag("--replace", options.replace, "remove the shards an earlier prepare left in OUT_DIR first");
}

void add_sample_options(CLI::App* sample, std::string& checkpoint, SampleOptions& options) {
    sample->add_option("checkpoint", checkpoint, "an llm.c model file (model_N.bin)")->required();
    sample->add_option("--prompt", options.prompt, "text to continue");
    sample->add_option("--tokens", options.tokens, "tokens to generate")->check(at_least(0))->capture_default_str();
    sample->add_option("--temperature", options.temperature, "0 takes the most likely token")
        ->check(at_least(0))
        ->capture_default_str();
    sample->add_option("--top-k", options.top_k, "draw among the k most likely; 0 is all")
        ->check(at_least(0))
        ->capture_default_str();
    sample->add_option("--seed", options.seed, "of the draws")
        ->check(at_least(0))
        ->check(fits_uint64())
        ->capture_default_str();
    sample->add_option("--tokenizer-dir", options.tokenizer_dir, "GPT-2 vocabulary models: its files")
        ->capture_default_str();
}

// Export's and import's positionals: where from, where to.
struct ConversionPaths {
    std::string from, to;
};

void add_export_options(CLI::App* command, ConversionPaths& paths, ExportOptions& options, std::string& dtype) {
    command->add_option("checkpoint", paths.from, "an llm.c model file (model_N.bin)")->required();
    command->add_option("out_dir", paths.to, "the directory to write (made if missing)")->required();
    command->add_option("--dtype", dtype, "of the weights in model.safetensors")
        ->check(CLI::IsMember({"float32", "bfloat16"}))
        ->capture_default_str();
    command->add_option("--tokenizer-dir", options.tokenizer_dir, "GPT-2 vocabulary models: encoder.json and vocab.bpe")
        ->capture_default_str();
    command->add_flag("--replace", options.replace, "overwrite the files of an earlier export");
}

int command_export(const ConversionPaths& paths, ExportOptions options, const std::string& dtype) {
    options.dtype = dtype == "bfloat16" ? ExportDtype::bfloat16 : ExportDtype::float32;
    std::fputs(export_hugging_face(paths.from, paths.to, options).c_str(), stdout);
    return 0;
}

void add_import_options(CLI::App* command, ConversionPaths& paths, ImportOptions& options) {
    command->add_option("hf_dir", paths.from, "a Hugging Face GPT-2 directory (config.json, model.safetensors)")
        ->required();
    command->add_option("out", paths.to, "the llm.c model file to write")->required();
    command
        ->add_option("--padded-vocab", options.padded_vocab_size,
                     "rows of wte in the checkpoint (Vp); 0 rounds the vocabulary up to a multiple of 128")
        ->check(at_least(0))
        ->capture_default_str();
    command->add_flag("--replace", options.replace, "overwrite an existing file");
}

int command_import(const ConversionPaths& paths, const ImportOptions& options) {
    std::fputs(import_hugging_face(paths.from, paths.to, options).c_str(), stdout);
    return 0;
}

// The exit code of a command whose product is what it prints (sample's text,
// memory's tables, eval's loss): not 0 when that did not reach stdout (a
// full disk, a closed pipe), since the output is then lost.
int printed(int code, bool lead) {
    if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
    const int error = errno;
    if (lead)
        std::fprintf(stderr, "tpsp: error: cannot write to standard output (%s): the output is lost\n",
                     std::strerror(error));
    return code == 0 ? 1 : code;
}

// Parses the command line into the options bound to `app`; returns -1 to go
// on, or the exit code: 0 after --help (1 when the help could not be written), 2 with `error` saying what is wrong.
int parse(CLI::App& app, int argc, char** argv, bool lead, std::string& error) {
    const auto named = [&](const CLI::App* command) { return command->get_name() == argv[1]; };
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands(named).empty()) {
        error = std::string("unknown command '") + argv[1] + "' (tpsp --help lists the commands)";
        return 2;
    }
    try {
        app.parse(argc, argv);
        return -1;
    } catch (const CLI::CallForHelp&) {
        if (!lead) return 0;
        std::fputs(app.help().c_str(), stdout);
        if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return 0;
        error = std::string("error: cannot write the help to standard output (") + std::strerror(errno) + ")";
        return 1;  // help that reached no one
    } catch (const CLI::ParseError& e) {
        const std::string command = app.get_subcommands().empty() ? "" : " " + app.get_subcommands()[0]->get_name();
        error = "the command line: " + std::string(e.what()) + " (tpsp" + command + " --help lists the options)";
        return 2;
    }
}

// The one line of the error being handled: what the user can fix says what
// to fix; anything else is still one line, not an abort.
std::string error_line() {
    try {
        throw;
    } catch (const ConfigError& e) {
        return std::string("config error: ") + e.what();
    } catch (const FileError& e) {
        return std::string("error: ") + e.what();
    } catch (const TokenizerError& e) {
        return std::string("error: ") + e.what();
    } catch (const std::bad_alloc&) {
        return "error: out of memory (reduce train.batch_size or the model)";
    } catch (const std::runtime_error& e) {  // CUDA, cuBLAS, cuDNN, NCCL
        return std::string("error: ") + e.what();
    } catch (const std::exception& e) {  // a check inside tpsp failed
        return std::string("internal error: ") + e.what();
    }
}

// Only train and eval run on several ranks (and versions, which says what
// each node loaded); under mpirun the others would each print their output
// once per rank, and prepare's ranks would write one directory at once.
void refuse_several_ranks(const std::string& command, StartOutcome& start) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (start.exit_code >= 0 || size == 1 || command == "train" || command == "eval" || command == "versions") return;
    start.exit_code = 1;
    start.error = "config error: tpsp " + command + " runs in one process, not on " + std::to_string(size) +
                  " ranks: start it without mpirun (train and eval run on several)";
}

// The command line, every option bound, and what this rank resolved from it.
struct CommandLine {
    std::string command;  // empty when the command line stopped the run (--help, an error)
    ConfigArgs train_args, eval_args, memory_args, bench_args;
    std::string eval_hellaswag;
    BenchOptions bench_options;
    std::vector<std::string> prepare_paths;
    PrepareOptions prepare_options;
    std::string checkpoint;
    SampleOptions sample_options;
    ConversionPaths export_paths, import_paths;
    ExportOptions export_options;
    std::string export_dtype = "float32";
    ImportOptions import_options;
    bool this_process_only = false;
    Config cfg;
    StartOutcome start;
};

// What this rank is about to run, for the ranks to compare: the command and
// its resolved config, or its words for a command without one.
void resolve(int argc, char** argv, CommandLine& line) {
    const ConfigArgs* args = line.command == "train"    ? &line.train_args
                             : line.command == "eval"   ? &line.eval_args
                             : line.command == "memory" ? &line.memory_args
                             : line.command == "bench"  ? &line.bench_args
                                                        : nullptr;
    line.start.resolved = "command=" + line.command + "\n";
    try {
        if (args) {
            line.cfg = args->load();
            line.start.resolved += resolved_config_text(line.cfg);
        } else {
            for (int i = 2; i < argc; i++) line.start.resolved += std::string(argv[i]) + "\n";
        }
    } catch (...) {
        line.start.exit_code = 1;
        line.start.error = error_line();
    }
}

// Parses the command line and loads its config, before MPI starts: a rank's
// own mistake costs no wait, and its parallel.timeout_s bounds MPI's start.
void read_command_line(int argc, char** argv, bool lead, CommandLine& line) {
    CLI::App app{"tpsp: a GPT-2 trainer with tensor and sequence parallelism, every pass written by hand", "tpsp"};
    app.require_subcommand(1);
    add_config_arguments(app.add_subcommand("train", "train as the config says"), line.train_args);
    CLI::App* eval = app.add_subcommand("eval", "validation loss (or HellaSwag's score) of checkpoint.init");
    add_config_arguments(eval, line.eval_args);
    eval->add_option("--hellaswag", line.eval_hellaswag,
                     "score HellaSwag's JSON-lines file instead of the validation loss");
    add_config_arguments(app.add_subcommand("memory", "the saved-activation table and its formula, per rank"),
                         line.memory_args);
    CLI::App* bench = app.add_subcommand("bench", "time forward+backward: ms, tokens/s, MFU");
    add_config_arguments(bench, line.bench_args);
    add_bench_options(bench, line.bench_options);
    add_prepare_options(app.add_subcommand("prepare", "text files -> llm.c token shards"), line.prepare_paths,
                        line.prepare_options);
    add_sample_options(app.add_subcommand("sample", "generate text from a checkpoint (KV cache)"), line.checkpoint,
                       line.sample_options);
    add_export_options(app.add_subcommand("export", "a checkpoint as a Hugging Face GPT-2 directory (safetensors)"),
                       line.export_paths, line.export_options, line.export_dtype);
    add_import_options(app.add_subcommand("import", "a Hugging Face GPT-2 directory as an llm.c checkpoint"),
                       line.import_paths, line.import_options);
    app.add_subcommand("config-reference", "every config key, its type and default");
    app.add_subcommand("versions", "the build's options and the libraries loaded (BLAS, MPI, CUDA, cuDNN, NCCL)");
    app.add_subcommand("blas-peak", "sgemm GFLOP/s of every kernel set this CPU supports; holds the best")
        ->add_flag("--this-process", line.this_process_only, "only the kernels this process runs (a bare number)");

    line.start.exit_code = parse(app, argc, argv, lead, line.start.error);
    line.start.resolved = "stopped by the command line\n";
    if (line.start.exit_code >= 0) return;
    line.command = app.get_subcommands()[0]->get_name();
    if (!line.eval_hellaswag.empty()) line.eval_args.overrides.push_back("data.hellaswag=" + line.eval_hellaswag);
    resolve(argc, argv, line);
}

// The ranks compare what they resolved (train/start_agreement.h); then the
// command runs.
int run_command(CommandLine& line, bool lead) {
    refuse_several_ranks(line.command, line.start);
    if (const int code = agree_on_start(line.start); code >= 0) return code;
    const std::string& command = line.command;
    const Config& cfg = line.cfg;
    if (command == "train") return command_train(cfg);  // goes on with its stdout closed (§7)
    if (command == "prepare") return command_prepare(line.prepare_paths, line.prepare_options);
    if (command == "eval") return printed(evaluate(cfg, !line.eval_hellaswag.empty()), lead);
    if (command == "memory") return printed(command_memory(cfg), lead);
    if (command == "bench") return printed(command_bench(cfg, line.bench_args.path, line.bench_options), lead);
    if (command == "sample") return printed(sample_command(line.checkpoint, line.sample_options), lead);
    if (command == "export")
        return printed(command_export(line.export_paths, line.export_options, line.export_dtype), lead);
    if (command == "import") return printed(command_import(line.import_paths, line.import_options), lead);
    if (command == "blas-peak") return printed(command_blas_peak(line.this_process_only), lead);
    if (command == "versions") return printed(command_versions(), lead);
    std::fputs(config_reference().c_str(), stdout);  // config-reference
    return printed(0, lead);
}

// Any error a command throws after the start is agreed: one line from rank 0.
int report_errors(CommandLine& line) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const bool lead = rank == 0;
    try {
        return run_command(line, lead);
    } catch (...) {
        if (lead) std::fprintf(stderr, "tpsp: %s\n", error_line().c_str());
    }
    return 1;
}

// This process's rank as its launcher set it, before MPI says so: 0 without one.
int launched_rank() {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
        if (const char* value = std::getenv(name)) return std::atoi(value);
    return 0;
}

// Started without a launcher (no mpirun), Open MPI's MPI_Init would start a
// helper daemon whose shared-memory files fail under a file-size limit
// (ulimit -f), with pages of its errors; a lone process needs none.
void start_without_a_daemon_when_alone() {
    const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
    if (!launched) setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);  // a user's own choice stands
}

// MPI_Init waits for every rank of the job to start; a rank stopped before
// it (SIGSTOP, a node gone) would keep the others there forever, where no
// MPI_Abort can reach. After `seconds` this rank says so and exits, and the
// launcher ends the job.
void init_mpi_within(int* argc, char*** argv, double seconds) {
    std::mutex mutex;
    std::condition_variable started;
    bool done = false;
    // every waiting rank's guard would fire at once; 3 s more per rank (mpirun
    // takes a second or two to end the others) lets the lowest one's line end
    // the job alone
    const double deadline = seconds + 3.0 * std::min(launched_rank(), 20);
    std::thread guard([&] {
        std::unique_lock<std::mutex> lock(mutex);
        if (started.wait_for(lock, std::chrono::duration<double>(deadline), [&] { return done; })) return;
        std::fprintf(stderr,
                     "tpsp: rank %d: MPI_Init waited %.0f s for the other ranks to start (parallel.timeout_s, at "
                     "least 10 s): one has stopped or never started; ending the job\n",
                     launched_rank(), deadline);
        std::fflush(stderr);
        std::_Exit(1);
    });
    MPI_Init(argc, argv);
    {
        std::lock_guard<std::mutex> lock(mutex);
        done = true;
    }
    started.notify_one();
    guard.join();
}

}  // namespace

int main(int argc, char** argv) {
    // A closed stdout (`tpsp train … | head`) or a file-size limit makes a
    // write fail, as a full disk does, instead of killing the run: printing is
    // not worth a run, and a file tpsp writes reports its failure in one line.
    std::signal(SIGPIPE, SIG_IGN);
    std::signal(SIGXFSZ, SIG_IGN);
    run_with_the_widest_blas_kernels(argv);   // before MPI and the threads start: it may run tpsp again
    take_stop_signals_on_their_own_thread();  // before MPI's and OpenMP's threads, which inherit the mask
    CommandLine line;
    read_command_line(argc, argv, launched_rank() == 0, line);
    set_peer_timeout(line.cfg.parallel.timeout_s);  // the default where this rank's config did not load
    start_without_a_daemon_when_alone();
    init_mpi_within(&argc, &argv, std::max(peer_timeout(), 10.0));
    const int code = report_errors(line);
    MPI_Finalize();
    return code;
}
