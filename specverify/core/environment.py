"""What a report records about where it ran and what it audited: versions, platform, a callable's name.

:func:`environment` is every report's ``environment`` section (the versions that determine a
run's numbers, the platform, torch's thread count, and the device when the audited code has
one); :func:`callable_name` is how a report names an implementation given as a Python object.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

__all__ = ["callable_name", "environment"]


def environment(device: Any = None) -> dict:
    """Versions of the pieces that determine a run's numbers, the platform, and ``device`` when given."""
    import numpy as np
    import scipy
    import torch

    from specverify.core.version import __version__

    out = {
        "specverify": __version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
    }
    if device is not None:
        out["device"] = str(device)
        out["cuda"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return out


def callable_name(obj: Any) -> str:
    """``module:QualifiedName`` of a function or class, or of an object's class (decoders, callable instances).

    ``"None"`` for None; an object without a module or name gets its ``repr``.
    """
    if obj is None:
        return "None"
    named = callable(obj) and not hasattr(obj, "generate") and hasattr(obj, "__qualname__")
    kind = obj if named else type(obj)
    module, name = getattr(kind, "__module__", None), getattr(kind, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(obj)
