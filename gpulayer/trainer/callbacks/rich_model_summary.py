"""``RichModelSummary``: the model summary drawn as a ``rich`` table (``pip install rich``).

The Trainer picks it instead of ``ModelSummary`` when the progress bar is a ``RichProgressBar``. ``rich`` is
imported when the table is drawn, so ``import gpulayer.trainer`` does not load it.
"""

from __future__ import annotations

from typing import Any

from gpulayer.trainer.callbacks.model_summary import ModelSummary
from gpulayer.trainer.utilities.imports import _RICH_AVAILABLE


class RichModelSummary(ModelSummary):
    """``ModelSummary`` whose ``summarize`` prints a rich table, then a grid of the totals.

    ``summarize_kwargs`` may hold ``header_style`` (default ``"bold magenta"``).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not _RICH_AVAILABLE:
            raise ModuleNotFoundError(
                "`RichModelSummary` requires `rich` to be installed. Install it by running `pip install -U rich`.")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        import rich
        from rich.table import Table

        from gpulayer.trainer.utilities.model_summary import get_formatted_model_size, get_human_readable_count

        console = rich.get_console()
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        right = {"Params", "Params per Device", "FLOPs", "In sizes", "Out sizes"}
        for header, _ in summary_data:
            style = {" ": "dim", "In sizes": "white", "Out sizes": "white"}.get(header)
            table.add_column(header, justify="right" if header in right else "left", style=style,
                             no_wrap=header == "Name")
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console.print(table)

        counts = [get_human_readable_count(int(n)) for n in
                  (trainable_parameters, total_parameters - trainable_parameters, total_parameters)]
        grid = Table.grid(expand=True)
        grid.add_column()
        grid.add_column()
        for label, value in [("Trainable params", f"{counts[0]:<10}"), ("Non-trainable params", f"{counts[1]:<10}"),
                             ("Total params", f"{counts[2]:<10}"),
                             ("Total estimated model params size (MB)", f"{get_formatted_model_size(model_size):<10}"),
                             ("Modules in train mode", total_training_modes["train"]),
                             ("Modules in eval mode", total_training_modes["eval"]),
                             ("Total FLOPs", get_human_readable_count(total_flops))]:
            grid.add_row(f"[bold]{label}[/]: {value}")
        console.print(grid)
