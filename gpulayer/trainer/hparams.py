"""``save_hyperparameters`` / ``hparams`` / ``hparams_initial``: shared by modules and datamodules.

What ``save_hyperparameters`` stores, as Lightning documents it: with no argument,
every ``__init__`` argument (of this class and of the subclasses that called it);
with names, those arguments; with one dict, ``Namespace`` or other mapping, that
object; ``ignore`` drops names either way. A dataclass stores its init fields.
``hparams_initial`` is a frozen copy of what was saved; ``hparams`` may be edited.
"""

from __future__ import annotations

import copy
import inspect
import types
from contextvars import ContextVar
from dataclasses import fields, is_dataclass
from typing import Any, Sequence

from torch import nn

from gpulayer.trainer.utilities.parsing import AttributeDict, collect_hparams, to_hparams_dict
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

# Set by LightningCLI while it builds a module: its arguments as the config gave them (class paths and init args
# where the object got instances), which save_hyperparameters stores instead of the objects
given_hyperparameters: ContextVar[dict[str, Any] | None] = ContextVar("given_hyperparameters", default=None)


class HyperparametersMixin:
    """Gives a class ``save_hyperparameters()``, ``hparams`` and ``hparams_initial``."""

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None,
                             frame: types.FrameType | None = None, logger: bool = True) -> None:
        """Store the ``__init__`` arguments (all, the ones named, or one given mapping) in ``self.hparams``."""
        self._log_hyperparams = logger
        if len(args) == 1 and not isinstance(args[0], str) and not args[0]:
            return  # an empty dict / Namespace: nothing to save, as Lightning
        given = given_hyperparameters.get()
        if frame is None:
            frame = inspect.currentframe().f_back
        if given is not None:
            init_args = dict(given)
        elif not isinstance(frame, types.FrameType):
            raise AttributeError("There is no `frame` available while being required.")
        elif is_dataclass(self):
            init_args = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        else:
            init_args = collect_hparams(self, frame, classes=(HyperparametersMixin,))
        if ignore is None:
            ignore = []
        elif isinstance(ignore, str):
            ignore = [ignore]
        else:
            ignore = [name for name in ignore if isinstance(name, str)]
        init_args = {k: v for k, v in init_args.items() if k not in ignore}

        if not args:
            hp: Any = init_args
            self._hparams_name = "kwargs" if hp else None
        else:
            objects = [a for a in args if not isinstance(a, str)]
            if len(objects) == 1:
                hp = objects[0]
                # the init argument that held the object names it in the checkpoint, so it loads back into it
                self._hparams_name = next((k for k, v in init_args.items() if v is hp or _same(v, hp)), None)
            else:
                missing = [a for a in args if isinstance(a, str) and a not in init_args]
                if missing:
                    raise KeyError(f"save_hyperparameters: {missing} are not arguments of __init__ "
                                   f"(arguments: {sorted(init_args)})")
                hp = {a: init_args[a] for a in args if isinstance(a, str)}
                self._hparams_name = "kwargs"
        self._set_hparams(hp)
        for name in ignore:
            self._hparams.pop(name, None)
        for k, v in self._hparams.items():
            if isinstance(v, nn.Module):
                rank_zero_warn(f"Attribute {k!r} is an instance of `nn.Module` and is already saved during "
                               f"checkpointing. It is recommended to ignore them using "
                               f"`self.save_hyperparameters(ignore=[{k!r}])`.")
        self._hparams_initial = copy.deepcopy(self._hparams)

    def _set_hparams(self, hp: Any) -> None:
        hp = to_hparams_dict(hp)
        if isinstance(hp, dict) and isinstance(self.hparams, dict):
            self.hparams.update(hp)
        else:
            self._hparams = hp

    def remove_ignored_hparams(self, ignore_list: list[str]) -> None:
        """Drop names a parent class saved (a subclass's ``ignore``)."""
        for key in ignore_list:
            self.hparams.pop(key, None)

    @property
    def hparams(self) -> Any:
        """The saved hyperparameters; editable (``hparams_initial`` keeps the saved values)."""
        if "_hparams" not in self.__dict__:
            self.__dict__["_hparams"] = AttributeDict()
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as ``save_hyperparameters`` stored them."""
        initial = self.__dict__.get("_hparams_initial")
        return AttributeDict() if initial is None else copy.deepcopy(initial)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # tensors, arrays: equality is not a bool
        return False
