#!/usr/bin/env python3
"""SpecEE exit predictors (docs/specee.md) from `specula specee-features` data, as a GGUF sidecar.

Each data row is one token of the target's own greedy reply: the EAGLE-3 head's top-4 candidates
and their logits at every layer (the state entering layer l through the final norm and the
candidates' LM-head rows; l = n_layer is the final state). At layer l a token's label is whether
the best candidate there is the full model's token.
  1. The offline schedule: the layers where most tokens settle (the first layer from which the
     best candidate stays the final token), the `--layers` most frequent, plus the last layer
     (an exit there still skips the full LM head).
  2. The paper's features at each scheduled layer: the 4 logits, their softmax over the 4, and
     the softmax's change since the previous scheduled layer (as runtime/exit_predictor.cpp).
  3. Per scheduled layer a 12 -> hidden -> 1 ReLU MLP, logistic loss, Adam, full batch, with the
     feature standardisation folded into the first layer. numpy only. A scheduled layer where no
     token would exit is dropped and the rest refitted.
  4. The default threshold: the smallest on a grid whose simulated exits (first scheduled layer
     above it) agree with the full model on at least --target-agreement of the exited tokens of
     the prompts held out from training (whole prompts).
  5. With --online-from F, predictors also at every other layer from F on, for the online
     scheduling level (runtime/exit_predictor.h: online_probe_layers); the schedule above is the
     file's offline_layers, its MLPs and threshold unchanged (at run time an offline layer's
     change term is still taken from the previous offline layer). Before an online layer the
     previous probe depends on the recent tokens' exits, so its MLP is trained with the change
     term taken from 1-4 layers below and as zeros (first probe).
  train_specee.py --features F.jsonl --model TARGET.gguf --out models/X-specee.gguf
Needs numpy and gguf (PyPI, or llama.cpp's gguf-py on PYTHONPATH)."""
import argparse, json, sys
import numpy as np
import gguf

ap = argparse.ArgumentParser()
ap.add_argument("--features", required=True)
ap.add_argument("--model", required=True, help="the target GGUF (its depth and width go into the sidecar)")
ap.add_argument("--out", required=True)
ap.add_argument("--layers", type=int, default=6, help="scheduled layers besides the last")
ap.add_argument("--min-layer", type=int, default=1,
                help="schedule no layer below this; above the drafter's deepest feature layer, an exit leaves the drafter exact features")
ap.add_argument("--online-from", type=int, default=0,
                help="also train predictors at every layer from this one on, for the online level (0: the offline schedule only)")
ap.add_argument("--hidden", type=int, default=16)
ap.add_argument("--epochs", type=int, default=400)
ap.add_argument("--lr", type=float, default=0.01)
ap.add_argument("--target-agreement", type=float, default=0.98)
ap.add_argument("--valid-share", type=float, default=0.2, help="share of prompts held out for the threshold")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--json", default=None, help="write the exit profile and validation figures here")
a = ap.parse_args()

K, F = 4, 12
reader = gguf.GGUFReader(a.model)
arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
def meta_int(key):
    return int(reader.fields[key].parts[-1][0])
n_layer, n_embd = meta_int(f"{arch}.block_count"), meta_int(f"{arch}.embedding_length")

rows = [json.loads(l) for l in open(a.features)]
if not rows:
    sys.exit("no rows in " + a.features)
logits = np.array([r["logits"] for r in rows], dtype=np.float32)       # [N, L, 4], layers 1..L
cands = np.array([r["candidates"] for r in rows], dtype=np.int64)       # [N, 4]
token = np.array([r["token"] for r in rows], dtype=np.int64)            # [N]
prompt = np.array([r["prompt"] for r in rows], dtype=np.int64)
N, L = logits.shape[0], logits.shape[1]
if L != n_layer:
    sys.exit(f"features have {L} layers, the target {n_layer}")
best = cands[np.arange(N)[:, None], logits.argmax(axis=2)]              # [N, L]
label = (best == token[:, None]).astype(np.float32)                     # [N, L]: layer l+1

# Where tokens settle: the first layer from which every later layer's best candidate is the token.
settled = np.full(N, -1)
for n in range(N):
    if label[n, -1] == 0:
        continue
    l = L - 1
    while l > 0 and label[n, l - 1] == 1:
        l -= 1
    settled[n] = l + 1  # a layer number 1..L
counts = np.bincount(settled[settled > 0], minlength=L + 1)
in_candidates = float((cands == token[:, None]).any(axis=1).mean())
print(f"{N} tokens; the full model's token is among the 4 candidates for {100 * in_candidates:.1f}%, "
      f"the best candidate at the last layer for {100 * label[:, -1].mean():.1f}%")
print("tokens settled by layer:", {int(l): int(c) for l, c in enumerate(counts) if c})
ranked = [int(l) for l in np.argsort(-counts[1:L]) + 1 if counts[l] > 0 and l >= a.min_layer][: a.layers]
schedule = sorted(set(ranked) | {L})
print("schedule:", schedule)

def features(sched):
    out = np.zeros((N, len(sched), F), dtype=np.float32)
    prev = None
    for i, l in enumerate(sched):
        x = logits[:, l - 1, :]
        p = np.exp(x - x.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, i, :K], out[:, i, K:2 * K] = x, p
        out[:, i, 2 * K:] = 0.0 if prev is None else p - prev
        prev = p
    return out

rng = np.random.default_rng(a.seed)
prompts = np.unique(prompt)
valid_prompts = set(rng.choice(prompts, size=max(1, int(len(prompts) * a.valid_share)), replace=False).tolist())
valid = np.array([p in valid_prompts for p in prompt])
train = ~valid

def train_mlp(x, y):
    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-4
    xs = (x - mu) / sd
    H = a.hidden
    w1 = rng.normal(0, np.sqrt(2 / F), (H, F)).astype(np.float32)
    b1 = np.zeros(H, np.float32)
    w2 = rng.normal(0, np.sqrt(1 / H), H).astype(np.float32)
    b2 = np.float32(np.log((y.mean() + 1e-3) / (1 - y.mean() + 1e-3)))
    params = [w1, b1, w2, np.array([b2], np.float32)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, a.epochs + 1):
        h = xs @ params[0].T + params[1]
        r = np.maximum(h, 0)
        z = r @ params[2] + params[3][0]
        q = 1 / (1 + np.exp(-z))
        dz = (q - y) / len(y)
        g2, gb2 = r.T @ dz, np.array([dz.sum()], np.float32)
        dh = np.outer(dz, params[2]) * (h > 0)
        g1, gb1 = dh.T @ xs, dh.sum(axis=0)
        for i, g in enumerate([g1, gb1, g2, gb2]):
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            params[i] -= a.lr * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
    # Fold the standardisation into fc1: w1 (x - mu) / sd + b1 = (w1 / sd) x + (b1 - w1 mu / sd).
    w1f = (params[0] / sd).astype(np.float32)
    b1f = (params[1] - (params[0] * (mu / sd)).sum(axis=1)).astype(np.float32)
    return w1f, b1f, params[2].astype(np.float32), params[3].astype(np.float32)

def predict(mlp, x):
    w1, b1, w2, b2 = mlp
    return 1 / (1 + np.exp(-(np.maximum(x @ w1.T + b1, 0) @ w2 + b2[0])))

def simulate(P, Y, schedule, thr, rows):
    exit_at = np.full(rows.sum(), -1)
    p, y = P[rows], Y[rows]
    for i in range(len(schedule) - 1, -1, -1):
        exit_at = np.where(p[:, i] > thr, i, exit_at)
    exited = exit_at >= 0
    agree = y[np.arange(len(y)), np.maximum(exit_at, 0)][exited]
    layers = np.where(exited, np.array(schedule)[np.maximum(exit_at, 0)], L)
    return exited.mean(), (agree.mean() if exited.any() else 1.0), layers.mean(), exit_at

grid = [round(0.5 + 0.005 * i, 3) for i in range(100)]

def fit(schedule):
    X = features(schedule)
    Y = np.stack([label[:, l - 1] for l in schedule], axis=1)  # [N, S]
    mlps = [train_mlp(X[train, i], Y[train, i]) for i in range(len(schedule))]
    P = np.stack([predict(mlps[i], X[:, i]) for i in range(len(schedule))], axis=1)  # [N, S]
    threshold = grid[-1]
    for thr in grid:
        if simulate(P, Y, schedule, thr, valid)[1] >= a.target_agreement:
            threshold = thr
            break
    return mlps, P, Y, threshold

# A scheduled layer where no token exits costs a segment boundary and a probe for nothing: drop
# it and refit (the features' change term depends on the schedule).
while True:
    mlps, P, Y, threshold = fit(schedule)
    _, _, _, exit_all = simulate(P, Y, schedule, threshold, np.ones(N, bool))
    idle = [l for i, l in enumerate(schedule) if l != L and not (exit_all == i).any()]
    if not idle:
        break
    schedule = [l for l in schedule if l not in idle]
    print("dropped idle layers", idle, "-> schedule", schedule)

rate, agreement, mean_layer, exit_at = simulate(P, Y, schedule, threshold, valid)
profile = {int(schedule[i]): int((exit_at == i).sum()) for i in range(len(schedule))}
print(f"threshold {threshold}: held-out prompts ({valid.sum()} tokens): exit rate {100 * rate:.1f}%, "
      f"agreement {100 * agreement:.1f}%, mean exit layer {mean_layer:.1f} of {L}; exits by layer {profile}")
for i, l in enumerate(schedule):
    pv, yv = P[valid, i] > threshold, Y[valid, i]
    prec = yv[pv].mean() if pv.any() else float("nan")
    rec = pv[yv == 1].mean() if (yv == 1).any() else float("nan")
    print(f"  layer {l:2d}: best candidate right {100 * yv.mean():5.1f}%, predictor precision {100 * prec:5.1f}% recall {100 * rec:5.1f}%")

# The online level's layers: the change term from each plausible previous probe.
online = [l for l in range(max(a.online_from, 1), L + 1) if a.online_from > 0 and l not in schedule]
trained = dict(zip(schedule, mlps))

def softmax_at(l):
    x = logits[:, l - 1, :]
    p = np.exp(x - x.max(axis=1, keepdims=True))
    return x, p / p.sum(axis=1, keepdims=True)

def train_any_previous(l):
    x, p = softmax_at(l)
    views = [np.concatenate([x, p, p - softmax_at(l - below)[1] if below else np.zeros_like(p)], axis=1)[train]
             for below in range(5) if l - below >= 1]
    return train_mlp(np.concatenate(views), np.tile(label[train, l - 1], len(views)))

for l in online:
    trained[l] = train_any_previous(l)
    x, p = softmax_at(l)
    fire = predict(trained[l], np.concatenate([x, p, np.zeros_like(p)], axis=1)[valid]) > threshold
    prec = label[valid, l - 1][fire].mean() if fire.any() else float("nan")
    print(f"  online layer {l:2d}: best candidate right {100 * label[valid, l - 1].mean():5.1f}%, "
          f"first-probe exits at the threshold {100 * fire.mean():5.1f}% precision {100 * prec:5.1f}%")
layers = sorted(trained)

w = gguf.GGUFWriter(a.out, "specula-specee")
w.add_uint32("specula-specee.target_block_count", n_layer)
w.add_uint32("specula-specee.target_embedding_length", n_embd)
w.add_uint32("specula-specee.candidates", K)
w.add_uint32("specula-specee.features", F)
w.add_uint32("specula-specee.hidden", a.hidden)
w.add_float32("specula-specee.threshold", threshold)
w.add_array("specula-specee.layers", [int(l) for l in layers])
if online:
    w.add_array("specula-specee.offline_layers", [int(l) for l in schedule])
for l in layers:
    w1, b1, w2, b2 = trained[l]
    w.add_tensor(f"exit.{l}.fc1.weight", w1)
    w.add_tensor(f"exit.{l}.fc1.bias", b1)
    w.add_tensor(f"exit.{l}.fc2.weight", w2)
    w.add_tensor(f"exit.{l}.fc2.bias", b2)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", a.out)
if a.json:
    json.dump({"tokens": int(N), "in_candidates": in_candidates, "settled_by_layer": counts.tolist(), "schedule": schedule,
               "online_layers": online, "threshold": threshold, "valid_tokens": int(valid.sum()), "valid_exit_rate": float(rate),
               "valid_agreement": float(agreement), "valid_mean_exit_layer": float(mean_layer), "valid_exits_by_layer": profile},
              open(a.json, "w"), indent=1)
