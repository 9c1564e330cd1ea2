"""CSVLogger: rows are appended between saves; a new column rewrites the file with every row."""

from __future__ import annotations

import csv

from gpulayer.trainer import CSVLogger


def _read(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_rows_append_and_a_new_column_rewrites_the_file(tmp_path):
    logger = CSVLogger(tmp_path, name="exp")
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"loss": 0.5}, step=1)
    logger.save()
    logger.save()  # nothing new: nothing written
    assert _read(logger.metrics_file_path) == [{"step": "0", "loss": "1.0"}, {"step": "1", "loss": "0.5"}]
    logger.log_metrics({"val_loss": 0.7, "epoch": 0}, step=1)
    logger.log_metrics({"loss": 0.25}, step=2)
    logger.save()
    rows = _read(logger.metrics_file_path)
    assert list(rows[0]) == ["step", "loss", "val_loss", "epoch"]
    assert [r["loss"] for r in rows] == ["1.0", "0.5", "", "0.25"] and rows[2]["val_loss"] == "0.7"
