"""``LambdaCallback``: a callback made of functions, one per hook, for quick experiments."""

from __future__ import annotations

from typing import Any, Callable

from gpulayer.trainer.callbacks.callback import Callback

# every notification hook of Callback (what a LambdaCallback may be given)
HOOKS = frozenset(n for n in dir(Callback) if (n.startswith("on_") or n in ("setup", "teardown"))
                  and callable(getattr(Callback, n)))


class LambdaCallback(Callback):
    """Call the given functions at their hooks, with the hook's arguments.

    >>> LambdaCallback(on_train_epoch_end=lambda trainer, pl_module: print(trainer.current_epoch))  # doctest: +ELLIPSIS
    <...LambdaCallback object at ...>

    A function given as ``None`` leaves its hook alone; a name that is not a hook is a ``TypeError``.
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(set(hooks) - HOOKS)
        if unknown:
            raise TypeError(f"LambdaCallback got {unknown}, which are not Callback hooks; the hooks are "
                            f"{sorted(HOOKS)}")
        for name, fn in hooks.items():
            if fn is not None:
                setattr(self, name, fn)
