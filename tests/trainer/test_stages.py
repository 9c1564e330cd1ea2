"""validate / test / predict, manual optimization and ModelCheckpoint's time trigger, as Lightning does them."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Callback, LightningModule, ModelCheckpoint, Trainer, seed_everything

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")


def _loader(n: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=8)


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.calls: list[str] = []

    def forward(self, x):
        return self.layer(x)

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")

    def teardown(self, stage):
        self.calls.append(f"teardown:{stage}")

    def on_test_start(self):
        self.calls.append("on_test_start")

    def on_test_epoch_end(self):
        self.calls.append("on_test_epoch_end")
        self.log("test_marker", 1.0)

    def on_test_end(self):
        self.calls.append("on_test_end")

    def on_predict_epoch_end(self):
        self.calls.append("on_predict_epoch_end")


def test_validate_test_predict_return_lightnings_values_and_call_the_hooks(tmp_path):
    seed_everything(0)
    model = Net()
    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, _loader(), _loader(seed=1))
    assert {"train_loss_step", "train_loss_epoch", "val_loss"} <= set(trainer.callback_metrics)
    assert "val_loss" in trainer.logged_metrics  # what the issue found missing
    val = trainer.validate(model, _loader(seed=1), verbose=False)
    assert val == [{"val_loss": pytest.approx(float(trainer.callback_metrics["val_loss"]))}]
    model.calls.clear()
    tested = trainer.test(model, dataloaders=_loader(seed=2), verbose=False)
    assert set(tested[0]) == {"test_loss", "test_marker"} and tested[0]["test_marker"] == 1.0
    assert model.calls == ["setup:test", "on_test_start", "on_test_epoch_end", "on_test_end", "teardown:test"]
    preds = trainer.predict(model, _loader(seed=2))
    assert len(preds) == 4 and preds[0].shape == (8, 1)
    class TwoLoaders(Net):
        def test_step(self, batch, batch_idx, dataloader_idx=0):
            super().test_step(batch, batch_idx)

    two = trainer.test(TwoLoaders(), dataloaders=[_loader(seed=2), _loader(seed=3)], verbose=False)
    assert set(two[0]) == {"test_loss/dataloader_idx_0", "test_marker"}
    assert set(two[1]) == {"test_loss/dataloader_idx_1", "test_marker"}


def test_test_and_predict_load_the_best_checkpoint(tmp_path):
    seed_everything(0)
    model = Net()
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", filename="{epoch}-{val_loss:.2f}")
    trainer = Trainer(max_epochs=3, callbacks=[ckpt], default_root_dir=tmp_path, **QUIET)
    trainer.fit(model, _loader(), _loader(seed=1))
    assert os.path.basename(ckpt.best_model_path).startswith("epoch=")
    best = torch.load(ckpt.best_model_path, weights_only=True)["state_dict"]
    trainer.test(model, _loader(seed=2), ckpt_path="best", verbose=False)
    assert torch.equal(model.layer.weight, best["layer.weight"])
    with pytest.raises(ValueError, match='ckpt_path="best"'):
        Trainer(**QUIET, enable_checkpointing=False).test(Net(), _loader(), ckpt_path="best")


def test_a_missing_test_step_is_explained():
    class NoTest(Net):
        test_step = None

    with pytest.raises(Exception, match=r"No `test_step\(\)` method defined to run `Trainer.test`"):
        Trainer(**QUIET).test(NoTest(), _loader())


class Manual(Net):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        for opt, layer in ((opt_a, self.layer), (opt_b, self.other)):
            self.toggle_optimizer(opt)
            loss = torch.nn.functional.mse_loss(layer(batch[0]), batch[1])
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.untoggle_optimizer(opt)
        if batch_idx == 3:  # the last of 4 batches
            for sched in self.lr_schedulers():
                sched.step()

    def configure_optimizers(self):
        a, b = torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.SGD(self.other.parameters(), lr=0.1)
        return [a, b], [torch.optim.lr_scheduler.StepLR(a, 1, gamma=0.1), {"scheduler": torch.optim.lr_scheduler.StepLR(b, 1),
                                                                            "interval": "step"}]


def test_manual_optimization_leaves_the_schedulers_to_the_user():
    model = Manual()
    trainer = Trainer(max_epochs=3, enable_checkpointing=False, **QUIET)
    trainer.fit(model, _loader())
    assert trainer.global_step == 3 * 4 * 2  # every optimizer.step() counts, as in Lightning
    lrs = [o.param_groups[0]["lr"] for o in trainer.optimizers]
    assert lrs == [pytest.approx(0.1 * 0.1**3), pytest.approx(0.1 * 0.1**3)]  # stepped once per epoch by the user only


def test_model_checkpoint_saves_on_a_time_interval(tmp_path):
    class SlowSteps(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            cb = trainer.checkpoint_callback
            cb._last_time_checked -= 10.0  # as if ten seconds had passed since the last check

    ckpt = ModelCheckpoint(dirpath=tmp_path, train_time_interval=datetime.timedelta(seconds=5), save_top_k=-1)
    Trainer(max_epochs=1, callbacks=[SlowSteps(), ckpt], **QUIET).fit(Net(), _loader())
    assert sorted(os.listdir(tmp_path)) == [f"epoch=0-step={s}.ckpt" for s in (1, 2, 3, 4)]


def test_two_devices_test_and_predict_run_in_processes_with_a_distributed_sampler():
    seed_everything(0)
    model = Net()
    trainer = Trainer(devices=2, enable_checkpointing=False, **QUIET)
    tested = trainer.test(model, _loader(), verbose=False)
    single = Trainer(**QUIET).test(model, _loader(), verbose=False)
    assert tested[0]["test_loss"] == pytest.approx(single[0]["test_loss"], rel=1e-5)  # sync_dist=True: every sample
    preds = trainer.predict(model, _loader(n=24))  # rank 0's share: 12 samples, each once
    assert sum(p.shape[0] for p in preds) == 12
