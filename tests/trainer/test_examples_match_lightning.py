"""Our example modules give Lightning's results: same source, imports switched, same numbers.

Each example in ``tests/trainer/examples/`` runs fit, then test and predict from the best
checkpoint, once under ``gpulayer.trainer`` and once under ``lightning.pytorch`` 2.6.6. On one
device the final weights are bit-identical and test metrics and predictions equal; on two
devices (``strategy="ddp"``) they agree within float tolerance (the gradient all-reduce sums
in a different order).
"""

from __future__ import annotations

import importlib
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
from tests.trainer.twin import needs_lightning

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


def run(example: types.ModuleType, root: Path, **trainer_kwargs):
    """fit, then test and predict from the best checkpoint: the weights after each half, metrics, predictions."""
    model, trainer, data = example.fit(offline_corpus(root), **trainer_kwargs)
    fitted = {k: v.clone() for k, v in model.state_dict().items()}
    tested, predicted = example.evaluate(model, trainer, data)
    return types.SimpleNamespace(model=model, trainer=trainer, fitted=fitted, tested=tested, predicted=predicted)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_fits_tests_and_predicts_from_the_best_checkpoint(example, tmp_path):
    r = run(ours(example), tmp_path, devices=1, **QUIET)
    best = r.trainer.checkpoint_callback.best_model_path
    assert best and os.path.isfile(best) and r.trainer.current_epoch >= 1
    assert len(r.tested) == 1 and all(isinstance(v, float) for v in r.tested[0].values())
    assert any(k.startswith("test_") for k in r.tested[0])
    assert isinstance(r.predicted, list) and all(isinstance(p, torch.Tensor) for p in r.predicted)
    saved = torch.load(best, weights_only=False)["state_dict"]
    for k, v in r.model.state_dict().items():  # testing from "best" loaded the best weights into the model
        assert torch.equal(v, saved[k]), k


@needs_lightning
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_gives_lightnings_weights_metrics_and_predictions(example, tmp_path):
    import lightning.pytorch as pl

    mine = run(ours(example), tmp_path / "gpulayer", devices=1, **QUIET)
    theirs = run(as_lightning(example), tmp_path / "lightning", devices=1, **QUIET)
    assert isinstance(theirs.trainer, pl.Trainer) and isinstance(mine.trainer, gl.Trainer)
    for a, b in ((mine.fitted, theirs.fitted), (mine.model.state_dict(), theirs.model.state_dict())):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{k} differs: max |diff| {(a[k].float() - b[k].float()).abs().max():.3g}"
    assert (mine.trainer.global_step, mine.trainer.current_epoch) == (theirs.trainer.global_step,
                                                                      theirs.trainer.current_epoch)
    assert os.path.basename(mine.trainer.checkpoint_callback.best_model_path) == \
        os.path.basename(theirs.trainer.checkpoint_callback.best_model_path)
    assert mine.tested == theirs.tested  # the test metrics, exactly
    assert len(mine.predicted) == len(theirs.predicted)
    for a, b in zip(mine.predicted, theirs.predicted):
        assert torch.equal(a, b)


LIGHTNING_DDP = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from tests.trainer.test_examples_match_lightning import as_lightning, run
from pathlib import Path
r = run(as_lightning(sys.argv[4]), Path(sys.argv[2]), accelerator="cpu", devices=2, strategy="ddp", logger=False,
        enable_progress_bar=False, enable_model_summary=False)
if r.trainer.is_global_zero:
    torch.save({"fitted": r.fitted, "tested": r.tested, "step": r.trainer.global_step,
                "best": r.trainer.checkpoint_callback.best_model_path}, sys.argv[1])
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
    mine = run(ours(example), tmp_path / "gpulayer", devices=2, strategy="ddp", **QUIET)
    assert mine.trainer.global_step == theirs["step"]
    assert os.path.basename(mine.trainer.checkpoint_callback.best_model_path) == os.path.basename(theirs["best"])
    for k, v in mine.fitted.items():
        torch.testing.assert_close(v, theirs["fitted"][k])
    assert mine.tested[0].keys() == theirs["tested"][0].keys()
    for k in mine.tested[0]:
        assert mine.tested[0][k] == pytest.approx(theirs["tested"][0][k], rel=1e-5)
