"""Lightning's path ``lightning.pytorch.utilities.warnings``: the warning class users filter on."""


class PossibleUserWarning(UserWarning):
    """A warning about something that is allowed but often a mistake (a loader with few batches, no
    ``max_epochs``): users silence it with ``warnings.filterwarnings("ignore", category=PossibleUserWarning)``."""


__all__ = ["PossibleUserWarning"]
