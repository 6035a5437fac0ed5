#!/usr/bin/env python3
"""GPT-2 as transformers defines it, written with the standard library alone,
run on a `tpsp export` directory: it reads model.safetensors and config.json
by the formats' descriptions, uses transformers' parameter names and the
Conv1D convention (y = x·W + b with W stored [in, out]), and computes the
logits in float64. They must equal the logits tpsp computed on the same
tokens (tests/test_hf_gpt2.cpp writes them) within 1e-4.

    python3 tests/hf_gpt2_reference.py EXPORT_DIR TPSP_LOGITS.json
"""
import json
import math
import struct
import sys


def read_safetensors(path):
    raw = open(path, "rb").read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] != "F32":
            sys.exit(f"{name}: dtype {info['dtype']}, this reference reads F32")
        flat = struct.unpack(f"<{(end - begin) // 4}f", data[begin:end])
        shape = info["shape"]
        if len(shape) == 1:
            tensors[name] = list(flat)
        else:
            rows, cols = shape
            tensors[name] = [list(flat[r * cols:(r + 1) * cols]) for r in range(rows)]
    return tensors


def conv1d(x, weight, bias):  # x [n], weight [n, m] (Conv1D's [in, out]), bias [m]
    out = list(bias)
    for i, xi in enumerate(x):
        row = weight[i]
        for j in range(len(out)):
            out[j] += xi * row[j]
    return out


def layer_norm(x, weight, bias, eps):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    rstd = 1.0 / math.sqrt(var + eps)
    return [(v - mean) * rstd * w + b for v, w, b in zip(x, weight, bias)]


def gelu_new(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def logits_of(tokens, w, config):
    C, H, L = config["n_embd"], config["n_head"], config["n_layer"]
    eps, hs = config["layer_norm_epsilon"], config["n_embd"] // config["n_head"]
    x = [[a + b for a, b in zip(w["transformer.wte.weight"][tok], w["transformer.wpe.weight"][t])]
         for t, tok in enumerate(tokens)]
    for layer in range(L):
        p = f"transformer.h.{layer}."
        h = [layer_norm(v, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps) for v in x]
        qkv = [conv1d(v, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]) for v in h]
        y = [[0.0] * C for _ in tokens]
        for head in range(H):
            at = head * hs
            for t in range(len(tokens)):
                q = qkv[t][at:at + hs]
                scores = [sum(a * b for a, b in zip(q, qkv[u][C + at:C + at + hs])) / math.sqrt(hs)
                          for u in range(t + 1)]  # causal: keys up to t
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                total = sum(e)
                for u in range(t + 1):
                    v = qkv[u][2 * C + at:2 * C + at + hs]
                    for d in range(hs):
                        y[t][at + d] += e[u] / total * v[d]
        x = [[a + b for a, b in zip(xv, conv1d(yv, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"]))]
             for xv, yv in zip(x, y)]
        h = [layer_norm(v, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps) for v in x]
        fc = [[gelu_new(u) for u in conv1d(v, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"])] for v in h]
        x = [[a + b for a, b in zip(xv, conv1d(fv, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"]))]
             for xv, fv in zip(x, fc)]
    x = [layer_norm(v, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps) for v in x]
    wte = w["transformer.wte.weight"]  # the tied LM head
    return [[sum(a * b for a, b in zip(v, row)) for row in wte] for v in x]


def main():
    export_dir, tpsp_file = sys.argv[1], sys.argv[2]
    config = json.load(open(f"{export_dir}/config.json"))
    weights = read_safetensors(f"{export_dir}/model.safetensors")
    tpsp = json.load(open(tpsp_file))
    logits = logits_of(tpsp["tokens"], weights, config)
    worst = max(abs(a - b) for row, tpsp_row in zip(logits, tpsp["logits"]) for a, b in zip(row, tpsp_row))
    shape_ok = len(logits) == len(tpsp["logits"]) and all(len(r) == len(t) for r, t in zip(logits, tpsp["logits"]))
    print(f"hf_gpt2_reference: {len(logits)} positions × {len(logits[0])} logits, largest difference {worst:.3g}")
    if not shape_ok or worst > 1e-4:
        sys.exit("hf_gpt2_reference: the export's logits differ from tpsp's")


if __name__ == "__main__":
    main()
