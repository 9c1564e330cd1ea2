"""One Trainer, several stages, one ``CSVLogger``: ``metrics.csv`` keeps every stage's rows, on one device
and on two (``strategy="ddp"``), as Lightning 2.6.6 keeps them.

On two devices each stage runs in new rank processes here, while Lightning's rank 0 is the calling
process and keeps one writer for the whole run: a later stage must append to the file (at the step and
epoch the trainer stands at), not clear it, and a second fit must find the first one's position.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import stage_logs
from tests.trainer.twin import needs_lightning

SEQUENCES = ["fit,validate", "fit,test", "fit,predict", "validate,fit", "fit,fit"]
SCRIPT = Path(stage_logs.__file__)
REPO = Path(__file__).resolve().parents[2]


def _lightning(devices: int, sequence: str, tmp_path: Path) -> dict:
    # Lightning's strategy="ddp" starts its other rank by running the script again: it runs as a script
    out = tmp_path / "lightning.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "lightning.pytorch", str(devices), sequence,
                           str(tmp_path / "lightning"), str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(out.read_text())


@needs_lightning
@pytest.mark.parametrize("sequence", SEQUENCES)
def test_two_devices_keep_every_stages_rows_as_lightning_ddp(sequence, tmp_path):
    ours = stage_logs.run("gpulayer.trainer", 2, sequence.split(","), str(tmp_path / "gpulayer"))
    theirs = _lightning(2, sequence, tmp_path)
    assert ours["rows"] == theirs["rows"], f"gpulayer wrote {ours['rows']}, Lightning 2.6.6 {theirs['rows']}"
    for key in ("log_dir", "files", "columns", "position", "last_stage_trained"):
        assert ours[key] == theirs[key], f"{key}: gpulayer {ours[key]!r}, Lightning 2.6.6 {theirs[key]!r}"
    # the fit's rows are there, whatever ran before or after it: 2 epochs of 4 steps, logged every 2
    assert sum("train_loss" in r[2] for r in ours["rows"]) == 4


@needs_lightning
def test_fit_then_validate_keeps_the_fit_rows_on_one_device_and_two(tmp_path):
    one = stage_logs.run("gpulayer.trainer", 1, ["fit", "validate"], str(tmp_path / "one"))
    assert one == stage_logs.run("lightning.pytorch", 1, ["fit", "validate"], str(tmp_path / "lightning"))
    two = stage_logs.run("gpulayer.trainer", 2, ["fit", "validate"], str(tmp_path / "two"))
    for result, steps_per_epoch in ((one, 8), (two, 4)):
        fit_rows = result["rows"][:-1]
        assert [r[2] for r in fit_rows].count(["val_loss"]) == 2  # one validation per epoch of the fit
        assert [r[2] for r in fit_rows].count(["train_loss"]) == steps_per_epoch  # every 2 steps, 2 epochs
        # validate's row comes last, at the step and epoch the fit ended at
        assert result["rows"][-1] == ["2", str(2 * steps_per_epoch), ["val_loss"]]
    assert not one["deleted_warning"]


def test_a_csv_logger_that_went_to_another_process_appends_where_it_stopped(tmp_path):
    import csv
    import pickle

    from gpulayer.trainer.loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)  # buffered: written when the logger is pickled for the ranks
    rank_zero = pickle.loads(pickle.dumps(logger))
    rank_zero.log_metrics({"b": 2.0}, step=1)  # a new column: the file is rewritten under the wider header
    rank_zero.finalize("success")
    back = pickle.loads(pickle.dumps(rank_zero))
    back.log_metrics({"a": 3.0}, step=2)
    back.save()
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", newline="") as f:
        assert list(csv.reader(f)) == [["a", "b", "step"], ["1.0", "", "0"], ["", "2.0", "1"], ["3.0", "", "2"]]
    # another logger on the same directory is a new run there: Lightning's warning, and the old rows go
    other = CSVLogger(tmp_path, version=0)
    with pytest.warns(UserWarning, match="will be deleted"):
        other.log_metrics({"c": 4.0}, step=0)
    other.save()
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", newline="") as f:
        assert list(csv.reader(f)) == [["c", "step"], ["4.0", "0"]]


def test_a_failed_fit_on_two_devices_keeps_its_rows_for_the_next_stage(tmp_path):
    import csv

    import gpulayer.trainer as gl

    class Breaks(stage_logs._net(gl)):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 3:
                raise RuntimeError("step 3 breaks")
            return super().training_step(batch, batch_idx)

    logger = gl.loggers.CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    trainer = gl.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=logger,
                         log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    model = Breaks()
    with pytest.raises(Exception, match="step 3 breaks"):
        trainer.fit(model, stage_logs._loader())
    trainer.validate(model, stage_logs._loader(), verbose=False)
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows if r["train_loss"]] == ["0", "1", "2"]  # what the fit wrote before it broke
    assert rows[-1]["val_loss"] and logger.log_dir.endswith("version_0")
