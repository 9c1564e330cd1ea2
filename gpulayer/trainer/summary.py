"""The short model summary Lightning prints when a fit starts (``enable_model_summary``)."""

from __future__ import annotations

from torch import nn


def _fmt(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def summary_lines(module: nn.Module) -> list[str]:
    """One row per direct child (name, type, parameters, mode), then the totals, as Lightning's ModelSummary."""
    rows = [(name, type(m).__name__, sum(p.numel() for p in m.parameters()), "train" if m.training else "eval")
            for name, m in module.named_children()]
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    total = sum(p.numel() for p in module.parameters())
    w_name = max([4] + [len(r[0]) for r in rows])
    w_type = max([4] + [len(r[1]) for r in rows])
    head = f"  | {'Name':<{w_name}} | {'Type':<{w_type}} | {'Params':>8} | Mode "
    lines = [head, "-" * len(head)]
    lines += [f"{i} | {n:<{w_name}} | {t:<{w_type}} | {_fmt(p):>8} | {mode}" for i, (n, t, p, mode) in enumerate(rows)]
    lines += ["-" * len(head), f"{_fmt(trainable):<9} Trainable params", f"{_fmt(total - trainable):<9} Non-trainable params",
              f"{_fmt(total):<9} Total params", f"{total * 4 / 1e6:<9.3f} Total estimated model params size (MB)"]
    return lines


def print_summary(module: nn.Module) -> None:
    print("\n".join(summary_lines(module)))
