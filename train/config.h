// The YAML experiment config: sections model, data, train, parallel,
// checkpoint, logging. Every key is declared once below with its type and
// default; the file and the command-line overrides (section.key=value) are
// checked against that list before anything is allocated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "model/gpt_config.h"
#include "parallel/layout.h"

namespace tpsp {

struct Config {
    struct Model {
        int layers = 4, heads = 4, channels = 128;
        int vocab_size = 256;
        int padded_vocab_size = 0;  // 0: round vocab_size up to a multiple of 128
        int max_seq_len = 0;        // 0: train.seq_len
        float dropout = 0.0f;
        std::string attention = "explicit";        // explicit | cudnn (cuDNN's fused attention, GPU only)
        std::string recompute = "none";            // none | selective | full
        std::string recompute_method = "uniform";  // uniform | block (full recomputation)
        int recompute_layers = 1;                  // blocks per run (uniform), or recomputed blocks (block)
    } model;
    struct Data {
        std::string train = "data/kjv/train_*.bin";
        std::string val = "data/kjv/val_*.bin";
        std::string tokenizer;  // llm.c's gpt2_tokenizer.bin, to print samples of a GPT-2-vocabulary model
        std::string hellaswag;  // HellaSwag's JSON lines (train/hellaswag.h); "" for none
        std::string bpe_dir = "data/gpt2_tokenizer";  // encoder.json, vocab.bpe: HellaSwag's GPT-2 tokens
    } data;
    struct Train {
        int batch_size = 16, seq_len = 128, grad_accum = 1;
        int steps = 1000, warmup_steps = 0;
        float lr = 1e-3f, min_lr_ratio = 0.1f;
        std::string lr_schedule = "cosine";  // cosine | constant
        float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
        float weight_decay = 0.1f;
        bool decay_all = false;  // decay every tensor, not only the matrices
        float grad_clip = 1.0f;  // 0: off
        int val_every = 100, val_batches = 20;
        int hellaswag_every = 0;  // 0: never
        uint64_t seed = 1337;
        int threads = 0;             // 0: OpenMP's default
        std::string device = "cpu";  // cpu | cuda | auto
    } train;
    struct Parallel {
        int tp = 1;
        bool sequence_parallel = true;
        // Context parallelism (docs/design.md §9): every sequence cut across cp
        // ranks for the whole model; attention through sp2hp / hp2sp
        // (cp_comm_type a2a) or ring attention (p2p: K/V blocks around the ring).
        int cp = 1;
        std::string cp_comm_type = "a2a";
        // Pipeline parallelism (docs/design.md §10): the blocks cut into pp
        // stages, each holding vpp model chunks (vpp > 1: the interleaved
        // schedule); train.grad_accum micro-batches go through them under 1F1B.
        int pp = 1;
        int vpp = 1;
        // Megatron's communication-overlap switches (docs/design.md §4); the master
        // switch off turns every other off.
        bool tp_comm_overlap = false;
        bool tp_comm_overlap_ag = true, tp_comm_overlap_rs = true;
        bool tp_comm_bulk_dgrad = true, tp_comm_bulk_wgrad = true;
        bool tp_comm_overlap_rs_dgrad = false;
        std::string tp_comm_rs_method = "ring";  // ring | pipeline
        int tp_comm_num_splits = 4;
        // Data parallelism (docs/design.md §8): each DP rank keeps AdamW's
        // state for its shard of every gradient bucket only (Megatron's
        // distributed optimizer, ZeRO-1). bucket_size: parameters per bucket
        // (at least; a bucket holds whole tensors or layer slices of them):
        // 250000 (1 MB of fp32) gives configs/tiny.yaml 4 buckets and GPT-2
        // 124M 50 (`tpsp memory` prints them): large enough that a message's
        // latency is small beside its transfer, small enough that the last
        // bucket, which no compute can hide, is short.
        bool distributed_optimizer = false;
        // Each bucket's reduction starts once backward has made it final and
        // moves on between the GEMM tiles of the rest of backward (§8).
        bool overlap_grad_reduce = false;
        // The distributed optimizer's updated parameters are all-gathered
        // behind the next forward, which waits block by block (§8).
        bool overlap_param_gather = false;
        int bucket_size = 250000;
        // How long a rank waits for its peers in one transfer before it ends
        // the job (a peer that stopped would otherwise hang it forever).
        int timeout_s = 300;
        // A measuring aid: hold every transfer back to this link's speed. 0 is off.
        float emulated_link_gbps = 0.0f, emulated_link_latency_us = 0.0f;
    } parallel;
    struct Checkpoint {
        std::string dir;  // "" = no checkpoints
        int every = 0;    // 0: only at the end
        std::string init, resume;
        bool overwrite = false;  // a new run may replace the run already in dir
        int keep_last = 0;       // 0: keep every checkpoint
    } checkpoint;
    struct Logging {
        int every = 1;
        std::string metrics;
        std::string trace;  // Chrome trace of the first trace_steps steps
        int trace_steps = 3;
        int sample_every = 0;  // 0: never
        int sample_tokens = 64;
    } logging;

    std::string file;  // the YAML file it was read from ("" for the defaults alone): one of a run's inputs

    GPTConfig gpt() const;
    RunShape run_shape() const;
    // The tp_comm_* switches resolved: off without the master switch; rs_dgrad turns the bulk ones off.
    OverlapSettings overlap() const;
};

// Reads PATH (may be empty for defaults only) and applies the overrides.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

// Every key with the value it resolved to, one "key=value" a line: what the
// ranks of a job compare before they start (train/start_agreement.h).
std::string resolved_config_text(const Config& config);

// The key reference, as the README prints it.
std::string config_reference();

}  // namespace tpsp
