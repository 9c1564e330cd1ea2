"""The batch-size search itself, over a ``trial(size)`` that raises when a size does not fit in memory.

``power``: double from ``init_val`` while trials succeed; the first failure halves back to the last
size that worked. ``binsearch``: double the same way, then bisect between the last success and the
failure, and take ``margin`` off the result as a safety buffer. Both stop at ``max_trials`` trials,
at ``max_val``, or when the size reaches the dataset's length (a bigger batch tests nothing new).
"""

from __future__ import annotations

from typing import Callable

from gpulayer.trainer.utilities.rank_zero import rank_zero_info


def search_batch_size(trial: Callable[[int], None], dataset_length: Callable[[], float], mode: str, init_val: int,
                      max_trials: int, margin: float, max_val: int,
                      is_oom: Callable[[BaseException], bool]) -> int:
    size = min(init_val, max_val)
    good = 0  # the largest size that ran (0: none yet)
    bad: int | None = None  # the smallest size that ran out of memory
    for _ in range(max_trials):
        try:
            trial(size)
        except RuntimeError as err:
            if not is_oom(err):
                raise
            bad = size
            if mode == "power" or good == 0:
                if good:  # the size before this one worked: keep it
                    rank_zero_info(f"Batch size {size} failed, trying batch size {good}")
                    return good
                size = max(1, size // 2)
                rank_zero_info(f"Batch size {bad} failed, trying batch size {size}")
                if bad == 1:
                    raise
                continue
        else:
            good = size
            if size >= dataset_length():
                rank_zero_info(f"The batch size {size} is greater or equal than the length of your dataset.")
                break
            if size >= max_val:
                rank_zero_info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
                break
        if bad is None:
            following = min(size * 2, max_val)
        elif bad - good <= 1:
            break
        else:
            following = (good + bad) // 2
        rank_zero_info(f"Batch size {size} {'succeeded' if size == good else 'failed'}, trying batch size {following}")
        size = following
    if mode == "binsearch" and margin > 0 and good:
        reduced = max(1, int(good * (1 - margin)))
        if reduced != good:
            rank_zero_info(f"Applying margin of {margin:.1%}, reducing batch size from {good} to {reduced}")
        return reduced
    return good or size
