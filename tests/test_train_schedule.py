"""A --feats training run given --steps follows the cosine by step, whatever its wall clock says, so
a re-derivation on a machine of another speed trains the same schedule; without --steps the cosine
spans the wall-clock budget. Reads tools/train/schedule.py with a stand-in for torch (only its
optimizer step needs it). Usage: test_train_schedule.py [tools/train dir]."""
import math
import pathlib
import sys
import types

sys.path.insert(0, str(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "tools" / "train"))
sys.modules.setdefault("torch", types.ModuleType("torch"))
from schedule import budget_cosine_lr, step_cosine_lr, wallclock_cosine_lr  # noqa: E402

failures = []


def check(what, got, want):
    if not math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15):
        failures.append(f"{what}: got {got}, want {want}")


lr, warmup, steps = 1e-3, 20, 1000
for step in (0, 19, 20, 500, 999, 1000):
    for frac in (0.0, 0.3, 1.0):
        check(f"--steps {steps}, step {step}, {frac:.0%} of the clock", budget_cosine_lr(lr, warmup, step, steps=steps, frac=frac),
              step_cosine_lr(lr, warmup, steps, step))
        check(f"clock budget, step {step}, {frac:.0%} of it", budget_cosine_lr(lr, warmup, step, frac=frac),
              wallclock_cosine_lr(lr, warmup, frac, step))
check("--steps: the rate at the last step is the floor", budget_cosine_lr(lr, warmup, steps, steps=steps, frac=0.0), 0.1 * lr)
check("--steps: half way through the cosine", budget_cosine_lr(lr, warmup, warmup + (steps - warmup) // 2, steps=steps), 0.55 * lr)
check("warm-up: linear", budget_cosine_lr(lr, warmup, 9, steps=steps), lr * 10 / warmup)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("schedule: --steps runs the cosine by step, the clock budget by elapsed fraction")
