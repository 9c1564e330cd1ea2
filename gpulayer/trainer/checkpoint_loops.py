"""The fit position in a checkpoint, as Lightning's loop progress counters (its ``loops`` key) and back.

Lightning resumes from counters of what each loop had started, processed and
completed when the file was written. gpulayer knows the same position as
(epoch, batches done in it, where in the epoch the save happened); these two
functions translate, so that a gpulayer checkpoint resumes in Lightning and a
Lightning checkpoint resumes in gpulayer. The counter values for each kind of
save point were read off checkpoints Lightning 2.6 wrote at the same points.
"""

from __future__ import annotations

import math
from typing import Any

# where in the fit a checkpoint was written
BATCH_END = "batch_end"      # on_train_batch_end (every_n_train_steps), mid-epoch
VALIDATION = "validation"    # during or at the end of a validation run inside the fit
EPOCH_END = "epoch_end"      # on_train_epoch_end, after the epoch's batches and validation
BETWEEN = "between"          # no epoch running: before the first, after the last, or between two


def _progress(ready: int, started: int, processed: int, completed: int) -> dict[str, int]:
    return {"ready": ready, "started": started, "processed": processed, "completed": completed}


def _both(current: dict[str, int], total: dict[str, int]) -> dict[str, Any]:
    return {"total": dict(total), "current": dict(current)}


def _opt_counts(n_cur: int, n_tot: int) -> dict[str, Any]:
    return {"step": {"total": {"ready": n_tot, "completed": n_tot}, "current": {"ready": n_cur, "completed": n_cur}},
            "zero_grad": {"total": {"ready": n_tot, "completed": n_tot, "started": n_tot},
                          "current": {"ready": n_cur, "completed": n_cur, "started": n_cur}}}


def _eval_loop(done: int, ran: bool = False) -> dict[str, Any]:
    p = _progress(done, done, done, done)
    return {"state_dict": {}, "batch_progress": {**_both(p, p), "is_last_batch": ran or done > 0}}


def to_lightning(*, phase: str, epoch: int, batches_done: int, batches_per_epoch: float, global_step: int,
                 batches_stepped: int, stepped_this_batch: bool, manual: bool, val_batches: int,
                 val_ran: bool, accumulate: int = 1) -> dict[str, Any]:
    """Lightning's ``loops`` entry for a fit at this position (``epoch``: the epoch running, or epochs completed
    when ``phase`` is ``BETWEEN``)."""
    n = batches_done if batches_per_epoch == math.inf else int(batches_per_epoch)
    if phase == BETWEEN:
        ep = _progress(epoch, epoch, epoch, epoch)
        # ``batches_done``: the last epoch was cut short (max_steps, should_stop) after that many batches
        b, before, b_completed = ((batches_done or n) if epoch else 0), max(epoch - 1, 0) * n, None
        bts = batches_stepped
    elif phase == EPOCH_END:
        ep = _progress(epoch + 1, epoch + 1, epoch + 1, epoch)
        b, before, b_completed = n, epoch * n, None
        bts = batches_stepped
    else:
        ep = _progress(epoch + 1, epoch + 1, epoch, epoch)
        b, before = batches_done, epoch * n
        # at on_train_batch_end Lightning has not yet counted the batch completed, nor (if it stepped) stepped
        b_completed = batches_done - 1 if phase == BATCH_END else None
        bts = batches_stepped - 1 if phase == VALIDATION or stepped_this_batch else batches_stepped
    cur_done = b if b_completed is None else b_completed
    batch = {
        "total": _progress(before + b, before + b, before + b, before + cur_done),
        "current": _progress(b, b, b, cur_done),
        "is_last_batch": b > 0 and b >= n,
    }
    steps_this_epoch = math.ceil(b / max(accumulate, 1))
    auto_total, auto_cur = (0, 0) if manual else (global_step, min(steps_this_epoch, global_step))
    man = 0 if not manual else global_step
    val_done = val_batches if val_ran else 0
    val = _eval_loop(val_done, val_ran)
    if phase == BATCH_END:  # a new epoch's validation has not run yet: Lightning's total restarts at 0
        val["batch_progress"]["total"] = _progress(0, 0, 0, 0)
    fit_loop = {
        "state_dict": {},
        "epoch_loop.state_dict": {"_batches_that_stepped": max(bts, 0)},
        "epoch_loop.batch_progress": batch,
        "epoch_loop.scheduler_progress": {"total": {"ready": 0, "completed": 0}, "current": {"ready": 0, "completed": 0}},
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": _opt_counts(auto_cur, auto_total)},
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": {
            "total": {"ready": man, "completed": man}, "current": {"ready": man, "completed": man}},
        "epoch_loop.val_loop.state_dict": {},
        "epoch_loop.val_loop.batch_progress": val["batch_progress"],
        "epoch_progress": _both(ep, ep),
    }
    return {"fit_loop": fit_loop, "validate_loop": _eval_loop(0), "test_loop": _eval_loop(0),
            "predict_loop": {"state_dict": {}, "batch_progress": _both(_progress(0, 0, 0, 0), _progress(0, 0, 0, 0))}}


def from_lightning(loops: dict[str, Any], batches_per_epoch: float) -> dict[str, Any]:
    """gpulayer's resume position (epoch, batches_done, epoch_done, batches_stepped) from Lightning's counters."""
    fit = loops.get("fit_loop") or {}
    ep = (fit.get("epoch_progress") or {}).get("current") or {}
    started, processed = ep.get("started", 0), ep.get("processed", 0)
    batch = fit.get("epoch_loop.batch_progress") or {}
    bts = (fit.get("epoch_loop.state_dict") or {}).get("_batches_that_stepped", 0)
    if started == 0:
        return {"epoch": 0, "batches_done": 0, "epoch_done": False, "batches_stepped": bts}
    if processed >= started:  # the epoch's batches were all done and its end reached
        return {"epoch": processed - 1, "batches_done": 0, "epoch_done": True, "batches_stepped": bts}
    done = (batch.get("current") or {}).get("processed", 0)
    # Lightning counts the step of the batch it saved in only after the save: the resumed fit has made it
    bts += 1
    if batch.get("is_last_batch") or done >= batches_per_epoch:
        return {"epoch": started - 1, "batches_done": 0, "epoch_done": True, "batches_stepped": bts}
    return {"epoch": started - 1, "batches_done": done, "epoch_done": False, "batches_stepped": bts}
