"""Make the PyPI torchvision wheel importable next to a CPU-only torch build.

The torchvision 0.28.0 wheel on PyPI is a CUDA build. With the CPU torch, ``import torchvision``
fails with "operator torchvision::nms does not exist" because its Python side registers fake
kernels for ops whose schemas live in the (unloadable) C++ library. Declaring the two schemas
(``nms`` and ``qnms``) before torchvision is imported lets it import; its C++ ops then raise when
called, which flowgrpo never does (it uses PIL and imageio for image and video IO).

``flowgrpo_torchvision_compat.pth`` (installed with the package) puts a tiny import hook on
``sys.meta_path`` at interpreter start; the hook runs :func:`install` the moment torchvision is first
imported, so the fix is in place for the package, the tests and ``accelerate launch`` alike, and a
Python process that never imports torchvision pays nothing.
It does nothing when torchvision's own C++ library loads (a matching GPU or CPU build), when torch
or torchvision is absent, or when ``FLOWGRPO_NO_TORCHVISION_COMPAT=1`` is set.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_LIBRARY = None  # keeps the torch.library fragment alive for the life of the process


def _torchvision_ops_library_loads() -> bool:
    """True when torchvision's compiled ops library can be loaded by this torch."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # nothing to fix
    for folder in spec.submodule_search_locations:
        for name in os.listdir(folder):
            if name.startswith("_C") and name.endswith((".so", ".pyd")):
                try:
                    torch.ops.load_library(os.path.join(folder, name))
                    return True
                except (OSError, RuntimeError):
                    return False
    return False


def install() -> bool:
    """Declare torchvision's op schemas if (and only if) its C++ library cannot load.

    Returns True when the shim was installed.
    """
    global _LIBRARY
    if _LIBRARY is not None or os.environ.get("FLOWGRPO_NO_TORCHVISION_COMPAT") == "1":
        return _LIBRARY is not None
    if "torchvision" in sys.modules:
        return False  # too late to help, and it imported fine or failed already
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        return False
    import torch

    if _torchvision_ops_library_loads():
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define(
        "qnms(Tensor dets, Tensor scores, float iou_threshold, float scale, int zero_point) -> Tensor"
    )
    _LIBRARY = lib
    return True


class _ImportHook:
    """A meta-path finder that runs :func:`install` just before torchvision is first imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        _remove_hook()
        try:
            install()
        except Exception as exc:  # never let the shim itself break an import
            print(f"flowgrpo: torchvision compatibility shim skipped ({exc})", file=sys.stderr)
        return None  # let the normal finders import torchvision


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ImportHook)]


def register_import_hook() -> None:
    """Entry point of the .pth file: cheap (no torch import) and idempotent."""
    if "torchvision" in sys.modules or any(isinstance(f, _ImportHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _ImportHook())
