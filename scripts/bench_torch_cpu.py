#!/usr/bin/python3
"""PyTorch on the same CPU, for contrast with `tpsp bench`: forward+backward
of GPT-2 with B, T as given, fp32, on one thread and on all cores. Needs Debian's python3-torch.

    /usr/bin/python3 scripts/bench_torch_cpu.py [L C heads V B T]   (default: 124M at B=4 T=64)
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

L, C, NH, V, B, T = (int(a) for a in sys.argv[1:7]) if len(sys.argv) >= 7 else (12, 768, 12, 50257, 4, 64)
Vp = (V + 127) // 128 * 128


def block_params():
    def w(*shape):
        return (0.02 * torch.randn(*shape)).requires_grad_()
    return dict(ln1w=torch.ones(C, requires_grad=True), ln1b=torch.zeros(C, requires_grad=True),
                qkvw=w(3 * C, C), qkvb=torch.zeros(3 * C, requires_grad=True),
                projw=w(C, C), projb=torch.zeros(C, requires_grad=True),
                ln2w=torch.ones(C, requires_grad=True), ln2b=torch.zeros(C, requires_grad=True),
                fcw=w(4 * C, C), fcb=torch.zeros(4 * C, requires_grad=True),
                fcprojw=w(C, 4 * C), fcprojb=torch.zeros(C, requires_grad=True))


wte = (0.02 * torch.randn(Vp, C)).requires_grad_()
wpe = (0.02 * torch.randn(T, C)).requires_grad_()
blocks = [block_params() for _ in range(L)]
lnfw, lnfb = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
tokens = torch.randint(0, V, (B, T + 1))
causal = torch.ones(T, T, dtype=torch.bool).tril()


def step():
    x = wte[tokens[:, :T]] + wpe
    for p in blocks:
        h = F.layer_norm(x, (C,), p["ln1w"], p["ln1b"])
        q, k, v = (h @ p["qkvw"].T + p["qkvb"]).split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / (C // NH) ** 0.5).masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["projw"].T + p["projb"]
        h = F.gelu(F.layer_norm(x, (C,), p["ln2w"], p["ln2b"]) @ p["fcw"].T + p["fcb"], approximate="tanh")
        x = x + h @ p["fcprojw"].T + p["fcprojb"]
    logits = F.layer_norm(x, (C,), lnfw, lnfb) @ wte.T
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), tokens[:, 1:].reshape(-1))
    loss.backward()


for threads in sorted({1, os.cpu_count()}):
    torch.set_num_threads(threads)
    for _ in range(2):
        step()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    ms = sorted(times)[len(times) // 2] * 1e3
    print(f"pytorch {torch.__version__} L={L} h={C} a={NH} V={V} b={B} s={T} threads={threads} | "
          f"fwd+bwd {ms:.1f} ms (median of 5) | {B * T / ms * 1e3:.0f} tok/s")
