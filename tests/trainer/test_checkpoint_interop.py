"""Checkpoints move both ways between gpulayer and Lightning 2.6: resume, load_from_checkpoint, callback states."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.trainer.callbacks import EarlyStopping as GlEarlyStopping, ModelCheckpoint as GlModelCheckpoint

pl = pytest.importorskip("lightning.pytorch")


def _model_class(base):
    class Regressor(base):
        """SGD with momentum and a step scheduler: resuming must carry optimizer and scheduler state."""

        def __init__(self, hidden: int = 8, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]

    return Regressor


GlModel = _model_class(gl.LightningModule)
PlModel = _model_class(pl.LightningModule)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=8)  # 8 batches an epoch, same order every epoch
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)
    return train, val


def _quiet(**kw):
    return dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kw)


def _pl_trainer(tmp_path, max_epochs, **kw):
    cbs = [pl.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_last=True),
           pl.callbacks.EarlyStopping(monitor="val_loss", patience=50)]
    return pl.Trainer(max_epochs=max_epochs, callbacks=cbs, accelerator="cpu", devices=1,
                      default_root_dir=tmp_path, **_quiet(**kw))


def _gl_trainer(tmp_path, max_epochs, **kw):
    cbs = [GlModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_last=True),
           GlEarlyStopping(monitor="val_loss", patience=50)]
    return gl.Trainer(max_epochs=max_epochs, callbacks=cbs, default_root_dir=tmp_path, **_quiet(**kw))


def _fit(make_trainer, model_cls, tmp_path, max_epochs, ckpt_path=None):
    torch.manual_seed(1)
    model = model_cls()
    trainer = make_trainer(tmp_path, max_epochs)
    train, val = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train, val, ckpt_path=ckpt_path)
    return model, trainer


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _assert_same(a, b):
    for x, y in zip(_params(a), _params(b)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_a_gpulayer_checkpoint_resumes_in_lightning_to_the_uninterrupted_weights(tmp_path):
    full, _ = _fit(_pl_trainer, PlModel, tmp_path / "full", 4)
    _, gl_trainer = _fit(_gl_trainer, GlModel, tmp_path / "gl", 2)
    last = gl_trainer.checkpoint_callback.last_model_path
    saved = torch.load(last, weights_only=False)
    assert saved["pytorch-lightning_version"] and saved["hyper_parameters"] == {"hidden": 8, "lr": 0.05}
    resumed, pl_trainer = _fit(_pl_trainer, PlModel, tmp_path / "gl", 4, ckpt_path=last)
    assert pl_trainer.global_step == 32 and pl_trainer.current_epoch == 4
    _assert_same(full, resumed)
    # the callbacks' states came across by state_key: the best score of epochs 0-1 is still known
    assert pl_trainer.checkpoint_callback.best_model_score <= gl_trainer.checkpoint_callback.best_model_score


def test_a_lightning_checkpoint_resumes_in_gpulayer_to_the_uninterrupted_weights(tmp_path):
    full, _ = _fit(_gl_trainer, GlModel, tmp_path / "full", 4)
    _, pl_trainer = _fit(_pl_trainer, PlModel, tmp_path / "pl", 2)
    last = pl_trainer.checkpoint_callback.last_model_path
    resumed, gl_trainer = _fit(_gl_trainer, GlModel, tmp_path / "pl", 4, ckpt_path=last)
    assert gl_trainer.ckpt_path == last
    assert gl_trainer.global_step == 32 and gl_trainer.current_epoch == 4
    _assert_same(full, resumed)
    es = gl_trainer.early_stopping_callback
    assert es.wait_count >= 0 and float(es.best_score) <= float(pl_trainer.early_stopping_callback.best_score)


def test_a_mid_epoch_gpulayer_checkpoint_continues_in_lightning_from_its_step(tmp_path):
    torch.manual_seed(1)
    cb = GlModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1)
    train, val = _data()
    gl.Trainer(max_epochs=1, callbacks=[cb], **_quiet()).fit(GlModel(), train, val)
    path = str(tmp_path / "epoch=0-step=5.ckpt")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, **_quiet())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(PlModel(), train, val, ckpt_path=path)
    assert trainer.global_step == 8 and trainer.current_epoch == 1  # the 3 batches left of the epoch


@pytest.mark.parametrize("direction", ["gpulayer_to_lightning", "lightning_to_gpulayer"])
def test_load_from_checkpoint_rebuilds_the_model_from_the_other_sides_file(tmp_path, direction):
    writer, reader = (GlModel, PlModel) if direction == "gpulayer_to_lightning" else (PlModel, GlModel)
    torch.manual_seed(3)
    model = writer(hidden=5, lr=0.2)
    train, _ = _data()
    if writer is GlModel:
        trainer = gl.Trainer(max_epochs=1, **_quiet())
    else:
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, **_quiet())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = reader.load_from_checkpoint(tmp_path / "m.ckpt", lr=0.3)
    assert loaded.hparams.hidden == 5 and loaded.hparams.lr == 0.3
    _assert_same(model, loaded)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_amp_scaler_state_is_stored_under_lightnings_key(tmp_path):
    from gpulayer.trainer import checkpoint
    assert checkpoint.SCALER_KEY == type(pl.Trainer(precision="16-mixed", accelerator="cpu",
                                                    logger=False).precision_plugin).__qualname__


def test_fit_ckpt_path_hpc_resumes_from_the_highest_numbered_hpc_checkpoint(tmp_path):
    _, trainer = _fit(_gl_trainer, GlModel, tmp_path, 1)
    for n in (1, 2):
        trainer.save_checkpoint(tmp_path / f"hpc_ckpt_{n}.ckpt")
    resumed = _gl_trainer(tmp_path, 2)
    train, val = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.fit(GlModel(), train, val, ckpt_path="hpc")
    assert resumed.ckpt_path == str(tmp_path / "hpc_ckpt_2.ckpt") and resumed.global_step == 16
    with pytest.raises(ValueError, match='no HPC checkpoint was found'):
        _gl_trainer(tmp_path / "empty", 1).fit(GlModel(), train, val, ckpt_path="hpc")
