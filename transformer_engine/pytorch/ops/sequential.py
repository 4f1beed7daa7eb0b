"""Sequential: a container that runs its modules in order and fuses adjacent fusible
operations."""
from __future__ import annotations

from typing import Iterator, List, Union

import torch

from .fuser import OperationFuser
from .op import PREFIX, FusibleOperation


class Sequential(torch.nn.Module):
    """Runs modules in order, like ``torch.nn.Sequential``; each run of adjacent fusible
    operations goes through one fuser, which fuses what it can (a GEMM with its bias, a norm
    with the GEMM after it). Modules are registered under the keys ``"0"``, ``"1"``, ..., so
    ``state_dict`` keys are those of ``torch.nn.Sequential``.

    Parameters
    ----------
    *args : FusibleOperation or torch.nn.Module
        The modules, in order; a single dict maps names to modules instead.
    """

    def __init__(self, *args: Union[FusibleOperation, torch.nn.Module]) -> None:
        super().__init__()
        self._groups = None
        if len(args) == 1 and isinstance(args[0], dict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for module in args:
                self.append(module)

    def add_module(self, name: str, module) -> None:
        """Register a module and forget the fusion plan.

        Parameters
        ----------
        name : str
            The module's key.
        module : torch.nn.Module
            The module.
        """
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{PREFIX}.Sequential: module {name!r} is a {type(module).__name__}; "
                            "expected a torch.nn.Module")
        self._groups = None
        super().add_module(name, module)

    def append(self, module: torch.nn.Module) -> "Sequential":
        """Add a module at the end.

        Parameters
        ----------
        module : torch.nn.Module
            The module.
        """
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "Sequential":
        """Add modules at the end.

        Parameters
        ----------
        modules : iterable of torch.nn.Module
            The modules, in order.
        """
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: torch.nn.Module) -> "Sequential":
        """Insert a module before position ``index``.

        Parameters
        ----------
        index : int
            The position (negative counts from the end).
        module : torch.nn.Module
            The module.
        """
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._renumber(modules)
        return self

    def pop(self, index: int) -> torch.nn.Module:
        """Remove and return the module at position ``index``.

        Parameters
        ----------
        index : int
            The position (negative counts from the end).
        """
        modules = list(self._modules.values())
        module = modules.pop(index)
        self._renumber(modules)
        return module

    def __setitem__(self, index: int, module: torch.nn.Module) -> None:
        modules = list(self._modules.values())
        modules[index] = module
        self._renumber(modules)

    def __delitem__(self, index) -> None:
        modules = list(self._modules.values())
        del modules[index]
        self._renumber(modules)

    def _renumber(self, modules) -> None:
        for key in list(self._modules):
            del self._modules[key]
        for module in modules:
            self.append(module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx):
        modules = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(*modules[idx])
        return modules[idx]

    def _module_groups(self) -> List:
        if self._groups is None:
            groups, run = [], []
            for m in self._modules.values():
                if isinstance(m, FusibleOperation):
                    run.append(m)
                    continue
                if run:
                    groups.append(OperationFuser(run))
                    run = []
                groups.append(m)
            if run:
                groups.append(OperationFuser(run))
            self._groups = groups
        return self._groups

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor):  # noqa: A002
        """Run the modules in order.

        Parameters
        ----------
        input : torch.Tensor
            The input of the first module.
        *extra_inputs : torch.Tensor
            The extra inputs of the fusible operations (for example :class:`AddExtraInput`),
            consumed in order.

        Returns
        -------
        torch.Tensor or tuple of torch.Tensor
            The output, followed by the extra outputs (:class:`MakeExtraOutput`) when there
            are any.
        """
        groups = self._module_groups()
        wanted = sum(g.num_extra_inputs for g in groups if isinstance(g, OperationFuser))
        if len(extra_inputs) != wanted:
            raise ValueError(f"{PREFIX}.Sequential: {len(extra_inputs)} extra input(s) given; its "
                             f"operations take {wanted}")
        x, remaining, extra_outputs = input, list(extra_inputs), []
        for group in groups:
            if isinstance(group, OperationFuser):
                n = group.num_extra_inputs
                mine, remaining = remaining[:n], remaining[n:]
                out = group(x, *mine)
                if isinstance(out, tuple):
                    x = out[0]
                    extra_outputs.extend(out[1:])
                else:
                    x = out
            else:
                x = group(x)
        return (x,) + tuple(extra_outputs) if extra_outputs else x
