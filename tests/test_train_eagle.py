"""tools/train/train_eagle.py's head arithmetic:
- the training-time test gives the same loss, agreement and gradients whether or not it skips the
  head indices before the first scored one (unrolled_loss's lo): the prompt positions are keyed at
  step 0 and computed no further. Both heads (EAGLE-3, EAGLE-1), a batch whose sequences start
  scoring at different positions, fp32;
- --init_grow_ffn's widened head computes what the narrower one did;
- a --vocab larger than the target's vocabulary is an error naming both sizes;
- --vocab_file's draft vocabulary is the file's ids, and ids beyond the target are refused;
- a new EAGLE-3 head's lm_head starts from the target's lm_head rows (tied or untied).
Needs torch (tools/train/requirements.txt): exits 77 (skipped) without it.
Usage: test_train_eagle.py [tools/train dir]."""
import pathlib
import sys
import types

sys.path.insert(0, str(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train"))
try:
    import torch
except ImportError:
    print("torch is not installed (pip install -r tools/train/requirements.txt): skipped")
    sys.exit(77)
import torch.nn.functional as F  # noqa: E402
from model import Eagle1Head, Eagle3Head, LlamaConfig  # noqa: E402
import train_eagle  # noqa: E402

failures = []
torch.manual_seed(0)
c = LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=40)
B, T = 3, 23
first_scored = [9, 14, 11]  # each sequence's first scored position: its prompt ends there
x = torch.randint(0, c.vocab_size, (B, T))
target = torch.randn(B, T, c.vocab_size).softmax(-1)
valid = torch.zeros(B, T, dtype=torch.bool)
for b, f in enumerate(first_scored):
    valid[b, f:T - b] = True  # the later sequences padded at the end
embed = torch.nn.Embedding(c.vocab_size, c.dim)
lm_head = torch.nn.Linear(c.dim, c.vocab_size, bias=False)

for kind, head, width in (("eagle3", Eagle3Head(c, [1, 3, 5]), 3 * c.dim), ("eagle1", Eagle1Head(c), c.dim)):
    feat = torch.randn(B, T, width)
    a = types.SimpleNamespace(kind=kind, ttt_steps=3, bf16=False)

    def score(k, lo, n, lq, out):
        p, m = target[:, 1 + k + lo:1 + k + n], valid[:, 1 + k + lo:1 + k + n]
        ce = -(p * lq).sum(-1)
        agree = (lq.argmax(-1) == p.argmax(-1)) & m
        return (ce * m).sum() / m.sum(), agree.sum().item() / m.sum().item()

    results = []
    lo = min(first_scored) - a.ttt_steps
    for skip in (0, lo):
        head.zero_grad()
        loss, accs = train_eagle.unrolled_loss(a, head, x, feat, embed, lm_head, score, False, skip)
        loss.backward()
        results.append((loss.item(), accs, {n: p.grad.clone() for n, p in head.named_parameters()}))
    (loss0, accs0, grads0), (loss1, accs1, grads1) = results
    if abs(loss0 - loss1) > 1e-5 * abs(loss0):
        failures.append(f"{kind}: loss {loss1} from index {lo} on, {loss0} over every index")
    if accs0 != accs1:
        failures.append(f"{kind}: agreement by step {accs1} from index {lo} on, {accs0} over every index")
    for n, g0 in grads0.items():
        if not torch.allclose(g0, grads1[n], rtol=1e-4, atol=1e-6):
            failures.append(f"{kind}: gradient of {n} differs by up to {(g0 - grads1[n]).abs().max().item():.3g}")
    # The control: one index too many skipped drops a scored position, and the loss changes.
    loss2, _ = train_eagle.unrolled_loss(a, head, x, feat, embed, lm_head, score, False, lo + 1)
    if abs(loss2.item() - loss0) <= 1e-5 * abs(loss0):
        failures.append(f"{kind}: skipping index {lo}, which step {a.ttt_steps - 1} scores, left the loss unchanged")

# A wider FFN grown from a head: the same outputs and logits at every training-time-test step.
c_wide = LlamaConfig(**{**c.__dict__, "ffn_dim": 160})
narrow, wide = Eagle3Head(c, [1, 3, 5]), Eagle3Head(c_wide, [1, 3, 5])
wide.load_state_dict(train_eagle.grown_ffn(narrow.state_dict(), wide, "narrow.gguf"))
feat = torch.randn(B, T, 3 * c.dim)
a = types.SimpleNamespace(kind="eagle3", ttt_steps=3, bf16=False)
per_step = []
for head in (narrow, wide):
    logps = []

    def keep(k, lo, n, lq, out):
        logps.append(lq)
        return lq.sum(), 0.0

    train_eagle.unrolled_loss(a, head, x, feat, embed, lm_head, keep, False)
    per_step.append(logps)
for k, (lq_narrow, lq_wide) in enumerate(zip(*per_step)):
    if not torch.allclose(lq_narrow, lq_wide, rtol=1e-5, atol=1e-5):
        failures.append(f"--init_grow_ffn: step {k}'s log-probabilities differ by up to {(lq_narrow - lq_wide).abs().max().item():.3g}")
if wide.mlp.w_gate.weight[c.ffn_dim:].abs().sum() == 0:
    failures.append("--init_grow_ffn: the new units' gate rows are zero (they could never learn)")

# A draft vocabulary larger than the target's is a clear error, not a shape error later.
try:
    train_eagle.draft_vocabulary(types.SimpleNamespace(vocab=c.vocab_size + 1, vocab_file=None, init_grow_vocab=False, init_new_vocab=False),
                                 torch.ones(c.vocab_size, dtype=torch.long), None, None)
    failures.append(f"--vocab {c.vocab_size + 1} over a {c.vocab_size}-token target was accepted")
except SystemExit as e:
    if "larger than the target's vocabulary" not in str(e.code):
        failures.append(f"--vocab too large: the error says {e.code!r}")
d2t = train_eagle.draft_vocabulary(types.SimpleNamespace(vocab=c.vocab_size, vocab_file=None, init_grow_vocab=False, init_new_vocab=False),
                                   torch.ones(c.vocab_size, dtype=torch.long), None, None)
if len(d2t) != c.vocab_size:
    failures.append(f"--vocab {c.vocab_size} (the whole target vocabulary) gave {len(d2t)} tokens")

# --vocab_file: the draft vocabulary a `specula draft-vocab` file lists (id runs "a-b").
import tempfile  # noqa: E402
with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
    f.write("specula-draft-vocab 1\ntokenizer 0123456789abcdef 40\n# a comment\nids 6\n0-2\n17\n30-31\n")
    f.flush()
    d2t = train_eagle.draft_vocabulary(types.SimpleNamespace(vocab=8, vocab_file=f.name, init_grow_vocab=False,
                                                             init_new_vocab=False), torch.ones(c.vocab_size, dtype=torch.long), None, None)
    if d2t.tolist() != [0, 1, 2, 17, 30, 31]:
        failures.append(f"--vocab_file: the draft vocabulary is {d2t.tolist()}, not the file's ids 0-2, 17, 30-31")
    try:
        train_eagle.draft_vocabulary(types.SimpleNamespace(vocab=8, vocab_file=f.name, init_grow_vocab=False, init_new_vocab=False),
                                     torch.ones(20, dtype=torch.long), None, None)
        failures.append("--vocab_file with ids beyond the target's vocabulary was accepted")
    except SystemExit as e:
        if "beyond the target's 20 tokens" not in str(e.code):
            failures.append(f"--vocab_file beyond the target: the error says {e.code!r}")

# A new EAGLE-3 head's lm_head starts from the target's lm_head rows of the draft vocabulary: the
# token embedding's when the target ties them (SmolLM2), its own output.weight when not (Qwen2.5-Coder-1.5B).
gguf_tensors = {"token_embd.weight": torch.randn(c.vocab_size, c.dim), "output_norm.weight": torch.rand(c.dim) + 0.5,
                "output.weight": torch.randn(c.vocab_size, c.dim)}
train_eagle.load_gguf_tensors = lambda path, names: {n: gguf_tensors[n] for n in names}
pick = torch.tensor([3, 7, 8, 30])
for tied, lm_head_rows in ((True, gguf_tensors["token_embd.weight"]), (False, gguf_tensors["output.weight"])):
    w = train_eagle.target_tensors("target.gguf", tied)
    if not torch.equal(w["output.weight"], lm_head_rows):
        failures.append(f"target_tensors(tied={tied}): output.weight is not the target's lm_head")
    head, _ = train_eagle.new_head(types.SimpleNamespace(kind="eagle3"), LlamaConfig(**{**c.__dict__, "vocab_size": len(pick)}),
                                   [1, 3, 5], w, pick)
    if not torch.equal(head.output.weight.detach(), lm_head_rows[pick]):
        failures.append(f"a new EAGLE-3 head of a {'tied' if tied else 'untied'} target: its lm_head does not start "
                        "from the target's lm_head rows of the draft vocabulary")

for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
