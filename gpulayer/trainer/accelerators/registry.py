"""``AcceleratorRegistry``: accelerator names (``"cpu"``, ``"cuda"``...) mapped to a class and its init arguments."""

from __future__ import annotations

from typing import Any, Callable

from gpulayer.trainer.errors import MisconfigurationException


class _AcceleratorRegistry(dict):
    """A dict of ``name -> {"accelerator": cls, "description": str, "init_params": dict}``.

    ``register`` adds one (also usable as a class decorator), ``get`` builds an instance of one by name.
    """

    def register(self, name: str, accelerator: Callable | None = None, description: str = "",
                 override: bool = False, **init_params: Any) -> Callable:
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str, found {name}")
        if name in self and not override:
            raise MisconfigurationException(f"'{name}' is already present in the registry. HINT: Use `override=True`.")

        def add(cls: Callable) -> Callable:
            self[name] = {"accelerator": cls, "description": description, "init_params": init_params, "name": name}
            return cls

        return add(accelerator) if accelerator is not None else add

    def get(self, name: str, default: Any = None) -> Any:
        """A new instance of the accelerator registered as ``name``; ``default`` (or a KeyError) when none is."""
        if name in self:
            entry = self[name]
            return entry["accelerator"](**entry["init_params"])
        if default is not None:
            return default
        raise KeyError(f"'{name}' not found in registry. Available names: {self.available_accelerators()}")

    def remove(self, name: str) -> None:
        self.pop(name)

    def available_accelerators(self) -> set[str]:
        return set(self.keys())

    def __str__(self) -> str:
        return "Registered Accelerators: {}".format(", ".join(sorted(self.available_accelerators())))
