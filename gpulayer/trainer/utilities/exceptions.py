"""Lightning's path ``lightning.pytorch.utilities.exceptions``: the exceptions Lightning users catch."""

from gpulayer.trainer.errors import MisconfigurationException, SIGTERMException

__all__ = ["MisconfigurationException", "SIGTERMException"]
