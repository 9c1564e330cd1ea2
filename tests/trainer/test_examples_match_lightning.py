"""Our example modules give Lightning's results: same source, imports switched, same numbers.

Each example in ``tests/trainer/examples/`` runs fit, then test and predict from the best
checkpoint, once under ``gpulayer.trainer`` and once under ``lightning.pytorch`` 2.6.6. On one
device the final weights are bit-identical and test metrics and predictions equal; on two
devices (``strategy="ddp"``) they agree within float tolerance (the gradient all-reduce sums
in a different order).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import gpulayer.trainer as gl
from gpulayer.trainer.demos.transformer import WikiText2

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
                                     reason="lightning is not installed (the test extras install it; required under CI)")
QUIET = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
EXAMPLES = ["autoencoder", "image_classifier", "language_model"]
REPO = Path(__file__).resolve().parents[2]


def as_lightning(name: str) -> types.ModuleType:
    """The example with ``gpulayer.trainer`` replaced by ``lightning.pytorch`` in its source."""
    ours = importlib.import_module(f"tests.trainer.examples.{name}")
    source = inspect.getsource(ours).replace("gpulayer.trainer", "lightning.pytorch")
    module = types.ModuleType(f"{name}_on_lightning")
    exec(compile(source, f"{ours.__file__} (lightning imports)", "exec"), module.__dict__)
    return module


def ours(name: str) -> types.ModuleType:
    return importlib.import_module(f"tests.trainer.examples.{name}")


def offline_corpus(root: Path) -> Path:
    """The language model's text, written before either run so Lightning's WikiText2 never downloads."""
    WikiText2.download(root / "data" / "wikitext-2.txt")
    return root


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs: max |diff| {(sa[k].float() - sb[k].float()).abs().max():.3g}"


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_fits_tests_and_predicts_from_the_best_checkpoint(example, tmp_path):
    model, trainer, tested, predicted = ours(example).main(offline_corpus(tmp_path), devices=1, **QUIET)
    best = trainer.checkpoint_callback.best_model_path
    assert best and os.path.isfile(best) and trainer.current_epoch >= 1
    assert len(tested) == 1 and all(isinstance(v, float) for v in tested[0].values())
    assert any(k.startswith("test_") for k in tested[0])
    assert isinstance(predicted, list) and all(isinstance(p, torch.Tensor) for p in predicted)


@needs_lightning
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_gives_lightnings_weights_metrics_and_predictions(example, tmp_path):
    import lightning.pytorch as pl

    mine = ours(example).main(offline_corpus(tmp_path / "gpulayer"), devices=1, **QUIET)
    theirs = as_lightning(example).main(offline_corpus(tmp_path / "lightning"), devices=1, **QUIET)
    assert isinstance(theirs[1], pl.Trainer) and isinstance(mine[1], gl.Trainer)
    assert_same_weights(mine[0], theirs[0])
    assert mine[1].global_step == theirs[1].global_step and mine[1].current_epoch == theirs[1].current_epoch
    assert os.path.basename(mine[1].checkpoint_callback.best_model_path) == \
        os.path.basename(theirs[1].checkpoint_callback.best_model_path)
    assert mine[2] == theirs[2]  # the test metrics, exactly
    assert len(mine[3]) == len(theirs[3])
    for a, b in zip(mine[3], theirs[3]):
        assert torch.equal(a, b)


LIGHTNING_DDP = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from tests.trainer.test_examples_match_lightning import as_lightning, offline_corpus
from pathlib import Path
example = as_lightning(sys.argv[4])
model, trainer, tested, _ = example.main(offline_corpus(Path(sys.argv[2])), accelerator="cpu", devices=2,
                                         strategy="ddp", logger=False, enable_progress_bar=False,
                                         enable_model_summary=False)
if trainer.is_global_zero:
    torch.save({"weights": model.state_dict(), "tested": tested, "step": trainer.global_step,
                "best": trainer.checkpoint_callback.best_model_path}, sys.argv[1])
"""


@needs_lightning
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_on_two_devices_matches_lightnings_ddp(example, tmp_path):
    # Lightning's strategy="ddp" starts its other rank by running the script again, so it runs as a script.
    script, out = tmp_path / "lightning_ddp.py", tmp_path / "lightning.pt"
    script.write_text(LIGHTNING_DDP)
    proc = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "lightning"), str(REPO), example],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    theirs = torch.load(out, weights_only=False)
    model, trainer, tested, _ = ours(example).main(offline_corpus(tmp_path / "gpulayer"), devices=2, strategy="ddp",
                                                   **QUIET)
    assert trainer.global_step == theirs["step"]
    assert os.path.basename(trainer.checkpoint_callback.best_model_path) == os.path.basename(theirs["best"])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, theirs["weights"][k])
    assert tested[0].keys() == theirs["tested"][0].keys()
    for k in tested[0]:
        assert tested[0][k] == pytest.approx(theirs["tested"][0][k], rel=1e-5)
