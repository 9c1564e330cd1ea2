"""Lightning's ``lightning.pytorch.utilities`` names that user code imports."""

from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.seed import seed_everything
from gpulayer.trainer.utilities.collections import apply_to_collection
from gpulayer.trainer.utilities.combined_loader import CombinedLoader
from gpulayer.trainer.utilities.enums import GradClipAlgorithmType
from gpulayer.trainer.utilities.grads import grad_norm
from gpulayer.trainer.utilities.parsing import AttributeDict, is_picklable
from gpulayer.trainer.utilities.warnings import PossibleUserWarning
from gpulayer.trainer.utilities.rank_zero import (
    rank_zero_debug, rank_zero_deprecation, rank_zero_info, rank_zero_only, rank_zero_warn,
)

__all__ = ["AttributeDict", "CombinedLoader", "GradClipAlgorithmType", "MisconfigurationException", "PossibleUserWarning", "apply_to_collection", "grad_norm", "is_picklable",
           "rank_zero_debug", "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn",
           "seed_everything"]
