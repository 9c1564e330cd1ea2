"""RichProgressBar: the tasks it draws per stage and what the metrics column shows, in real fits."""

from __future__ import annotations

import io
import pickle
import re

import pytest

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import ProgressBar, RichProgressBar
from gpulayer.trainer.callbacks.progress import rich_progress
from gpulayer.trainer.callbacks.progress.rich_progress import RichProgressBarTheme
from gpulayer.trainer.demos.boring_classes import BoringModel



def _bar(**kw) -> RichProgressBar:
    return RichProgressBar(console_kwargs={"file": io.StringIO(), "width": 120}, **kw)


class LoggingModel(BoringModel):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"], prog_bar=True)
        return out


def test_fit_draws_sanity_train_and_one_task_per_validation_run(tmp_path):
    bar = _bar()
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=6, limit_val_batches=2,
                      val_check_interval=3, num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
                      callbacks=bar, accelerator="cpu")
    assert [c for c in trainer.callbacks if isinstance(c, ProgressBar)] == [bar] == [trainer.progress_bar_callback]
    trainer.fit(LoggingModel())
    sanity, train, val1, val2 = bar.progress.tasks
    assert (sanity.completed, sanity.total, sanity.visible) == (1, 1, False)
    assert (train.completed, train.total) == (6, 6) and train.description.startswith("Epoch 0/0")
    assert [(t.completed, t.total, t.visible) for t in (val1, val2)] == [(2, 2, False), (2, 2, False)]
    assert bar._progress_stopped  # teardown stopped the display
    text = str(bar.progress.columns[-1]._renderable_cache[bar.train_progress_bar_id][1])
    assert re.fullmatch(r"train_loss: -?\d+\.\d{3}", text), text  # the theme's ".3f"

    trainer.validate(LoggingModel(), verbose=False)  # a new display for the new stage
    (val,) = bar.progress.tasks
    assert (val.completed, val.total, val.description) == (2, 2, "Validation")
    pickle.dumps(bar)


def test_leave_keeps_a_display_per_epoch_and_refresh_rate_zero_draws_nothing(tmp_path, monkeypatch):
    resets = []
    original = rich_progress.Progress.reset

    def counting_reset(self, *args, **kwargs):
        resets.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(rich_progress.Progress, "reset", counting_reset)
    kw = dict(default_root_dir=tmp_path, max_epochs=3, limit_train_batches=1, limit_val_batches=0, logger=False,
              enable_checkpointing=False, enable_model_summary=False, accelerator="cpu")
    Trainer(callbacks=_bar(leave=True), **kw).fit(BoringModel())
    assert resets == []
    Trainer(callbacks=_bar(leave=False), **kw).fit(BoringModel())
    assert len(resets) == 2  # epochs 1 and 2 reuse epoch 0's task
    off = _bar(refresh_rate=0)
    Trainer(callbacks=off, **kw).fit(BoringModel())
    assert off.is_disabled and off.progress is None and off.train_progress_bar_id is None


def test_theme_and_custom_columns():
    from rich.progress import TextColumn

    theme = RichProgressBarTheme(metrics_format=".2e", metrics_text_delimiter="\n")
    assert _bar(theme=theme).theme.metrics_format == ".2e" and _bar().theme.metrics_format == ".3f"

    class OneColumn(RichProgressBar):
        def configure_columns(self, trainer):
            return [TextColumn("{task.description}")]

    bar = OneColumn(console_kwargs={"file": io.StringIO()})
    bar._init_progress(Trainer(accelerator="cpu", logger=False))
    try:
        assert len(bar.progress.columns) == 2 and isinstance(bar.progress.columns[0], TextColumn)
    finally:
        bar.progress.stop()


def test_an_error_stops_the_display(tmp_path):
    class Failing(BoringModel):
        def training_step(self, batch, batch_idx):
            raise ValueError("stop")

    bar = _bar()
    with pytest.raises(ValueError, match="stop"):
        Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, callbacks=bar, accelerator="cpu",
                enable_checkpointing=False).fit(Failing())
    assert bar._progress_stopped and not bar.progress.live.is_started
