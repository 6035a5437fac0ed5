#!/usr/bin/env python3
"""PyTorch's GPT-2 on the GPU, the baseline beside `tpsp bench` in the GPU check.

    python3 scripts/bench_torch_gpu.py [--batch 16] [--seq 1024] [--steps 10] [--device cuda]
                                       [--layers 12 --channels 768 --heads 12 --vocab 50257]

GPT-2 (124M by default) as llm.c's train_gpt2.py writes it: bf16 autocast,
fused scaled-dot-product attention (SDPA, flash where PyTorch picks it),
tanh GELU, the LM head tied to wte padded to a multiple of 128, fused
AdamW. Times forward+backward alone (what `tpsp bench` times) and the whole
step with AdamW, each the median of --steps after 3 of warm-up, and prints
tokens/s and MFU with tpsp's FLOP count (model_flops_per_token in
model/gpt.cpp: 6 × matmul parameters + 12·L·s·h per token) against the same
dense bf16 peak (989.4 TFLOP/s on an H100 / H200). `--device cpu` runs it
small on the CPU, to check the script without a GPU.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--device", default="cuda")
    return p.parse_args()


class GPT(torch.nn.Module):
    def __init__(self, L, C, NH, V, T):
        super().__init__()
        self.C, self.NH, self.V = C, NH, V
        Vp = (V + 127) // 128 * 128

        def linear(n_out, n_in, std=0.02):
            return torch.nn.Parameter(std * torch.randn(n_out, n_in)), torch.nn.Parameter(torch.zeros(n_out))

        self.wte = torch.nn.Parameter(0.02 * torch.randn(Vp, C))
        self.wpe = torch.nn.Parameter(0.02 * torch.randn(T, C))
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1 = torch.nn.LayerNorm(C)
            b.qkvw, b.qkvb = linear(3 * C, C)
            b.projw, b.projb = linear(C, C, 0.02 / math.sqrt(2 * L))
            b.ln2 = torch.nn.LayerNorm(C)
            b.fcw, b.fcb = linear(4 * C, C)
            b.fcprojw, b.fcprojb = linear(C, 4 * C, 0.02 / math.sqrt(2 * L))
            self.blocks.append(b)
        self.lnf = torch.nn.LayerNorm(C)

    def attention(self, q, k, v):
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[-2]  # PyTorch before 2.0: the explicit form
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v

    def forward(self, inputs, targets):
        B, T = inputs.shape
        C, NH = self.C, self.NH
        x = self.wte[inputs] + self.wpe[:T]
        for b in self.blocks:
            q, k, v = F.linear(b.ln1(x), b.qkvw, b.qkvb).split(C, dim=-1)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = self.attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, b.projw, b.projb)
            h = F.gelu(F.linear(b.ln2(x), b.fcw, b.fcb), approximate="tanh")
            x = x + F.linear(h, b.fcprojw, b.fcprojb)
        logits = F.linear(self.lnf(x), self.wte)[..., : self.V]
        return F.cross_entropy(logits.float().reshape(-1, self.V), targets.reshape(-1))


def median_seconds(run, steps, synchronize):
    for _ in range(3):
        run()
    synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    a = arguments()
    device = torch.device(a.device)
    torch.manual_seed(1337)
    model = GPT(a.layers, a.channels, a.heads, a.vocab, a.seq).to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    def forward_backward():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(inputs, targets)
        loss.backward()
        return loss

    def whole_step():
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        optimizer.step()

    Vp = (a.vocab + 127) // 128 * 128
    C, L = a.channels, a.layers
    flops_per_token = 6.0 * (L * 12.0 * C * C + Vp * C) + 12.0 * L * a.seq * C
    peak = 989.4e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        if "H100" not in name and "H200" not in name:
            print(f"bench_torch_gpu: {name}: the MFU below is against an H100 / H200's 989.4 TFLOP/s")
    N = a.batch * a.seq
    print(f"pytorch {torch.__version__} {device.type} L={L} h={C} a={a.heads} V={a.vocab} b={a.batch} s={a.seq} "
          f"bf16 autocast, {'SDPA' if hasattr(F, 'scaled_dot_product_attention') else 'explicit attention'}, "
          f"AdamW{' (fused)' if fused else ''} | params {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M")
    for label, run in (("fwd+bwd", forward_backward), ("step with AdamW", whole_step)):
        seconds = median_seconds(run, a.steps, synchronize)
        print(f"pytorch {label}: {seconds * 1e3:.1f} ms (median of {a.steps}) | {N / seconds:.0f} tok/s | "
              f"MFU {100 * flops_per_token * N / seconds / peak:.1f}% of 989.4 TFLOP/s")


if __name__ == "__main__":
    main()
