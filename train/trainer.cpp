#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "data/token_shards.h"
#include "model/checkpoint.h"
#include "train/adamw.h"
#include "train/benchmark.h"

namespace tpsp {

namespace {

// Our side of a checkpoint: what llm.c's model file does not hold.
// Layout: int64 magic, int64 step, int64 loader position, int64 parameter
// count, then m and v as fp32.
constexpr int64_t state_magic = 0x7470737073746174;  // "tpspstat"

std::string step_file(const std::string& dir, const char* stem, int step) {
    char name[64];
    std::snprintf(name, sizeof name, "/%s_%08d.bin", stem, step);
    return dir + name;
}

void save_run(const std::string& dir, const GPT& model, const AdamW& opt, int step, int64_t loader_position) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw FileError(dir + ": cannot create checkpoint directory (" + ec.message() + ")");
    save_checkpoint(model, step_file(dir, "model", step));
    int64_t n = model.num_parameters;
    std::vector<char> bytes(32 + size_t(n) * 8);
    int64_t head[4] = {state_magic, step, loader_position, n};
    std::memcpy(bytes.data(), head, 32);
    std::memcpy(bytes.data() + 32, opt.m.data(), size_t(n) * 4);
    std::memcpy(bytes.data() + 32 + size_t(n) * 4, opt.v.data(), size_t(n) * 4);
    write_file_atomically(step_file(dir, "state", step), bytes.data(), bytes.size());
    std::string latest = std::to_string(step) + "\n";
    write_file_atomically(dir + "/latest", latest.data(), latest.size());  // last: the pair is complete
}

struct Resumed {
    int step;
    int64_t loader_position;
};

Resumed load_run(const std::string& dir, GPT& model, AdamW& opt) {
    std::ifstream latest(dir + "/latest");
    int step = -1;
    if (!(latest >> step) || step < 0) throw FileError(dir + "/latest: missing or unreadable: not a tpsp run directory");
    load_checkpoint(model, step_file(dir, "model", step));
    std::string path = step_file(dir, "state", step);
    int64_t n = model.num_parameters;
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
    in.read(reinterpret_cast<char*>(opt.m.data()), n * 4);
    in.read(reinterpret_cast<char*>(opt.v.data()), n * 4);
    if (!in) throw FileError(path + ": optimizer state is truncated");
    return {step, head[2]};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

float validation_loss(GPT& model, TokenLoader& loader, int batches, int* inputs, int* targets) {
    loader.reset();
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        loader.next_batch(inputs, targets);
        sum += model.forward(inputs, targets, {}, false);
    }
    return float(sum / batches);
}

}  // namespace

int train(const Config& cfg) {
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    const GPTConfig gc = cfg.gpt();
    const RunShape shape = cfg.run_shape();
    const int B = shape.batch, T = shape.seq_len;

    // Everything that can fail on user input is opened before the model is allocated.
    TokenLoader train_loader(cfg.data.train, B, T, 0, 1);
    std::unique_ptr<TokenLoader> val_loader;
    if (!cfg.data.val.empty() && cfg.train.val_every > 0)
        val_loader = std::make_unique<TokenLoader>(cfg.data.val, B, T, 0, 1);
    if (!cfg.checkpoint.init.empty()) check_checkpoint_model(cfg.checkpoint.init, gc);

    GPT model(gc, shape);
    AdamW opt(model, {cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay, cfg.train.decay_all});
    int start_step = 0;
    if (!cfg.checkpoint.resume.empty()) {
        Resumed r = load_run(cfg.checkpoint.resume, model, opt);
        start_step = r.step;
        train_loader.seek(r.loader_position);
        std::printf("resumed %s at step %d\n", cfg.checkpoint.resume.c_str(), start_step);
    } else if (!cfg.checkpoint.init.empty()) {
        load_checkpoint(model, cfg.checkpoint.init);
        std::printf("initialised from %s\n", cfg.checkpoint.init.c_str());
    } else {
        model.init_random(cfg.train.seed);
    }

    FILE* metrics = nullptr;
    if (!cfg.logging.metrics.empty()) {
        std::filesystem::path parent = std::filesystem::path(cfg.logging.metrics).parent_path();
        std::error_code ec;
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        metrics = std::fopen(cfg.logging.metrics.c_str(), start_step > 0 ? "a" : "w");
        if (!metrics) throw FileError(cfg.logging.metrics + ": cannot open metrics file for writing");
    }
    const LrSchedule schedule{cfg.train.lr, cfg.train.min_lr_ratio, cfg.train.warmup_steps, cfg.train.steps,
                              cfg.train.lr_schedule == "cosine"};
    const double peak_flops = measure_sgemm_flops();
    const int tokens_per_step = B * T * cfg.train.grad_accum;
    const double flops_per_step = model_flops_per_token(gc, T) * tokens_per_step;
    std::printf("model: L=%d a=%d h=%d V=%d (Vp %d) | %.2fM parameters | b=%d s=%d accum=%d | %d threads | "
                "sgemm peak %.1f GFLOP/s\n",
                gc.num_layers, gc.num_heads, gc.channels, gc.vocab_size, gc.padded_vocab_size,
                model.num_parameters / 1e6, B, T, cfg.train.grad_accum, omp_get_max_threads(), peak_flops / 1e9);
    std::printf("data: %zu train shard(s), %lld batches per epoch\n", train_loader.num_shards(),
                (long long)train_loader.batches_per_epoch());

    std::vector<int> inputs(size_t(B) * T), targets(size_t(B) * T);
    const float dloss = 1.0f / float(tokens_per_step);
    for (int step = start_step; step < cfg.train.steps; step++) {
        const bool last = step + 1 == cfg.train.steps;
        auto start = std::chrono::steady_clock::now();
        model.zero_grad();
        double loss = 0.0;
        for (int micro = 0; micro < cfg.train.grad_accum; micro++) {
            train_loader.next_batch(inputs.data(), targets.data());
            DropoutStep draw{cfg.train.seed, uint32_t(step), int64_t(micro) * B};
            loss += model.forward(inputs.data(), targets.data(), draw);
            model.backward(inputs.data(), targets.data(), dloss);
        }
        loss /= cfg.train.grad_accum;
        const float norm = gradient_norm(model);
        const float clip = cfg.train.grad_clip > 0 && norm > cfg.train.grad_clip ? cfg.train.grad_clip / norm : 1.0f;
        const float lr = schedule.at(step);
        opt.update(model, lr, clip, step + 1);
        const double seconds = seconds_since(start);

        float val = NAN;
        const int done = step + 1;
        if (val_loader && (done % cfg.train.val_every == 0 || last))
            val = validation_loss(model, *val_loader, cfg.train.val_batches, inputs.data(), targets.data());
        if (done % cfg.logging.every == 0 || last || !std::isnan(val)) {
            std::printf("step %5d/%d | loss %.6f | lr %.3e | grad norm %.4f | %7.1f ms | %8.0f tok/s | MFU %5.1f%%",
                        done, cfg.train.steps, loss, lr, norm, seconds * 1e3, tokens_per_step / seconds,
                        100.0 * flops_per_step / seconds / peak_flops);
            if (!std::isnan(val)) std::printf(" | val loss %.4f", val);
            std::printf("\n");
            std::fflush(stdout);
        }
        if (metrics) {
            std::fprintf(metrics,
                         "{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"ms\": %.3f, "
                         "\"tokens_per_s\": %.1f, \"mfu\": %.4f",
                         done, loss, lr, norm, seconds * 1e3, tokens_per_step / seconds,
                         flops_per_step / seconds / peak_flops);
            if (!std::isnan(val)) std::fprintf(metrics, ", \"val_loss\": %.9g", val);
            std::fprintf(metrics, "}\n");
            std::fflush(metrics);
        }
        if (!cfg.checkpoint.dir.empty() && (last || (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0))) {
            save_run(cfg.checkpoint.dir, model, opt, done, train_loader.position());
            std::printf("saved %s\n", step_file(cfg.checkpoint.dir, "model", done).c_str());
        }
    }
    if (metrics) std::fclose(metrics);
    return 0;
}

int evaluate(const Config& cfg) {
    if (cfg.train.threads > 0) omp_set_num_threads(cfg.train.threads);
    if (cfg.checkpoint.init.empty()) throw ConfigError("tpsp eval: checkpoint.init: give the checkpoint to evaluate");
    if (cfg.data.val.empty()) throw ConfigError("tpsp eval: data.val: give the validation shards");
    const GPTConfig gc = cfg.gpt();
    const RunShape shape = cfg.run_shape();
    TokenLoader val_loader(cfg.data.val, shape.batch, shape.seq_len, 0, 1);
    check_checkpoint_model(cfg.checkpoint.init, gc);
    GPT model(gc, shape);
    load_checkpoint(model, cfg.checkpoint.init);
    std::vector<int> inputs(size_t(shape.batch) * shape.seq_len), targets(inputs.size());
    float val = validation_loss(model, val_loader, cfg.train.val_batches, inputs.data(), targets.data());
    std::printf("val loss %.9g over %d batches of %d×%d tokens\n", val, cfg.train.val_batches, shape.batch,
                shape.seq_len);
    return 0;
}

}  // namespace tpsp
