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


def _loader_requests_follow_the_optimizers(calls: list) -> None:
    names = [c[0] for c in calls]
    requests = [i for i, n in enumerate(names) if n.endswith("_dataloader")]
    assert requests and min(requests) > names.index("on_fit_start") > names.index("configure_optimizers")
    vals = [i for i in requests if names[i].endswith("val_dataloader")]
    trains = [i for i in requests if names[i].endswith("train_dataloader")]
    assert not vals or vals[0] < trains[0], "Lightning asks for the validation loaders first"


def _first_difference(ours: list, theirs: list) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"call {i}: gpulayer {a} vs lightning {b}; before: {theirs[max(0, i - 4):i]}"
    return f"lengths {len(ours)} vs {len(theirs)}; tail gpulayer {ours[-3:]} lightning {theirs[-3:]}"


@needs_lightning
@pytest.mark.parametrize("automatic", [True, False])
def test_fit_calls_every_hook_in_lightnings_order(automatic):
    ours, theirs = _both("fit", automatic=automatic)
    _loader_requests_follow_the_optimizers(ours)
    assert ours == theirs, _first_difference(ours, theirs)


@needs_lightning
def test_fit_without_sanity_check_requests_train_then_val_loaders_before_on_train_start():
    ours, theirs = _both("fit", num_sanity_val_steps=0)
    names = [c[0] for c in ours]
    assert names.index("train_dataloader") < names.index("val_dataloader") < names.index("Callback.on_train_start")
    assert ours == theirs, _first_difference(ours, theirs)


def _resume_calls(pkg, tmp_path, first: dict, then: dict) -> list:
    """The calls of a fit (``then``) resumed from the checkpoint an earlier fit's (``first``) ModelCheckpoint saved."""
    kw = {**TRAINER_KW, "limit_val_batches": 0}
    kw.pop("max_epochs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, callback, _ = hook_recorder.build(pkg, [])
        trainer = pkg.Trainer(callbacks=[callback], **{**kw, **first, "enable_checkpointing": True,
                                                        "default_root_dir": tmp_path / pkg.__name__})
        trainer.fit(model)
        path = trainer.checkpoint_callback.best_model_path
        calls: list = []
        model, callback, _ = hook_recorder.build(pkg, calls)
        for name in ("on_load_checkpoint", "load_state_dict"):
            _record(callback, name, "Callback.", calls)
        _record(model, "on_load_checkpoint", "", calls)
        pkg.Trainer(callbacks=[callback], **{**kw, **then}).fit(model, ckpt_path=path)
    return calls


def _record(obj, name: str, prefix: str, calls: list) -> None:
    fn = getattr(obj, name)

    def record(*args, **kwargs):
        calls.append((prefix + name, ()))
        return fn(*args, **kwargs)

    object.__setattr__(obj, name, record)


@needs_lightning
@pytest.mark.parametrize("first, then", [({"max_epochs": 1}, {"max_epochs": 2}), ({"max_steps": 1}, {"max_steps": 3})],
                         ids=["after_an_epoch", "mid_epoch"])
def test_resumed_fit_restores_module_and_callbacks_before_the_optimizers_and_skips_the_started_epochs_start(
        tmp_path, first, then):
    import lightning.pytorch as lp
    ours, theirs = _resume_calls(gl, tmp_path, first, then), _resume_calls(lp, tmp_path, first, then)
    names = [c[0] for c in ours]
    assert names.index("on_load_checkpoint") < names.index("Callback.on_load_checkpoint") \
        < names.index("configure_optimizers") < names.index("on_fit_start")
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
    if stage == "fit":
        _loader_requests_follow_the_optimizers(ours)
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


# -- overriding a default changes exactly what it changes in Lightning -------------------------------
def _regression_net(pkg, variant: str):
    """A small regression whose training is altered by one overridden hook (``variant``)."""

    class Net(pkg.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            self.automatic_optimization = variant != "lbfgs_manual"

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            if variant == "lbfgs_manual":
                opt = self.optimizers()

                def closure():
                    opt.zero_grad()
                    out = torch.nn.functional.mse_loss(self.net(x), y)
                    self.manual_backward(out)
                    return out
                opt.step(closure=closure)
            return loss

        def configure_optimizers(self):
            if variant == "lbfgs_manual":
                return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        if variant == "warmup":
            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                optimizer.step(closure=optimizer_closure)
                scale = min(1.0, (self.trainer.global_step + 1) / 5)  # LR warm-up over 5 steps
                for group in optimizer.param_groups:
                    group["lr"] = 0.05 * scale

        if variant == "augment":
            def on_before_batch_transfer(self, batch, dataloader_idx):
                x, y = batch
                return x * 0.5, y

            def on_after_batch_transfer(self, batch, dataloader_idx):
                x, y = batch  # "GPU-side" augmentation: a fixed flip of every other feature
                return x * torch.tensor([1.0, -1.0] * 4), y

        if variant == "clip":
            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                if self.trainer.global_step >= 2:  # clip by value, only after two steps
                    self.clip_gradients(optimizer, gradient_clip_val=0.05, gradient_clip_algorithm="value")

        if variant == "zero_grad_kept":
            def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
                if batch_idx % 2 == 0:  # keep gradients across two batches on purpose
                    optimizer.zero_grad()

        if variant == "backward_scaled":
            def backward(self, loss, *args, **kwargs):
                (loss * 3.0).backward(*args, **kwargs)

    return Net


def _regression_data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(48, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :1] * 2 - x[:, 1:2])


def _final_weights(pkg, variant: str, **kw) -> dict:
    pkg.seed_everything(3) if hasattr(pkg, "seed_everything") else torch.manual_seed(3)
    torch.manual_seed(3)
    model = _regression_net(pkg, variant)()
    loader = torch.utils.data.DataLoader(_regression_data(), batch_size=8, shuffle=False)
    trainer_kw = dict(max_epochs=2, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      enable_checkpointing=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pkg.Trainer(**{**trainer_kw, **kw}).fit(model, loader)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_weights(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-6, rtol=0, msg=f"{k} differs from lightning's")


@needs_lightning
@pytest.mark.parametrize("variant, kw", [
    ("warmup", {}),
    ("warmup", {"accumulate_grad_batches": 2}),
    ("augment", {}),
    ("clip", {}),
    ("none", {"gradient_clip_val": 0.05, "gradient_clip_algorithm": "value"}),
    ("zero_grad_kept", {}),
    ("backward_scaled", {}),
    ("lbfgs_manual", {}),
], ids=["optimizer_step_warmup", "warmup_with_accumulation", "batch_transfer_augmentation",
        "configure_gradient_clipping", "trainer_gradient_clip_val", "optimizer_zero_grad", "backward", "lbfgs_closure_in_manual_optimization"])
def test_overridden_hook_gives_lightnings_final_weights(variant, kw):
    import lightning.pytorch as lp
    ours = _final_weights(gl, variant, **kw)
    theirs = _final_weights(lp, variant, **kw)
    _assert_same_weights(ours, theirs)
    if variant == "none":
        return
    untouched = _final_weights(gl, "none", **kw)
    assert any(not torch.allclose(ours[k], untouched[k]) for k in ours), "the override changed nothing"


def test_plain_module_takes_the_fast_loop_and_an_override_the_general_one():
    from gpulayer.trainer.hooks import Hooks
    plain = _regression_net(gl, "none")()
    warm = _regression_net(gl, "warmup")()
    trainer = gl.Trainer(logger=False)
    assert not Hooks(trainer, plain, []).general
    assert Hooks(trainer, warm, []).general
    plain.optimizer_zero_grad = lambda epoch, batch_idx, optimizer: optimizer.zero_grad()
    assert Hooks(trainer, plain, []).general


def test_clip_gradients_refuses_a_value_that_contradicts_the_trainer():
    class Clash(_regression_net(gl, "none")):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val * 2)

    loader = torch.utils.data.DataLoader(_regression_data(), batch_size=8)
    trainer = gl.Trainer(max_epochs=1, gradient_clip_val=0.5, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    with pytest.raises(gl.utilities.MisconfigurationException, match="Please use only one of them"):
        trainer.fit(Clash(), loader)


def test_an_optimizer_step_that_skips_the_closure_is_an_error():
    class Skips(_regression_net(gl, "none")):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            pass

    loader = torch.utils.data.DataLoader(_regression_data(), batch_size=8)
    trainer = gl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(gl.utilities.MisconfigurationException, match="closure hasn't been executed"):
        trainer.fit(Skips(), loader)


def test_a_submodule_frozen_in_eval_stays_in_eval_through_fit_validate_test_predict():
    seen = []

    class Frozen(_regression_net(gl, "none")):
        def __init__(self):
            super().__init__()
            self.frozen = torch.nn.Linear(2, 2).eval()

        def training_step(self, batch, batch_idx):
            seen.append(("train", self.net.training, self.frozen.training))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen.append(("val", self.net.training, self.frozen.training))

        def test_step(self, batch, batch_idx):
            seen.append(("test", self.net.training, self.frozen.training))

        def predict_step(self, batch, batch_idx):
            seen.append(("predict", self.net.training, self.frozen.training))

    model = Frozen()
    loader = torch.utils.data.DataLoader(_regression_data(), batch_size=16)
    trainer = gl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, loader, loader)
    trainer.validate(model, loader, verbose=False)
    trainer.test(model, loader, verbose=False)
    trainer.predict(model, loader)
    assert {s for s in seen if s[0] == "train"} == {("train", True, False)}
    assert {s for s in seen if s[0] != "train"} == {("val", False, False), ("test", False, False),
                                                    ("predict", False, False)}
    assert model.net.training and not model.frozen.training


@needs_lightning
def test_lbfgs_in_automatic_optimization_gives_lightnings_weights():
    import lightning.pytorch as lp

    def lbfgs(pkg):
        class Net(_regression_net(pkg, "none")):
            def configure_optimizers(self):
                return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)
        return Net

    results = []
    for pkg in (gl, lp):
        torch.manual_seed(3)
        model = lbfgs(pkg)()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pkg.Trainer(max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False, accelerator="cpu").fit(
                model, torch.utils.data.DataLoader(_regression_data(), batch_size=8))
        results.append(model.state_dict())
    _assert_same_weights(*results)


def test_dataloader_idx_is_required_with_several_loaders_and_must_default_with_one():
    class NeedsIdx(_regression_net(gl, "none")):
        def validation_step(self, batch, batch_idx, dataloader_idx):
            pass

    class NoIdx(_regression_net(gl, "none")):
        def validation_step(self, batch, batch_idx):
            pass

    loader = torch.utils.data.DataLoader(_regression_data(), batch_size=16)
    trainer = gl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match="have included `dataloader_idx` in `NeedsIdx.validation_step"):
        trainer.validate(NeedsIdx(), loader, verbose=False)
    with pytest.raises(RuntimeError, match="but no `dataloader_idx` argument in `NoIdx.validation_step"):
        trainer.validate(NoIdx(), [loader, loader], verbose=False)
    assert len(trainer.validate(NeedsIdx(), [loader, loader], verbose=False)) == 2


def test_load_from_checkpoint_calls_configure_model_before_the_weights_load(tmp_path):
    calls = []

    class Lazy(gl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = None

        def configure_model(self):
            calls.append("configure_model")
            if self.layer is None:
                self.layer = torch.nn.Linear(4, 1)

        def on_load_checkpoint(self, checkpoint):
            calls.append("on_load_checkpoint")

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Lazy()
    loader = torch.utils.data.DataLoader(hook_recorder.Points(4), batch_size=2)
    trainer = gl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, loader)
    assert calls == ["configure_model"]  # fit builds the layer in configure_model, before the optimizers
    trainer.save_checkpoint(tmp_path / "lazy.ckpt")
    calls.clear()
    loaded = Lazy.load_from_checkpoint(tmp_path / "lazy.ckpt")
    assert calls == ["configure_model", "on_load_checkpoint"]
    torch.testing.assert_close(loaded.layer.weight, model.layer.weight)


def _sanity_calls(L) -> list:
    calls: list = []

    class Recorder(L.Callback):
        def on_sanity_check_start(self, trainer, pl_module):
            calls.append("on_sanity_check_start")

        def on_sanity_check_end(self, trainer, pl_module):
            calls.append("on_sanity_check_end")

        def on_validation_start(self, trainer, pl_module):
            calls.append(f"on_validation_start sanity={trainer.sanity_checking}")

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            pass

        def val_dataloader(self):
            calls.append("val_dataloader")
            return []

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    from tests.trainer.twin import loader
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        L.Trainer(callbacks=[Recorder()], **{**TRAINER_KW, "max_epochs": 1}).fit(Net(), loader())
    return calls


@needs_lightning
def test_a_sanity_check_without_batches_calls_only_its_own_hooks():
    import lightning.pytorch as lp
    ours = _sanity_calls(gl)
    assert ours == ["on_sanity_check_start", "val_dataloader", "on_sanity_check_end"]
    assert ours == _sanity_calls(lp)
