"""Which of Lightning's test files the suite runs: every file of tests/tests_pytorch a CPU machine can run.

The default is the whole of ``tests/tests_pytorch`` less the files in ``EXCLUDED``, each with its reason, and
only for these reasons: the file's subject is an accelerator this machine lacks (CUDA, MPS, TPU/XLA), a library
Lightning's CPU CI does not install either (DeepSpeed, bitsandbytes, TensorRT), or it needs a network. The tests
of a kept file that need a GPU or a standalone launch skip by their own ``RunIf``, on both sides alike, and are
reported as skipped: a file is left out only when what it tests cannot be reached here at all (its tests that
do run on a CPU only mock the device or the library). A path here that the checkout lacks is ignored, so a newer
checkout with fewer files still runs; a new file of the checkout is run until a reason is written for it.

``NAMED_SETS`` holds the file lists earlier figures were quoted over (``--set issue26``).
"""

from __future__ import annotations

import glob
from pathlib import Path

CUDA = "needs a CUDA GPU (its CPU-runnable tests only mock the device probes)"
MPS = "needs Apple MPS"
XLA = "needs a TPU and torch_xla (its CPU-runnable tests only mock torch_xla)"
DEEPSPEED = "needs DeepSpeed (not installable next to a CPU torch; Lightning runs it on GPU machines only)"
BITSANDBYTES = "needs bitsandbytes (a CUDA library; its tests mock the module)"
TENSORRT = "needs torch_tensorrt and a CUDA GPU"
NETWORK = "downloads MNIST (needs a network)"

# path under tests/tests_pytorch -> why it cannot run on this machine
EXCLUDED: dict[str, str] = {
    "accelerators/test_gpu.py": CUDA,
    "accelerators/test_mps.py": MPS,
    "accelerators/test_xla.py": XLA,
    "models/test_gpu.py": CUDA,
    "models/test_ddp_fork_amp.py": CUDA + "; standalone only",
    "models/test_tpu.py": XLA,
    "models/test_torch_tensorrt.py": TENSORRT,
    "plugins/precision/test_bitsandbytes.py": BITSANDBYTES,
    "plugins/precision/test_deepspeed_precision.py": DEEPSPEED,
    "plugins/precision/test_xla.py": XLA,
    "profilers/test_xla_profiler.py": XLA,
    "strategies/test_deepspeed.py": DEEPSPEED,
    "strategies/test_xla.py": XLA,
    "utilities/test_deepspeed_collate_checkpoint.py": DEEPSPEED,
    "utilities/test_deepspeed_model_summary.py": DEEPSPEED,
    "helpers/test_datasets.py": NETWORK,
}

NAMED_SETS: dict[str, list[str]] = {
    # issue 26's 45 files: the figures of December 3 (99.4%) were quoted over these
    "issue26": [
        "models/test_hooks.py",
        "trainer/logging_/test_train_loop_logging.py",
        "trainer/logging_/test_eval_loop_logging.py",
        "trainer/flags/*.py",
        "trainer/test_dataloaders.py",
        "trainer/test_trainer.py",
        "trainer/optimization/*.py",
        "callbacks/test_early_stopping.py",
        "callbacks/test_lr_monitor.py",
        "callbacks/test_model_checkpoint*.py",
        "checkpointing/*.py",
        "core/test_datamodules.py",
        "core/test_lightning_module.py",
        "loops/*.py",
    ],
}


def expand_files(tests_pytorch: Path, patterns: list[str]) -> list[str]:
    """Globs under tests_pytorch -> test files (test_*.py), each once, in the order given, sorted per glob."""
    files: list[str] = []
    for pattern in patterns:
        pattern = pattern.removeprefix("tests/tests_pytorch/").removeprefix("tests_pytorch/")
        matches = sorted(glob.glob(str(tests_pytorch / pattern), recursive=True))
        if not matches:
            raise SystemExit(f"--files {pattern!r} matches nothing under {tests_pytorch}")
        for match in matches:
            rel = str(Path(match).relative_to(tests_pytorch))
            if Path(rel).name.startswith("test_") and rel.endswith(".py") and rel not in files:
                files.append(rel)
    return files


def whole_suite(tests_pytorch: Path) -> list[str]:
    """Every test file under tests_pytorch, sorted, less ``EXCLUDED``."""
    return [rel for rel in expand_files(tests_pytorch, ["**/test_*.py"]) if rel not in EXCLUDED]


def excluded_present(tests_pytorch: Path) -> dict[str, str]:
    """The exclusions that apply to this checkout (path -> reason)."""
    return {rel: why for rel, why in EXCLUDED.items() if (tests_pytorch / rel).is_file()}


def render_exclusions(tests_pytorch: Path | None = None) -> str:
    """The markdown list of the files the default run leaves out, grouped by reason."""
    present = excluded_present(tests_pytorch) if tests_pytorch else dict(EXCLUDED)
    by_reason: dict[str, list[str]] = {}
    for rel, why in present.items():
        by_reason.setdefault(why, []).append(rel)
    lines = [f"Left out of the default run ({len(present)} files, `scripts/lightning_compat/suite_files.py`):\n"]
    for why, rels in by_reason.items():
        lines.append(f"- {why}: " + ", ".join(f"`{r}`" for r in sorted(rels)))
    return "\n".join(lines) + "\n\n"
