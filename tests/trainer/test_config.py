"""Bad Trainer arguments fail at construction with the argument name and the accepted values."""

from __future__ import annotations

import pytest
import torch

from gpulayer.trainer import EarlyStopping, ModelCheckpoint, Module, Trainer, TrainerConfigError, TrainerError


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"precision": "8-mixed"}, r"precision='8-mixed'.*accepted values: '32-true', '16-mixed', 'bf16-mixed'"),
        ({"accelerator": "tpu"}, r"accelerator='tpu'.*'auto', 'cpu', 'cuda', 'gpu'"),
        ({"grad_sync": "ring"}, r"grad_sync='ring'.*'auto', 'two_level', 'flat'"),
        ({"max_epochs": -5}, r"max_epochs=-5"),
        ({"limit_train_batches": 1.5}, r"limit_train_batches=1.5.*fraction"),
        ({"devices": 0}, r"devices=0"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches=0.*>= 1"),
        ({"val_check_interval": -0.5}, r"val_check_interval=-0.5"),
        ({"enable_progress_bar": "yes"}, r"enable_progress_bar='yes'.*True, False"),
        ({"logger": object()}, r"logger=object.*CSVLogger"),
        ({"callbacks": [object()]}, r"callbacks must subclass"),
        ({"max_time": "soon"}, r"max_time='soon'.*DD:HH:MM:SS"),
        ({"max_epoch": 3}, r"unexpected keyword argument 'max_epoch'; did you mean 'max_epochs'"),
        ({"priority": 3}, r"Trainer\(priority=3\) applies to fits on the cluster \(num_nodes > 1\)"),
        ({"priority": 10, "num_nodes": 2}, r"Trainer\(priority=10\): priorities go from 0"),
        ({"priority": -1, "num_nodes": 2}, r"priority=-1"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_accepted_values(kwargs, match):
    with pytest.raises(TrainerConfigError, match=match):
        Trainer(**kwargs)


def test_16_mixed_on_cpu_runs_bf16_as_lightning_does():
    with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
        trainer = Trainer(precision="16-mixed", accelerator="cpu")
    assert trainer.precision == "bf16-mixed" and trainer.precision_plugin.scaler is None


def test_lightning_spellings_are_accepted():
    for p in (32, "32", "32-true", "bf16", "bf16-mixed"):
        Trainer(precision=p, accelerator="cpu", logger=False)
    Trainer(accelerator="auto", devices="auto", max_time={"minutes": 5}, enable_model_summary=False, logger=False)


def test_several_machines_are_configured_for_the_cluster_not_this_machine(monkeypatch):
    trainer = Trainer(num_nodes=2, devices=2, accelerator="cpu", logger=False)
    assert (trainer.num_nodes, trainer.num_devices) == (2, 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the workers' GPUs count, not ours
    Trainer(num_nodes=2, devices=4, accelerator="cuda", logger=False)
    with pytest.raises(TrainerConfigError, match="pass devices=M"):
        Trainer(num_nodes=2, devices=-1, accelerator="cuda", logger=False)
    with pytest.raises(TrainerConfigError, match="cluster_resources=.*num_nodes > 1"):
        Trainer(devices=2, accelerator="cpu", cluster_resources={"zone": "z"}, logger=False)
    with pytest.raises(TrainerConfigError, match="gpulayer.Resources"):
        Trainer(num_nodes=2, devices=2, accelerator="cpu", cluster_resources="z", logger=False)


def test_max_restarts_is_for_cluster_fits_and_their_paths_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(num_nodes=2, devices=2, accelerator="cpu", max_restarts=2, default_root_dir="runs", logger=False)
    # the ranks run in another working directory, on another machine: their checkpoints need an absolute path
    assert trainer.config.max_restarts == 2 and trainer.default_root_dir == str(tmp_path / "runs")
    assert Trainer(devices=2, accelerator="cpu", default_root_dir="runs", logger=False).default_root_dir == "runs"
    with pytest.raises(TrainerConfigError, match=r"max_restarts=1\) applies to fits on the cluster.*num_nodes > 1"):
        Trainer(devices=2, accelerator="cpu", max_restarts=1, logger=False)
    with pytest.raises(TrainerConfigError, match=r"max_restarts=-1\) must be an integer >= 0"):
        Trainer(num_nodes=2, devices=2, accelerator="cpu", max_restarts=-1, logger=False)


def test_callback_arguments_are_checked():
    with pytest.raises(TrainerConfigError, match="mode='avg'.*'min', 'max'"):
        ModelCheckpoint(mode="avg")
    with pytest.raises(TrainerConfigError, match="save_top_k=3, monitor=None"):
        ModelCheckpoint(save_top_k=3)
    with pytest.raises(TrainerConfigError, match="mode='down'"):
        EarlyStopping(monitor="val_loss", mode="down")


class _Net(Module):
    def __init__(self, result):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.result = result

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return self.result(self)


def _loader():
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)


def test_bad_configure_optimizers_results_are_explained():
    quiet = dict(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(TrainerConfigError, match="not one of Lightning's forms"):
        Trainer(**quiet).fit(_Net(lambda m: "sgd"), _loader())
    with pytest.raises(TrainerConfigError, match="manual optimization"):
        Trainer(**quiet).fit(_Net(lambda m: [torch.optim.SGD(m.parameters(), 0.1)] * 2), _loader())
    with pytest.raises(TrainerConfigError, match='must be "step" or "epoch" but is "hour"'):
        Trainer(**quiet).fit(_Net(lambda m: {"optimizer": (o := torch.optim.SGD(m.parameters(), 0.1)),
                                             "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(o, 1),
                                                              "interval": "hour"}}), _loader())
    with pytest.raises(TrainerConfigError, match="must be a `LightningModule`.*subclass gpulayer.trainer.LightningModule"):
        Trainer(**quiet).fit(torch.nn.Linear(2, 1), _loader())
    with pytest.raises(TrainerConfigError, match="no training data"):
        Trainer(**quiet).fit(_Net(lambda m: torch.optim.SGD(m.parameters(), 0.1)))
