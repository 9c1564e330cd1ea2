"""Files the runner copies into the gpulayer side's temporary tree (this package marker is not copied)."""
