"""Checkpoints: exact resume (mid-epoch too), ModelCheckpoint's top-k, last and names."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, ModelCheckpoint, Trainer, TrainerError, seed_everything


class Net(Module):
    """Dropout, AdamW state and a per-step scheduler: everything a resume must restore."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
        self.losses: dict[int, float] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.losses[self.global_step] = loss.item()
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(5)
    ds = TensorDataset(torch.randn(320, 8, generator=g), torch.randn(320, 1, generator=g))
    return DataLoader(ds, batch_size=16, shuffle=True)  # 20 batches per epoch


def test_resume_mid_epoch_gives_the_losses_of_an_uninterrupted_run(tmp_path):
    seed_everything(3)
    full = Net()
    ckpt = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=9, save_top_k=-1)
    Trainer(max_epochs=3, logger=False, callbacks=[ckpt], enable_progress_bar=False).fit(full, _loader())
    assert sorted(os.listdir(tmp_path))[:2] == ["step=18.ckpt", "step=27.ckpt"]

    seed_everything(99)  # different initial weights and RNG: all must come from the checkpoint
    resumed = Net()
    trainer = Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(resumed, _loader(), ckpt_path=str(tmp_path / "step=27.ckpt"))  # epoch 1, batch 7 of 20
    assert resumed.losses == {s: v for s, v in full.losses.items() if s >= 27}
    assert trainer.global_step == 60 and trainer.current_epoch == 3
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_stop_at_max_steps_then_resume_continues_exactly(tmp_path):
    seed_everything(4)
    full = Net()
    Trainer(max_steps=30, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(full, _loader())

    seed_everything(4)
    first = Net()
    t1 = Trainer(max_steps=13, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    t1.fit(first, _loader())
    t1.save_checkpoint(tmp_path / "stop.ckpt")
    assert t1.current_epoch == 1 and t1.global_step == 13  # the epoch cut short by max_steps counts (Lightning's)

    second = Net()
    t2 = Trainer(max_steps=30, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    t2.fit(second, _loader(), ckpt_path=str(tmp_path / "stop.ckpt"))
    assert {**first.losses, **second.losses} == full.losses


def test_resume_from_last_after_an_epoch_end(tmp_path):
    seed_everything(5)
    full = Net()
    Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(full, _loader())

    seed_everything(5)
    first = Net()
    cb = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    Trainer(max_epochs=1, logger=False, callbacks=[cb], enable_progress_bar=False).fit(first, _loader())
    assert os.path.isfile(tmp_path / "last.ckpt")
    second = Net()
    cb2 = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = Trainer(max_epochs=2, logger=False, callbacks=[cb2], enable_progress_bar=False)
    trainer.fit(second, _loader(), ckpt_path="last")
    assert trainer.ckpt_path == str(tmp_path / "last.ckpt")  # the file "last" resolved to, as Lightning reports it
    assert {**first.losses, **second.losses} == full.losses
    assert trainer.current_epoch == 2


def test_top_k_by_monitor_keeps_the_best_and_names_them(tmp_path):
    val = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=16)
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode="min", save_top_k=2,
                         filename="{epoch}-{val_loss:.3f}")
    seed_everything(6)
    trainer = Trainer(max_epochs=4, logger=False, callbacks=[cb], enable_progress_bar=False, num_sanity_val_steps=0)
    trainer.fit(Net(), _loader(), val)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(f.startswith("epoch=") and "-val_loss=" in f for f in files)
    assert set(cb.best_k_models) == {str(tmp_path / f) for f in files}
    assert cb.best_model_score == min(cb.best_k_models.values())
    state = torch.load(cb.best_model_path, weights_only=False)
    assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step",
            "pytorch-lightning_version", "callbacks"} <= set(state)
    assert "rng" in state["callbacks"]["gpulayer"]  # gpulayer's exact-resume extras stay under its own key


def test_default_checkpoint_goes_under_the_logger_dir(tmp_path):
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(Net(), _loader())
    assert os.listdir(tmp_path / "lightning_logs" / "version_0" / "checkpoints") == ["epoch=0-step=20.ckpt"]


def test_missing_monitor_and_missing_last_are_explained(tmp_path):
    # as in Lightning: without a validation run the key may still come, so a warning; after one, an error
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="nope")
    with pytest.warns(UserWarning, match="monitor='nope'.*could not find the monitored key.*log\\('nope'"):
        Trainer(max_epochs=1, logger=False, callbacks=[cb], enable_progress_bar=False).fit(Net(), _loader())
    assert not os.listdir(tmp_path)
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="nope")
    with pytest.raises(TrainerError, match="monitor='nope'.*could not find the monitored key.*'val_loss'.*log\\('nope'"):
        Trainer(max_epochs=1, logger=False, callbacks=[cb], enable_progress_bar=False).fit(Net(), _loader(), _loader())
    # Lightning's "set and forget" ckpt_path="last": before any last checkpoint exists, a warning and a fresh start
    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.warns(UserWarning, match="there is no last checkpoint available"):
        trainer.fit(Net(), _loader(), ckpt_path="last")
    assert trainer.ckpt_path is None and trainer.global_step == 20


class _StopsAt30(Net):
    """Attempt 0 of a cluster fit, cut short by a failure after its checkpoint of step 27."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 30:
            raise RuntimeError("the machine went away")
        return super().training_step(batch, batch_idx)


def test_a_restarted_attempt_resumes_from_the_newest_checkpoint_its_own_fit_wrote(tmp_path):
    from gpulayer.trainer import fit_rank
    from gpulayer.trainer.config import build_config

    def config(**kw):
        ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=9, save_last=True)
        return build_config(max_epochs=3, logger=False, enable_progress_bar=False, callbacks=[ckpt], **kw)

    seed_everything(3)
    full = Net()
    Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False).fit(full, _loader())
    seed_everything(3)
    with pytest.raises(RuntimeError, match="went away"):
        fit_rank(config(), _StopsAt30(), _loader(), fit_id="fit-a")  # saved steps 9, 18, 27 (and last.ckpt)
    # newer files that are not this fit's full checkpoints: another run's, a weights-only one, junk
    other = torch.load(tmp_path / "last.ckpt", weights_only=False)
    other["callbacks"]["gpulayer"]["fit_id"] = "fit-b"
    torch.save(other, tmp_path / "other-run.ckpt")
    torch.save({"state_dict": {}, "gpulayer": {"fit_id": "fit-a"}, "global_step": 29}, tmp_path / "weights.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    for age, name in enumerate(["junk.ckpt", "weights.ckpt", "other-run.ckpt"]):
        os.utime(tmp_path / name, (time.time() + 10 - age, time.time() + 10 - age))

    seed_everything(99)  # another start: weights and RNG must all come from the checkpoint
    resumed = Net()
    result = fit_rank(config(), resumed, _loader(), fit_id="fit-a", resume=True)
    assert result["fit_info"]["resumed_from"] == {"path": str(tmp_path / "last.ckpt"), "global_step": 27, "epoch": 1}
    assert resumed.losses == {s: v for s, v in full.losses.items() if s >= 27} and result["global_step"] == 60
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]["gpulayer"]["fit_id"] == "fit-a"

    fresh = tmp_path / "fresh"  # a restart before the first checkpoint starts over
    result = fit_rank(build_config(max_steps=3, logger=False, enable_progress_bar=False,
                                   callbacks=[ModelCheckpoint(dirpath=fresh)]), Net(), _loader(),
                      fit_id="fit-c", resume=True)
    assert result["fit_info"]["resumed_from"] is None and result["global_step"] == 3
