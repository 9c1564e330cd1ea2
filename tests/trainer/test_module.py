"""LightningModule's own behaviour outside the loops: its ``trainer`` and ``fabric`` references, toggling
optimizers, TorchScript, ``clip_gradients``' arguments, logging through an attached Trainer, the strategy's
``backward``. Where Lightning can run the same scenario, ``twin.both`` asserts the same outcome.
"""

from __future__ import annotations

import gc
import weakref
from unittest import mock

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, gpulayer_ns, loader


def test_trainer_of_an_unattached_module_raises_and_an_attached_one_reaches_nested_modules():
    def scenario(L):
        outer, inner = L.LightningModule(), L.LightningModule()
        outer.inner = inner
        with pytest.raises(RuntimeError, match="is not attached to a `Trainer`"):
            outer.trainer
        trainer = L.Trainer(**QUIET)
        outer.trainer = trainer
        return inner.trainer is trainer, outer.trainer is trainer

    assert both(scenario) == (True, True)


def test_fabric_reference_is_weak_and_reaches_nested_modules():
    L = gpulayer_ns()
    outer, inner = L.LightningModule(), L.LightningModule()
    outer.inner = inner

    class Owner:
        pass

    owner = Owner()
    outer.fabric = owner
    assert isinstance(inner.fabric, weakref.ProxyType) and inner.fabric == owner
    del owner
    gc.collect()
    with pytest.raises(ReferenceError):  # the module did not keep it alive
        inner.fabric.anything


def test_toggle_optimizer_freezes_only_the_other_optimizers_parameters_until_untoggled():
    def scenario(L):
        class Two(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.frozen = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
                self.frozen.weight.requires_grad = False

        model = Two()
        opt_a = torch.optim.SGD([*model.a.parameters(), model.frozen.weight], lr=0.1)
        opt_b = torch.optim.SGD(model.b.parameters(), lr=0.1)
        model.trainer = mock.Mock(optimizers=[opt_a, opt_b])
        flags = lambda: [p.requires_grad for p in model.parameters()]  # noqa: E731
        with model.toggled_optimizer(opt_a):
            inside = flags()
            recorded = len(model._param_requires_grad_state)
        return inside, recorded, flags(), len(model._param_requires_grad_state)

    inside, recorded, after, left = both(scenario)
    # a's parameters keep their flags (the frozen weight stays frozen), b's are off; all back afterwards
    assert inside == [True, True, False, False, False, True] and recorded == 5
    assert after == [True, True, True, True, False, True] and left == 0


def test_a_module_attached_to_a_trainer_scripts_with_torch_jit():
    L = gpulayer_ns()

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    model = Net()
    model.trainer = L.Trainer(**QUIET)
    scripted = torch.jit.script(model)
    x = torch.randn(3, 4)
    assert torch.equal(scripted(x), model(x))


def test_gradient_clip_algorithm_defaults_to_none_and_is_an_enum_equal_to_its_name():
    from gpulayer.trainer.utilities import GradClipAlgorithmType

    def scenario(L):
        default = L.Trainer(**QUIET).gradient_clip_algorithm
        given = L.Trainer(gradient_clip_algorithm="Value", **QUIET).gradient_clip_algorithm
        return default, given == "value", str(given.value)

    assert both(scenario) == (None, True, "value")
    assert GradClipAlgorithmType("norm") == "NORM" and GradClipAlgorithmType.supported_type("Value")


def test_clip_gradients_refuses_an_algorithm_other_than_the_one_the_trainer_was_given():
    def scenario(L):
        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                self.clip_gradients(optimizer, gradient_clip_algorithm="value")

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = L.Trainer(max_epochs=1, gradient_clip_algorithm="norm", enable_checkpointing=False, **QUIET)
        with pytest.raises(Exception, match=r"gradient_clip_algorithm='norm'\)` and have passed "
                                            r"`clip_gradients\(gradient_clip_algorithm='value'") as err:
            trainer.fit(Net(), loader())
        return type(err.value).__name__

    assert both(scenario) == "MisconfigurationException"


def test_manual_backward_and_the_closure_go_through_the_strategys_backward():
    def scenario(L, strategy_cls):
        class Manual(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                opt = self.optimizers()

                def closure():
                    loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
                    self.manual_backward(loss, retain_graph=True)
                    self.manual_backward(loss)
                    return loss

                opt.step(closure=closure)
                opt.zero_grad()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = L.Trainer(max_epochs=1, enable_checkpointing=False, **QUIET)
        with mock.patch.object(strategy_cls, "backward", wraps=trainer.strategy.backward) as backward:
            trainer.fit(Manual(), loader(rows=16, batch_size=4))
        return backward.call_count, trainer.global_step

    from gpulayer.trainer.strategies import Strategy
    assert scenario(gpulayer_ns(), Strategy) == (8, 4)
    try:
        import lightning.pytorch as lp
        from lightning.pytorch.strategies import Strategy as LightningStrategy
    except ImportError:
        return
    from tests.trainer.twin import lightning_ns
    assert scenario(lightning_ns(), LightningStrategy) == (8, 4) and lp


def test_step_interval_schedulers_count_frequency_in_epoch_batches_and_plateau_ones_step_after_validation():
    def scenario(L):
        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)
                self.lrs = []

            def training_step(self, batch, batch_idx):
                loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
                self.log("train_loss", loss)
                return loss

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

            def on_validation_end(self):  # what the schedulers had done when validation ended
                self.lrs.append([round(g["lr"], 8) for o in self.trainer.optimizers for g in o.param_groups])

            def configure_optimizers(self):
                a = torch.optim.SGD(self.parameters(), lr=0.1)
                step = torch.optim.lr_scheduler.StepLR(a, step_size=1, gamma=0.5)
                plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(a, patience=0, factor=0.9)
                return [a], [{"scheduler": step, "interval": "step", "frequency": 3},
                             {"scheduler": plateau, "interval": "step", "monitor": "train_loss"}]

        L.seed_everything(0)
        model = Net()
        trainer = L.Trainer(max_epochs=2, val_check_interval=2, num_sanity_val_steps=0, enable_checkpointing=False,
                            **QUIET)
        trainer.fit(model, loader(rows=20, batch_size=4), loader(rows=8, batch_size=4, seed=1))
        return model.lrs, [round(g["lr"], 8) for g in trainer.optimizers[0].param_groups]

    lrs, final = both(scenario)
    assert len(lrs) == 4 and final != [0.1]


def test_fit_and_test_take_a_datamodule_in_the_loaders_place():
    def scenario(L):
        class Data(L.LightningDataModule):
            def __init__(self):
                super().__init__()
                self.requests = []

            def train_dataloader(self):
                self.requests.append(("train", self.trainer.current_epoch))
                return loader(rows=8, batch_size=4)

            def test_dataloader(self):
                self.requests.append(("test", self.trainer.current_epoch))
                return loader(rows=8, batch_size=4)

        class Net(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

            def test_step(self, batch, batch_idx):
                self.log("test_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        dm, model = Data(), Net()
        trainer = L.Trainer(max_epochs=3, reload_dataloaders_every_n_epochs=2, enable_checkpointing=False, **QUIET)
        trainer.fit(model, dm)
        trainer.test(model, dm, verbose=False)
        with pytest.raises(Exception, match="You cannot pass `train_dataloader` or `val_dataloaders` to"):
            trainer.fit(model, loader(), datamodule=dm)
        return dm.requests

    assert both(scenario) == [("train", 0), ("train", 2), ("test", 3)]


def test_log_reaches_the_callback_metrics_of_a_trainer_attached_outside_a_fit():
    L = gpulayer_ns()
    model = L.LightningModule()
    trainer = L.Trainer(**QUIET)
    model.trainer = trainer
    model._current_fx_name = "training_step"  # the hook the value counts as (Lightning's attribute)
    model.log("foo", torch.tensor([1.5]), on_epoch=True)
    assert trainer.callback_metrics["foo"].ndim == 0 and float(trainer.callback_metrics["foo"]) == 1.5
