"""Lightning's ``utilities.model_summary``: the layer table a fit prints, and its number formats."""

from gpulayer.trainer.utilities.model_summary.model_summary import (
    LayerSummary, ModelSummary, get_formatted_model_size, get_human_readable_count, parse_batch_shape, summarize,
)

__all__ = ["LayerSummary", "ModelSummary", "get_formatted_model_size", "get_human_readable_count",
           "parse_batch_shape", "summarize"]
