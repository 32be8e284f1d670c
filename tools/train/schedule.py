"""Learning-rate schedule shared by the wall-clock-budgeted trainers: linear warm-up over the
first `warmup` steps, then a cosine from lr down to 0.1 lr across the time budget (frac = elapsed
fraction of it), so a run's schedule spans whatever the machine manages in the budget."""
import math


def wallclock_cosine_lr(lr, warmup, frac, step):
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
