"""The default progress bar: Lightning's ``TQDMProgressBar`` callback, drawn as gpulayer's quiet line bar."""

from __future__ import annotations

import io
import itertools
import re
import sys

import pytest
import torch

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import ProgressBar, TQDMProgressBar
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.errors import TrainerConfigError
from tests.trainer.twin import both, needs_lightning


def test_bar_is_a_callback_by_default_before_the_checkpoint_callback():
    trainer = Trainer(logger=False)
    bar = trainer.progress_bar_callback
    assert isinstance(bar, TQDMProgressBar) and isinstance(bar, ProgressBar)
    assert trainer.callbacks.index(bar) < trainer.callbacks.index(trainer.checkpoint_callback)
    assert Trainer(logger=False, enable_progress_bar=False).progress_bar_callback is None


def test_one_bar_only_and_not_with_enable_progress_bar_false():
    with pytest.raises(TrainerConfigError, match="only one progress bar"):
        Trainer(callbacks=[TQDMProgressBar(), TQDMProgressBar()], logger=False)
    with pytest.raises(TrainerConfigError, match="enable_progress_bar=False"):
        Trainer(callbacks=[TQDMProgressBar()], enable_progress_bar=False, logger=False)
    mine = TQDMProgressBar(refresh_rate=5)
    assert Trainer(callbacks=[mine], logger=False).progress_bar_callback is mine


def _val_totals(L):
    seen = []

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            return None

        def on_train_epoch_end(self):
            bar = self.trainer.progress_bar_callback
            seen.append((bar.total_train_batches, bar.total_val_batches, bar.train_progress_bar.total))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=4)
    L.Trainer(max_epochs=4, check_val_every_n_epoch=2, limit_val_batches=2, num_sanity_val_steps=0, logger=False,
              enable_checkpointing=False, enable_model_summary=False).fit(Model(), data, data)
    return seen


@needs_lightning
def test_totals_follow_lightning_including_epochs_without_validation():
    assert both(_val_totals) == [(3, 0, 3), (3, 2, 3), (3, 0, 3), (3, 2, 3)]


def test_unsized_loader_with_max_steps_shows_the_steps_as_total():
    model = BoringModel()
    model.train_dataloader = lambda: (torch.randn(4, 32) for _ in itertools.count())
    trainer = Trainer(max_steps=7, max_epochs=-1, limit_val_batches=0, logger=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(model)
    assert trainer.progress_bar_callback.train_progress_bar.total == 7
    assert trainer.progress_bar_callback.train_progress_bar.n == 7


def test_not_a_terminal_one_line_per_epoch_and_nothing_for_validation(capsys):
    trainer = Trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=2, logger=False, enable_checkpointing=False,
                      enable_model_summary=False)
    trainer.fit(BoringModel())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" [")[0] for line in lines] == ["Epoch 0: 4/4", "Epoch 1: 4/4", "Epoch 2: 4/4"]
    assert "\r" not in "".join(lines)


class _Terminal(io.StringIO):
    """stdout as a terminal: the bar redraws in place on it."""

    def isatty(self):
        return True


def _fit_on_terminal(monkeypatch, bar: TQDMProgressBar, epochs: int = 3) -> str:
    screen = _Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    Trainer(max_epochs=epochs, limit_train_batches=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
            enable_model_summary=False, callbacks=[bar]).fit(BoringModel())
    return screen.getvalue()


def _kept_lines(out: str) -> list[str]:
    """The lines a terminal keeps: what each finished line ends with after its last carriage return."""
    return [line.rsplit("\r", 1)[-1].split(" [")[0] for line in out.split("\n")[:-1]]


def test_leave_true_keeps_every_finished_epoch_line_on_a_terminal(monkeypatch):
    out = _fit_on_terminal(monkeypatch, TQDMProgressBar(leave=True))
    assert _kept_lines(out) == ["Epoch 0: 4/4", "Epoch 1: 4/4", "Epoch 2: 4/4"]


def test_leave_false_draws_each_epoch_over_the_last_and_keeps_the_final_one(monkeypatch):
    out = _fit_on_terminal(monkeypatch, TQDMProgressBar(leave=False))
    assert _kept_lines(out) == ["Epoch 2: 4/4"]  # one line left on screen
    assert "\rEpoch 0: 4/4" in out and "\rEpoch 1: 4/4" in out  # drawn, then drawn over


def test_process_position_draws_the_bars_that_many_lines_down(monkeypatch):
    out = _fit_on_terminal(monkeypatch, TQDMProgressBar(process_position=2), epochs=2)
    # every draw goes two lines down, writes the bar's row and moves the cursor back up: nothing else moves
    assert re.fullmatch(r"(\n\n\r[^\n]*?\033\[K\033\[2A)+", out), out
    assert "\n\n\rEpoch 1: 4/4" in out
    with pytest.raises(TrainerConfigError, match=r"process_position=-1\) must be an int >= 0"):
        TQDMProgressBar(process_position=-1)


def test_a_log_gets_one_line_per_epoch_whatever_leave_and_process_position_say(capsys):
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, logger=False,
                      enable_checkpointing=False, enable_model_summary=False,
                      callbacks=[TQDMProgressBar(leave=True, process_position=1)])
    trainer.fit(BoringModel())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" [")[0] for line in lines] == ["Epoch 0: 2/2", "Epoch 1: 2/2"]


def test_refresh_rate_zero_draws_nothing(capsys):
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[TQDMProgressBar(refresh_rate=0)])
    trainer.fit(BoringModel())
    assert trainer.progress_bar_callback.is_disabled
    assert capsys.readouterr().out == ""


def test_bar_shows_logged_prog_bar_values_and_version(capsys, tmp_path):
    class Logs(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("shown", 2.5, prog_bar=True)
            return out

    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, default_root_dir=tmp_path,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Logs())
    out = capsys.readouterr().out
    assert "v_num=0" in out and "shown=2.5" in out
    assert trainer.progress_bar_callback.get_metrics(trainer, None) == {"v_num": 0, "shown": 2.5}


def test_the_bar_alone_does_not_make_the_loop_build_batch_outputs():
    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(BoringModel())
    assert trainer.hooks.on_train_batch_end and not trainer.hooks.train_batch_end_outputs


def test_bar_pickles_without_its_trainer_or_stream():
    import pickle

    trainer = Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(BoringModel())
    copy = pickle.loads(pickle.dumps(trainer.progress_bar_callback))
    with pytest.raises(TypeError, match="has not been set yet"):
        copy.train_progress_bar
    assert copy.refresh_rate == 1 and copy.is_enabled
