"""Lightning's example modules run on gpulayer with only their imports changed, to the same weights.

Each example runs fit, then test and predict (from the best checkpoint, as the
examples do), once with ``gpulayer.trainer`` and once with the same source
under ``lightning.pytorch`` (2.6.6, installed with the test extras). On one
device the final weights must be bit-identical; test metrics and predictions
equal. The ported sources live in ``tests/trainer/lightning_examples/``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import types

import pytest
import torch
from torch.utils.data import DataLoader

needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
                                     reason="lightning is not installed (the test extras install it; required under CI)")
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)


def _as_lightning(module_name: str) -> types.ModuleType:
    """The ported example with its imports changed back to Lightning's."""
    ported = importlib.import_module(module_name)
    source = inspect.getsource(ported)
    source = source.replace("from gpulayer.trainer", "from lightning.pytorch").replace(
        "import gpulayer.trainer as L", "import lightning as L")
    mod = types.ModuleType(module_name + "_on_lightning")
    exec(compile(source, ported.__file__ + " (lightning imports)", "exec"), mod.__dict__)
    return mod


def _fit_test_predict(example: types.ModuleType, pkg, tmp_path, **kw):
    pkg.seed_everything(example.SEED)
    model, dm = example.MODEL(), example.DATAMODULE()
    trainer = pkg.Trainer(max_epochs=2, default_root_dir=tmp_path, **QUIET, **kw)
    trainer.fit(model, datamodule=dm)
    tested = trainer.test(ckpt_path="best", datamodule=dm, verbose=False)
    predicted = trainer.predict(ckpt_path="best", datamodule=dm)
    return model, trainer, tested, predicted


def _assert_identical(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs: max |diff| {(a[k] - b[k]).abs().max():.3g}"


@pytest.mark.parametrize("example", ["backbone_image_classifier", "autoencoder"])
def test_example_runs_with_changed_imports(example, tmp_path):
    ported = importlib.import_module(f"tests.trainer.lightning_examples.{example}")
    import gpulayer.trainer as gl
    model, trainer, tested, predicted = _fit_test_predict(ported, gl, tmp_path)
    assert trainer.current_epoch == 2 and trainer.checkpoint_callback.best_model_path
    assert len(tested) == 1 and {"test_loss", "test_loss_epoch"} & set(tested[0])
    assert len(predicted) == 4 and predicted[0].shape[0] == 32  # 100 test images in batches of 32


@needs_lightning
@pytest.mark.parametrize("example", ["backbone_image_classifier", "autoencoder"])
def test_example_gives_lightnings_weights(example, tmp_path):
    import lightning.pytorch as pl

    import gpulayer.trainer as gl
    name = f"tests.trainer.lightning_examples.{example}"
    ours = _fit_test_predict(importlib.import_module(name), gl, tmp_path / "gpulayer")
    theirs = _fit_test_predict(_as_lightning(name), pl, tmp_path / "lightning")
    _assert_identical(ours[0], theirs[0])
    assert ours[1].global_step == theirs[1].global_step
    assert os.path.basename(ours[1].checkpoint_callback.best_model_path) == \
        os.path.basename(theirs[1].checkpoint_callback.best_model_path)
    assert ours[2][0].keys() == theirs[2][0].keys()
    for k in ours[2][0]:
        assert ours[2][0][k] == pytest.approx(theirs[2][0][k], rel=1e-6)
    for a, b in zip(ours[3], theirs[3], strict=True):
        assert torch.equal(a, b)


@needs_lightning
def test_boring_model_and_datamodule_give_lightnings_weights(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringDataModule as TheirData, BoringModel as TheirModel

    import gpulayer.trainer as gl
    from gpulayer.trainer.demos.boring_classes import BoringDataModule, BoringModel
    runs = []
    for pkg, model_cls, data_cls, root in ((gl, BoringModel, BoringDataModule, "gpulayer"),
                                           (pl, TheirModel, TheirData, "lightning")):
        pkg.seed_everything(7)
        model, dm = model_cls(), data_cls()
        trainer = pkg.Trainer(max_epochs=2, limit_train_batches=20, limit_val_batches=5, default_root_dir=tmp_path / root,
                              **QUIET)
        trainer.fit(model, datamodule=dm)
        tested = trainer.test(model, datamodule=dm, verbose=False)
        predicted = trainer.predict(model, datamodule=dm)
        runs.append((model, tested, predicted))
    (ours, our_test, our_pred), (theirs, their_test, their_pred) = runs
    _assert_identical(ours, theirs)
    assert our_test == their_test == [{}]  # BoringModel's test_step logs nothing
    assert len(our_pred) == len(their_pred) == 64
    assert all(torch.equal(a, b) for a, b in zip(our_pred, their_pred))


@needs_lightning
def test_basics_transformer_example_gives_lightnings_weights(tmp_path):
    import lightning as L

    import gpulayer.trainer as gl
    name = "tests.trainer.lightning_examples.basics_transformer"
    kw = dict(max_epochs=1, enable_checkpointing=False, **QUIET)
    ours = importlib.import_module(name).main(default_root_dir=tmp_path / "gpulayer", **kw)
    theirs = _as_lightning(name).main(default_root_dir=tmp_path / "lightning", **kw)
    _assert_identical(ours[0], theirs[0])
    assert ours[2][0]["test_loss"] == pytest.approx(theirs[2][0]["test_loss"], rel=1e-6)
    assert isinstance(ours[1], gl.Trainer) and isinstance(theirs[1], L.Trainer)


@needs_lightning
def test_demo_transformer_gives_lightnings_weights(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.transformer import LightningTransformer as Theirs

    import gpulayer.trainer as gl
    from gpulayer.trainer.demos.transformer import LightningTransformer as Ours
    from tests.trainer.lightning_examples.basics_transformer import SyntheticText
    models = []
    for pkg, cls in ((gl, Ours), (pl, Theirs)):
        offline = type("Offline" + cls.__name__, (cls,), {"prepare_data": lambda self: None})  # no WikiText2 download
        pkg.seed_everything(3)
        model = offline(vocab_size=50)
        pkg.Trainer(max_steps=6, enable_checkpointing=False, default_root_dir=tmp_path, **QUIET).fit(
            model, DataLoader(SyntheticText(), batch_size=4))
        models.append(model)
    _assert_identical(*models)


LIGHTNING_DDP_SCRIPT = """
import sys, torch
import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
pl.seed_everything(11)
model = BoringModel()
trainer = pl.Trainer(max_epochs=2, limit_train_batches=8, limit_val_batches=2, strategy="ddp", devices=2, accelerator="cpu",
                     logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                     default_root_dir=sys.argv[2])
trainer.fit(model)
if trainer.is_global_zero:
    torch.save(model.state_dict(), sys.argv[1])
"""


@needs_lightning
def test_boring_model_on_two_devices_matches_lightnings_ddp(tmp_path):
    """devices=2: the same DistributedSampler shards, per-rank seeds and averaged gradients as Lightning's DDP.

    Lightning's ``strategy="ddp"`` re-runs the script for its other ranks, so it runs as a script here.
    """
    import subprocess
    import sys

    import gpulayer.trainer as gl
    from gpulayer.trainer.demos.boring_classes import BoringModel
    script = tmp_path / "lightning_ddp.py"
    script.write_text(LIGHTNING_DDP_SCRIPT)
    out = tmp_path / "lightning_weights.pt"
    proc = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "pl")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    gl.seed_everything(11)
    model = BoringModel()
    gl.Trainer(max_epochs=2, limit_train_batches=8, limit_val_batches=2, strategy="ddp", enable_checkpointing=False,
               default_root_dir=tmp_path / "gl", **dict(QUIET, devices=2)).fit(model)
    theirs = torch.load(out, weights_only=True)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, theirs[k])


LIGHTNING_DDP_EXAMPLE = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from tests.trainer.test_lightning_examples import _as_lightning
import lightning.pytorch as pl
example = _as_lightning(sys.argv[4])
pl.seed_everything(example.SEED)
model, dm = example.MODEL(), example.DATAMODULE()
trainer = pl.Trainer(max_epochs=2, strategy="ddp", devices=2, accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[2])
trainer.fit(model, datamodule=dm)
tested = trainer.test(ckpt_path="best", datamodule=dm, verbose=False)
if trainer.is_global_zero:
    torch.save({"weights": model.state_dict(), "tested": tested, "step": trainer.global_step,
                "best": trainer.checkpoint_callback.best_model_path}, sys.argv[1])
"""


@needs_lightning
@pytest.mark.parametrize("example", ["backbone_image_classifier", "autoencoder"])
def test_example_on_two_devices_matches_lightnings_ddp(example, tmp_path):
    """devices=2, fit then test from the best checkpoint: the weights, steps and test metrics of Lightning's DDP.

    Equal within float tolerance, not bit for bit: the gradient all-reduce sums in a different order.
    """
    import subprocess
    import sys

    import gpulayer.trainer as gl
    name = f"tests.trainer.lightning_examples.{example}"
    script = tmp_path / "lightning_ddp_example.py"
    script.write_text(LIGHTNING_DDP_EXAMPLE)
    out = tmp_path / "lightning.pt"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "pl"), repo, name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    theirs = torch.load(out, weights_only=False)
    ported = importlib.import_module(name)
    gl.seed_everything(ported.SEED)
    model, dm = ported.MODEL(), ported.DATAMODULE()
    trainer = gl.Trainer(max_epochs=2, default_root_dir=tmp_path / "gl", **dict(QUIET, devices=2))
    trainer.fit(model, datamodule=dm)
    tested = trainer.test(ckpt_path="best", datamodule=dm, verbose=False)
    assert trainer.global_step == theirs["step"]
    assert os.path.basename(trainer.checkpoint_callback.best_model_path) == os.path.basename(theirs["best"])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, theirs["weights"][k])
    assert tested[0].keys() == theirs["tested"][0].keys()
    for k in tested[0]:
        assert tested[0][k] == pytest.approx(theirs["tested"][0][k], rel=1e-5)


LIGHTNING_DDP_TRANSFORMER = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from tests.trainer.test_lightning_examples import _as_lightning
example = _as_lightning("tests.trainer.lightning_examples.basics_transformer")
model, trainer, tested = example.main(max_epochs=1, enable_checkpointing=False, accelerator="cpu", devices=2,
                                      strategy="ddp", logger=False, enable_progress_bar=False,
                                      enable_model_summary=False, default_root_dir=sys.argv[2])
if trainer.is_global_zero:
    torch.save({"weights": model.state_dict(), "tested": tested, "step": trainer.global_step}, sys.argv[1])
"""


@needs_lightning
def test_basics_transformer_on_two_devices_matches_lightnings_ddp(tmp_path):
    """Lightning's basics/transformer.py (fit, then test) on devices=2 against its own DDP, within float tolerance."""
    import subprocess
    import sys

    script = tmp_path / "lightning_ddp_transformer.py"
    script.write_text(LIGHTNING_DDP_TRANSFORMER)
    out = tmp_path / "lightning.pt"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "pl"), repo], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    theirs = torch.load(out, weights_only=False)
    ours = importlib.import_module("tests.trainer.lightning_examples.basics_transformer").main(
        max_epochs=1, enable_checkpointing=False, default_root_dir=tmp_path / "gl", **dict(QUIET, devices=2))
    assert ours[1].global_step == theirs["step"]
    for k, v in ours[0].state_dict().items():
        torch.testing.assert_close(v, theirs["weights"][k])
    assert ours[2][0]["test_loss"] == pytest.approx(theirs["tested"][0]["test_loss"], rel=1e-5)
