#!/usr/bin/python3
"""Writes tests/reference/tiny_gpt2.bin: a tiny GPT-2 (padded vocabulary),
its weights and tokens, and what PyTorch computes for them in float64 —
logits, loss, every parameter gradient, and the losses of 10 AdamW steps.
The C++ test (tests/test_model.cpp) loads the same weights and compares.

Run with Debian's torch:  /usr/bin/python3 scripts/make_torch_reference.py
"""
import struct
import sys

import torch
import torch.nn.functional as F

L, NH, C, V, Vp, maxT, B, T = 2, 4, 64, 65, 128, 32, 2, 32
STEPS = 10
LR, BETA1, BETA2, EPS, WD = 1e-3, 0.9, 0.95, 1e-8, 0.1
MAGIC = 20241201

# llm.c's parameter order; True where AdamW decays (the matrices)
SHAPES = [
    ("wte", (Vp, C), True), ("wpe", (maxT, C), True),
    ("ln1w", (L, C), False), ("ln1b", (L, C), False),
    ("qkvw", (L, 3 * C, C), True), ("qkvb", (L, 3 * C), False),
    ("attprojw", (L, C, C), True), ("attprojb", (L, C), False),
    ("ln2w", (L, C), False), ("ln2b", (L, C), False),
    ("fcw", (L, 4 * C, C), True), ("fcb", (L, 4 * C), False),
    ("fcprojw", (L, C, 4 * C), True), ("fcprojb", (L, C), False),
    ("lnfw", (C,), False), ("lnfb", (C,), False),
]


def make_weights(generator):
    params = {}
    for name, shape, _ in SHAPES:
        if name in ("ln1w", "ln2w", "lnfw"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith("b"):
            w = 0.02 * torch.randn(shape, generator=generator)
        else:
            w = 0.05 * torch.randn(shape, generator=generator)
        params[name] = w.float()
    params["wte"][V:] = 0.0  # llm.c pads the vocabulary with zero rows
    return params


def forward(p, inputs, targets):
    """GPT-2 as tpsp computes it, dropout 0. Returns (logits [B,T,Vp], loss)."""
    pos = torch.arange(T)
    x = p["wte"][inputs] + p["wpe"][pos]
    hs = C // NH
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = x @ p["wte"].T
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def main(out_path):
    g = torch.Generator().manual_seed(20241201)
    weights = make_weights(g)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    inputs, targets = tokens[:, :T], tokens[:, 1:]

    p = {k: w.double().requires_grad_(True) for k, w in weights.items()}
    logits, loss = forward(p, inputs, targets)
    loss.backward()
    grads = {k: t.grad.clone() for k, t in p.items()}

    decay = [p[n] for n, _, d in SHAPES if d]
    no_decay = [p[n] for n, _, d in SHAPES if not d]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(BETA1, BETA2), eps=EPS)
    step_losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        _, step_loss = forward(p, inputs, targets)
        step_losses.append(step_loss.item())
        step_loss.backward()
        opt.step()

    with open(out_path, "wb") as f:
        f.write(struct.pack("<10i", MAGIC, L, NH, C, V, Vp, maxT, B, T, STEPS))
        f.write(struct.pack("<5d", LR, BETA1, BETA2, EPS, WD))
        f.write(inputs.to(torch.int32).numpy().tobytes())
        f.write(targets.to(torch.int32).numpy().tobytes())
        for name, _, _ in SHAPES:
            f.write(weights[name].numpy().tobytes())
        f.write(logits.detach().float().numpy().tobytes())
        f.write(struct.pack("<d", loss.item()))
        for name, _, _ in SHAPES:
            f.write(grads[name].float().numpy().tobytes())
        f.write(struct.pack(f"<{STEPS}d", *step_losses))
    print(f"wrote {out_path}: loss {loss.item():.6f}, after {STEPS} AdamW steps {step_losses[-1]:.6f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/reference/tiny_gpt2.bin")
