"""The hook system: every hook of module, callback and datamodule, in the order lightning 2.6 calls them.

The order tests run one recording module (``hook_recorder.py``) under gpulayer and under
the installed lightning and compare the two lists of calls.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch

import gpulayer.trainer as gl
from gpulayer.trainer.utilities.model_helpers import is_overridden
from tests.trainer import hook_recorder

needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None and not os.environ.get("CI"),
    reason="lightning is not installed (the test extras install it; required under CI)")

TRAINER_KW = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=2, limit_test_batches=2,
                  limit_predict_batches=2, enable_progress_bar=False, enable_model_summary=False, logger=False,
                  enable_checkpointing=False, accelerator="cpu", devices=1)


def _calls(pkg, stage: str, automatic: bool = True, with_datamodule: bool = False, dm_transfer: bool = False,
           **kw) -> list:
    calls: list = []
    model, callback, dm = hook_recorder.build(pkg, calls, automatic=automatic, datamodule_transfer=dm_transfer)
    trainer = pkg.Trainer(callbacks=[callback], **{**TRAINER_KW, **kw})
    data = {"datamodule": dm} if with_datamodule else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stage == "fit":
            trainer.fit(model, **data)
        elif stage == "predict":
            trainer.predict(model, **data)
        else:
            getattr(trainer, stage)(model, verbose=False, **data)
    return calls


def _both(stage: str, **kw) -> tuple[list, list]:
    import lightning.pytorch as lp
    return _calls(gl, stage, **kw), _calls(lp, stage, **kw)


def _first_difference(ours: list, theirs: list) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"call {i}: gpulayer {a} vs lightning {b}; before: {theirs[max(0, i - 4):i]}"
    return f"lengths {len(ours)} vs {len(theirs)}; tail gpulayer {ours[-3:]} lightning {theirs[-3:]}"


@needs_lightning
@pytest.mark.parametrize("automatic", [True, False])
def test_fit_calls_every_hook_in_lightnings_order(automatic):
    ours, theirs = _both("fit", automatic=automatic)
    assert ours == theirs, _first_difference(ours, theirs)


@needs_lightning
def test_fit_with_accumulation_calls_zero_grad_and_step_where_lightning_does():
    ours, theirs = _both("fit", accumulate_grad_batches=2, limit_train_batches=4, limit_val_batches=1,
                         num_sanity_val_steps=0)
    assert ours == theirs, _first_difference(ours, theirs)


@needs_lightning
@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluation_stages_call_hooks_in_lightnings_order(stage):
    ours, theirs = _both(stage)
    assert ours == theirs, _first_difference(ours, theirs)


@needs_lightning
@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_datamodule_hooks_in_lightnings_order(stage):
    ours, theirs = _both(stage, with_datamodule=True, dm_transfer=True)
    assert ours == theirs, _first_difference(ours, theirs)


# -- is_overridden --------------------------------------------------------------------------------
def test_is_overridden_sees_class_and_instance_definitions():
    class Plain(gl.LightningModule):
        pass

    class Custom(gl.LightningModule):
        def on_train_epoch_end(self):
            pass

    plain = Plain()
    assert not is_overridden("on_train_epoch_end", plain)
    assert is_overridden("on_train_epoch_end", Custom())
    plain.on_train_epoch_end = lambda: None
    assert is_overridden("on_train_epoch_end", plain)
    custom = Custom()
    custom.on_train_epoch_end = None  # Lightning's way to switch a hook off
    assert not is_overridden("on_train_epoch_end", custom)
    assert not is_overridden("anything", None)
    with pytest.raises(ValueError, match="Expected a parent"):
        is_overridden("on_train_epoch_end", object())


def test_is_overridden_looks_through_wrappers():
    import functools
    from unittest import mock

    class Plain(gl.LightningModule):
        pass

    model = Plain()
    wrapped = functools.wraps(model.on_fit_start)(lambda: None)
    model.on_fit_start = wrapped  # a wrapper of the default is still the default
    assert not is_overridden("on_fit_start", model)
    model.on_fit_end = mock.Mock(wraps=lambda: None)
    assert is_overridden("on_fit_end", model)
    cb = gl.Callback()
    cb.on_fit_start = functools.partial(lambda trainer, module: None)
    assert is_overridden("on_fit_start", cb)
    assert not is_overridden("on_fit_end", cb)


def test_instance_defined_hooks_are_called():
    seen = []

    class Net(gl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Net()
    model.on_train_epoch_end = lambda: seen.append("epoch_end")
    model.on_before_zero_grad = lambda opt: seen.append("zero_grad")
    loader = torch.utils.data.DataLoader(hook_recorder.Points(4), batch_size=2)
    gl.Trainer(max_epochs=1, **{k: v for k, v in TRAINER_KW.items() if k != "max_epochs"}).fit(model, loader)
    assert seen == ["zero_grad", "zero_grad", "epoch_end"]
