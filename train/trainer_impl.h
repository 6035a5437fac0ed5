// The step loop of `tpsp train`, written once for both backends: trainer.cpp
// instantiates it on the CPU, train/cuda_commands.cpp on CUDA.
#pragma once
#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/token_shards.h"
#include "model/checkpoint.h"
#include "model/sampler.h"
#include "parallel/process_grid.h"
#include "train/adamw.h"
#include "train/config.h"
#include "train/sample.h"
#include "train/trainer.h"

namespace tpsp {

namespace trainer_detail {

// Our side of a checkpoint: what llm.c's model file does not hold.
// Layout: int64 magic, int64 step, int64 loader position, int64 parameter
// count, then AdamW's m and v as fp32, for the whole model in llm.c's order
// (like the model file, independent of t).
constexpr int64_t state_magic = 0x7470737073746174;  // "tpspstat"

inline std::string step_file(const std::string& dir, const char* stem, int step) {
    char name[64];
    std::snprintf(name, sizeof name, "/%s_%08d.bin", stem, step);
    return dir + name;
}

// Assembles the whole model's tensor from the shards of one TP group, on the host.
template <class Backend>
class ShardGatherer {
public:
    ShardGatherer(const GPTModel<Backend>& model, ProcessGrid& grid)
        : model_(model), grid_(grid), full_(size_t(full_parameter_count(model.config))),
          local_(size_t(model.num_parameters)), shards_(size_t(model.num_parameters) * grid.tp) {}
    // Where gather() assembles the whole model (the same buffer every time).
    const float* full() const { return full_.data(); }
    // Collective over the TP group of dp rank 0; the result is valid on world rank 0.
    // local: this rank's shard, in the backend's memory.
    const float* gather(const float* local) {
        Backend::download(local_.data(), local, local_.size() * sizeof(float));
        grid_.tp_group.gather(local_.data(), shards_.data(), size_t(model_.num_parameters), 0);
        if (grid_.tp_rank == 0)
            for (int r = 0; r < grid_.tp; r++)
                copy_parameter_shards(model_.config, grid_.tp, r, full_.data(),
                                      shards_.data() + size_t(r) * model_.num_parameters,
                                      ShardDirection::shard_to_full);
        return full_.data();
    }

private:
    const GPTModel<Backend>& model_;
    ProcessGrid& grid_;
    std::vector<float> full_, local_, shards_;
};

template <class Backend>
void save_run(const std::string& dir, GPTModel<Backend>& model, const AdamWOptimizer<Backend>& opt, ProcessGrid& grid,
              ShardGatherer<Backend>& gatherer, int step, int64_t loader_position) {
    if (grid.dp_rank != 0) return;  // every DP replica holds the same model
    const int64_t n = full_parameter_count(model.config);
    const bool writer = grid.world_rank == 0;
    if (writer) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) throw FileError(dir + ": cannot create checkpoint directory (" + ec.message() + ")");
    }
    const float* params = gatherer.gather(model.params.wte);
    if (writer) save_checkpoint(model.config, params, step_file(dir, "model", step));
    // the moments pass through the gatherer's one buffer in turn
    std::unique_ptr<AtomicFile> state;
    if (writer) {
        state = std::make_unique<AtomicFile>(step_file(dir, "state", step));
        const int64_t head[4] = {state_magic, step, loader_position, n};
        state->write(head, sizeof head);
    }
    for (const float* moment : {opt.m, opt.v}) {
        const float* full = gatherer.gather(moment);
        if (writer) state->write(full, size_t(n) * 4);
    }
    if (!writer) return;
    state->commit();
    std::string latest = std::to_string(step) + "\n";
    write_file_atomically(dir + "/latest", {{latest.data(), latest.size()}});  // last: the pair is complete
}

struct Resumed {
    int step;
    int64_t loader_position;
};

// This rank's shard of a checkpoint's weights, into the model.
template <class Backend>
void load_weights(GPTModel<Backend>& model, const std::string& path) {
    std::vector<float> shard(static_cast<size_t>(model.num_parameters));
    read_checkpoint_shard(model.config, model.tp.size, model.tp.rank, path, shard.data());
    Backend::upload(model.params.wte, shard.data(), shard.size() * sizeof(float));
}

template <class Backend>
Resumed load_run(const std::string& dir, GPTModel<Backend>& model, AdamWOptimizer<Backend>& opt) {
    std::ifstream latest(dir + "/latest");
    int step = -1;
    if (!(latest >> step) || step < 0) throw FileError(dir + "/latest: missing or unreadable: not a tpsp run directory");
    load_weights(model, step_file(dir, "model", step));
    std::string path = step_file(dir, "state", step);
    const int64_t n = full_parameter_count(model.config);
    std::error_code ec;
    uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec || size != 32 + uintmax_t(n) * 8)
        throw FileError(path + ": optimizer state is " + std::to_string(ec ? 0 : size) + " bytes, expected " +
                        std::to_string(32 + n * 8));
    std::ifstream in(path, std::ios::binary);
    int64_t head[4];
    in.read(reinterpret_cast<char*>(head), 32);
    if (head[0] != state_magic || head[1] != step || head[3] != n)
        throw FileError(path + ": not the optimizer state of step " + std::to_string(step) + " of this model");
    std::vector<float> full(static_cast<size_t>(n)), shard(static_cast<size_t>(model.num_parameters));
    for (float* moment : {opt.m, opt.v}) {
        in.read(reinterpret_cast<char*>(full.data()), n * 4);
        if (!in) throw FileError(path + ": optimizer state is truncated");
        copy_parameter_shards(model.config, model.tp.size, model.tp.rank, full.data(), shard.data(),
                              ShardDirection::full_to_shard);
        Backend::upload(moment, shard.data(), shard.size() * sizeof(float));
    }
    return {step, head[2]};
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Mean loss over `batches` validation batches of every DP rank.
template <class Backend>
float validation_loss(GPTModel<Backend>& model, TokenLoader& loader, ProcessGrid& grid, int batches, int* inputs, int* targets) {
    loader.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        loader.next_batch(inputs, targets);
        sum += model.forward(inputs, targets, {}, false);
    }
    grid.dp_group.all_reduce_sum(&sum, 1);
    return float(sum / (double(batches) * grid.dp));
}

// Runs `setup` on every rank; if it failed anywhere, the lowest failing rank
// prints its one line and every rank returns false together: no rank is left
// waiting in a collective.
template <class F>
bool on_every_rank(F&& setup) {
    std::string error;
    try {
        setup();
    } catch (const ConfigError& e) {
        error = std::string("config error: ") + e.what();
    } catch (const FileError& e) {
        error = std::string("error: ") + e.what();
    } catch (const std::bad_alloc&) {
        error = "error: out of memory (reduce train.batch_size or the model, or raise parallel.tp)";
    } catch (const std::runtime_error& e) {  // CUDA, cuBLAS, NCCL
        error = std::string("error: ") + e.what();
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int first_failure = error.empty() ? size : rank;
    MPI_Allreduce(MPI_IN_PLACE, &first_failure, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first_failure == size) return true;
    if (rank == first_failure) {
        if (size > 1) std::fprintf(stderr, "tpsp: rank %d: %s\n", rank, error.c_str());
        else std::fprintf(stderr, "tpsp: %s\n", error.c_str());
    }
    return false;
}

// Which GPU this rank drives: its rank on the node (0 without a launcher
// that says); the CPU backend ignores it.
int local_rank();

}  // namespace trainer_detail

// `tpsp train` on a backend (trainer.cpp: the CPU; cuda_commands.cpp: CUDA).
template <class Backend>
int train_on(const Config& cfg) {
    using namespace trainer_detail;
    using Comm = typename Backend::Comm;
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    const GPTConfig gc = cfg.gpt();
    const RunShape shape = cfg.run_shape();
    const int B = shape.batch, T = shape.seq_len;

    // Everything that can fail on user input happens here, on every rank,
    // before the first step.
    ProcessGrid grid;
    Tracer tracer;
    std::unique_ptr<typename Backend::Runtime> runtime;  // the GPU this rank drives, on CUDA
    std::unique_ptr<Comm> tp_comm, dp_comm;               // the model's and the gradients' groups
    std::unique_ptr<TokenLoader> train_loader, val_loader;
    std::unique_ptr<GPTModel<Backend>> model_owner;
    std::unique_ptr<AdamWOptimizer<Backend>> opt_owner;
    std::unique_ptr<ShardGatherer<Backend>> gatherer;
    std::vector<std::string> token_text;  // what each token prints as, for samples
    std::unique_ptr<Generator> sampler;
    FILE* metrics = nullptr;
    int start_step = 0;
    bool ready = on_every_rank([&] {
        int world;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (world % cfg.parallel.tp != 0)
            throw ConfigError("parallel.tp: " + std::to_string(cfg.parallel.tp) + " does not divide the " +
                              std::to_string(world) + " ranks launched");
        grid = make_process_grid(cfg.parallel.tp);
        train_loader = std::make_unique<TokenLoader>(cfg.data.train, B, T, grid.dp_rank, grid.dp);
        if (!cfg.data.val.empty() && cfg.train.val_every > 0)
            val_loader = std::make_unique<TokenLoader>(cfg.data.val, B, T, grid.dp_rank, grid.dp);
        if (!cfg.checkpoint.init.empty()) check_checkpoint_model(cfg.checkpoint.init, gc);
        TensorParallelism tp{grid.tp, grid.tp_rank, cfg.parallel.sequence_parallel, cfg.overlap()};
        runtime = std::make_unique<typename Backend::Runtime>(local_rank());
        tp_comm = Backend::make_group(*grid.tp_group.mpi());
        dp_comm = Backend::make_group(*grid.dp_group.mpi());
        tp_comm->link = {cfg.parallel.emulated_link_gbps, cfg.parallel.emulated_link_latency_us};
        if (!cfg.logging.trace.empty()) {
            tracer.enable(size_t(200000));
            tracer.fence = Backend::synchronize;  // on a GPU the spans then time the kernels, not their launches
            tp_comm->tracer = &tracer;
        }
        model_owner = std::make_unique<GPTModel<Backend>>(gc, shape, tp, tp_comm.get());
        opt_owner = std::make_unique<AdamWOptimizer<Backend>>(
            *model_owner, AdamWSettings{cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay,
                                        cfg.train.decay_all});
        if (!cfg.checkpoint.dir.empty() || cfg.logging.sample_every > 0)
            gatherer = std::make_unique<ShardGatherer<Backend>>(*model_owner, grid);
        if (cfg.logging.sample_every > 0) {
            if (gc.vocab_size == 256)
                for (int b = 0; b < 256; b++) token_text.push_back(std::string(1, char(b)));
            else
                token_text = read_llmc_tokenizer(cfg.data.tokenizer).token_bytes;
            sampler = std::make_unique<Generator>(gc, gatherer->full());
        }
        if (!cfg.checkpoint.resume.empty()) {
            Resumed r = load_run(cfg.checkpoint.resume, *model_owner, *opt_owner);
            start_step = r.step;
            train_loader->seek(r.loader_position);
        } else if (!cfg.checkpoint.init.empty()) {
            load_weights(*model_owner, cfg.checkpoint.init);
        } else {
            model_owner->init_random(cfg.train.seed);
        }
        if (grid.world_rank == 0 && !cfg.logging.metrics.empty()) {
            std::filesystem::path parent = std::filesystem::path(cfg.logging.metrics).parent_path();
            std::error_code ec;
            if (!parent.empty()) std::filesystem::create_directories(parent, ec);
            metrics = std::fopen(cfg.logging.metrics.c_str(), start_step > 0 ? "a" : "w");
            if (!metrics) throw FileError(cfg.logging.metrics + ": cannot open metrics file for writing");
        }
    });
    if (!ready) return 1;
    GPTModel<Backend>& model = *model_owner;
    AdamWOptimizer<Backend>& opt = *opt_owner;
    const bool lead = grid.world_rank == 0;

    const LrSchedule schedule{cfg.train.lr, cfg.train.min_lr_ratio, cfg.train.warmup_steps, cfg.train.steps,
                              cfg.train.lr_schedule == "cosine"};
    const double peak_flops = Backend::peak_flops();
    const int tokens_per_step = B * T * cfg.train.grad_accum * grid.dp;
    // model FLOPs of one rank's share of the step: the step's over all ranks
    const double flops_per_step = model_flops_per_token(gc, T) * tokens_per_step / grid.world_size;
    if (lead) {
        if (start_step > 0) std::printf("resumed %s at step %d\n", cfg.checkpoint.resume.c_str(), start_step);
        else if (!cfg.checkpoint.init.empty()) std::printf("initialised from %s\n", cfg.checkpoint.init.c_str());
        std::printf("model: L=%d a=%d h=%d V=%d (Vp %d) | %.2fM parameters | b=%d s=%d accum=%d | "
                    "ranks %d = dp %d × tp %d%s | %s, %d threads per rank | %s %.1f GFLOP/s\n",
                    gc.num_layers, gc.num_heads, gc.channels, gc.vocab_size, gc.padded_vocab_size,
                    full_parameter_count(gc) / 1e6, B, T, cfg.train.grad_accum, grid.world_size, grid.dp, grid.tp,
                    grid.tp > 1 ? (cfg.parallel.sequence_parallel ? " (TP+SP)" : " (TP only)") : "",
                    Backend::name, omp_get_max_threads(), Backend::peak_flops_name(), peak_flops / 1e9);
        std::printf("data: %zu train shard(s), %lld batches per epoch\n", train_loader->num_shards(),
                    (long long)train_loader->batches_per_epoch());
        const OverlapSettings o = cfg.overlap();
        if (cfg.parallel.tp_comm_overlap)
            std::printf("overlap: ag %s | rs %s (%s, %d splits) | bulk dgrad %s | bulk wgrad %s | rs dgrad %s%s\n",
                        o.ag ? "on" : "off", o.rs ? "on" : "off", o.rs_pipeline ? "pipeline" : "ring", o.num_splits,
                        o.bulk_dgrad ? "on" : "off", o.bulk_wgrad ? "on" : "off", o.rs_dgrad ? "on" : "off",
                        o.rs_dgrad && (cfg.parallel.tp_comm_bulk_dgrad || cfg.parallel.tp_comm_bulk_wgrad)
                            ? " (tp_comm_overlap_rs_dgrad turns the bulk switches off)"
                            : "");
        if (tp_comm->link.on())
            std::printf("emulated link: %g Gbit/s, %g µs per message (a measuring aid: transfers are held back)\n",
                        tp_comm->link.gbps, tp_comm->link.latency_us);
        std::fflush(stdout);
    }

    std::vector<int> inputs(size_t(B) * T), targets(size_t(B) * T);
    const std::vector<int> sample_prompt = {gc.vocab_size == 256 ? int('\n') : gpt2_end_of_text};
    const float dloss = 1.0f / float(tokens_per_step);
    for (int step = start_step; step < cfg.train.steps; step++) {
        const bool last = step + 1 == cfg.train.steps;
        auto start = std::chrono::steady_clock::now();
        model.zero_grad();
        tp_comm->bytes = {};
        tp_comm->time = {};
        if (step - start_step == cfg.logging.trace_steps) tracer.disable();
        double loss = 0.0;
        for (int micro = 0; micro < cfg.train.grad_accum; micro++) {
            train_loader->next_batch(inputs.data(), targets.data());
            DropoutStep draw{cfg.train.seed, uint32_t(step), (int64_t(micro) * grid.dp + grid.dp_rank) * B};
            loss += model.forward(inputs.data(), targets.data(), draw);
            model.backward(dloss);
        }
        model.reduce_replicated_grads();
        dp_comm->all_reduce_sum(model.grads.wte, size_t(model.num_parameters));
        dp_comm->all_reduce_sum(&loss, 1);
        loss /= double(cfg.train.grad_accum) * grid.dp;
        double norm_parts[2];
        model.grad_square_sums(&norm_parts[0], &norm_parts[1]);
        tp_comm->all_reduce_sum(&norm_parts[0], 1);  // shards add up; replicated tensors count once
        const float norm = float(std::sqrt(norm_parts[0] + norm_parts[1]));
        const float clip = cfg.train.grad_clip > 0 && norm > cfg.train.grad_clip ? cfg.train.grad_clip / norm : 1.0f;
        const float lr = schedule.at(step);
        opt.update(model, lr, clip, step + 1);
        Backend::synchronize();
        const double seconds = seconds_since(start);
        tracer.record("step", Track::compute, now_seconds() - seconds, now_seconds());
        const CollectiveBytes moved = tp_comm->bytes;
        const CommunicationTime comm = tp_comm->time;

        float val = NAN;
        const int done = step + 1;
        if (val_loader && (done % cfg.train.val_every == 0 || last))
            val = validation_loss(model, *val_loader, grid, cfg.train.val_batches, inputs.data(), targets.data());
        if (lead && (done % cfg.logging.every == 0 || last || !std::isnan(val))) {
            std::printf("step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %7.1f ms | %8.0f tok/s | MFU %5.1f%%",
                        done, cfg.train.steps, loss, lr, norm, seconds * 1e3, tokens_per_step / seconds,
                        100.0 * flops_per_step / seconds / peak_flops);
            if (grid.tp > 1)
                std::printf(" | AG %.1f RS %.1f AR %.1f MB | comm %.1f ms, exposed %.1f ms", moved.all_gather / 1e6,
                            moved.reduce_scatter / 1e6, moved.all_reduce / 1e6, comm.total * 1e3, comm.exposed * 1e3);
            if (!std::isnan(val)) std::printf(" | val loss %.4f", val);
            std::printf("\n");
            std::fflush(stdout);
        }
        if (metrics) {
            std::fprintf(metrics,
                         "{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.3f, "
                         "\"tokens_per_s\": %.1f, \"mfu\": %.4f, \"all_gather_bytes\": %lld, "
                         "\"reduce_scatter_bytes\": %lld, \"all_reduce_bytes\": %lld, \"comm_ms\": %.3f, "
                         "\"exposed_comm_ms\": %.3f",
                         done, loss, lr, norm, seconds * 1e3, tokens_per_step / seconds,
                         flops_per_step / seconds / peak_flops, (long long)moved.all_gather,
                         (long long)moved.reduce_scatter, (long long)moved.all_reduce, comm.total * 1e3,
                         comm.exposed * 1e3);
            if (!std::isnan(val)) std::fprintf(metrics, ", \"val_loss\": %.9g", val);
            std::fprintf(metrics, "}\n");
            std::fflush(metrics);
        }
        if (cfg.logging.sample_every > 0 && (done % cfg.logging.sample_every == 0 || last) && grid.dp_rank == 0) {
            gatherer->gather(model.params.wte);
            if (lead) {
                std::printf("sample at step %d: ", done);
                generate(*sampler, gc, sample_prompt, cfg.logging.sample_tokens, 1.0f, 0, cfg.train.seed + uint64_t(done),
                         [&](int t) { std::fputs(size_t(t) < token_text.size() ? token_text[size_t(t)].c_str() : "?", stdout); });
                std::printf("\n");
                std::fflush(stdout);
            }
        }
        if (!cfg.checkpoint.dir.empty() && (last || (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0))) {
            save_run(cfg.checkpoint.dir, model, opt, grid, *gatherer, done, train_loader->position());
            if (lead) std::printf("saved %s\n", step_file(cfg.checkpoint.dir, "model", done).c_str());
        }
    }
    if (metrics) std::fclose(metrics);
    if (!cfg.logging.trace.empty()) {
        tracer.disable();
        MPI_Comm world = MPI_COMM_WORLD;
        if (!tracer.write(cfg.logging.trace, grid.world_rank, &world) && lead)
            std::fprintf(stderr, "tpsp: error: %s: cannot write the trace\n", cfg.logging.trace.c_str());
        else if (lead)
            std::printf("wrote %s (a Chrome trace: open it in Perfetto)\n", cfg.logging.trace.c_str());
    }
    return 0;
}

}  // namespace tpsp
