"""What the trainers share: their learning-rate schedules (a linear warm-up over the first `warmup`
steps, then a cosine from lr down to a floor) and the optimizer step. The wall-clock-budgeted
trainers (--feats) run the cosine across their time budget (frac = elapsed fraction of it), so a
run's schedule spans whatever the machine manages in the budget, unless given a number of steps;
the bundled family's (--work) across a fixed number of steps."""
import math

import torch


def wallclock_cosine_lr(lr, warmup, frac, step):
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def budget_cosine_lr(lr, warmup, step, steps=None, frac=0.0):
    """A --feats run's rate: the cosine across its `steps` when given (the same schedule on any
    machine), else across its wall-clock budget (`frac` of it elapsed)."""
    if steps is not None:
        return step_cosine_lr(lr, warmup, steps, step)
    return wallclock_cosine_lr(lr, warmup, frac, step)


def step_cosine_lr(lr, warmup, steps, step, floor=0.1):
    if step < warmup:
        return lr * (step + 1) / warmup
    pr = (step - warmup) / max(1, steps - warmup)
    return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * pr)))


def optimizer_step(opt, model, loss):
    """Backward, gradients clipped to norm 1, one step; returns the gradient norm before clipping."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return gn
