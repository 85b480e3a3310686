"""Where an audit runs and in which dtype it hands probabilities over: argument checks.

Every audit takes ``device=`` (``"cpu"``, ``"cuda:0"``, a ``torch.device``; None means
the CPU) and ``dtype=`` (the floating dtype of the probability tensors handed to the
implementation: float32, bfloat16 or float16; None means float32).  The harnesses build
the implementation's inputs on that device, give it a generator of that device, and
copy its outputs back once per round; the statistics always run on the CPU in float64.

With ``device="cpu"`` and ``dtype=float32`` every audit is bit-identical to one without
the arguments.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument

__all__ = [
    "PROB_DTYPES",
    "check_device",
    "check_prob_dtype",
    "device_extra",
    "device_keywords",
    "dtype_name",
    "is_default",
]

#: Probability dtypes an implementation may be handed, by the names the CLI accepts.
PROB_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def check_device(name: str, device) -> torch.device:
    """A usable ``torch.device`` from ``device`` (None: the CPU).

    Raises
    ------
    InvalidArgument
        naming ``name`` and the value when it is not a device torch knows, or that device
        is not available here (e.g. ``"cuda:0"`` without CUDA, ``"cuda:7"`` on a 1-GPU host).
    """
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise InvalidArgument(f"{name} must be a str or torch.device such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must name a torch device such as 'cpu' or 'cuda:0', got {device!r}") from exc
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"{name} = {device!r} is not available: torch.cuda.is_available() is False")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    try:
        torch.empty(1, device=dev)
        torch.Generator(device=dev)
    except Exception as exc:  # any backend error: the device cannot hold tensors or generators
        raise InvalidArgument(f"{name} = {device!r} is not usable here: {type(exc).__name__}: {exc}") from exc
    return dev


def check_prob_dtype(name: str, dtype) -> torch.dtype:
    """The probability dtype from ``dtype`` (None: float32); a torch dtype or one of its names.

    Accepts ``torch.float32``/``bfloat16``/``float16`` and the names ``"float32"``,
    ``"bfloat16"``, ``"float16"`` (also ``"fp32"``, ``"bf16"``, ``"fp16"``).
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in PROB_DTYPES.values():
        return dtype
    if isinstance(dtype, str):
        key = _ALIASES.get(dtype.lower(), dtype.lower().removeprefix("torch."))
        if key in PROB_DTYPES:
            return PROB_DTYPES[key]
    raise InvalidArgument(f"{name} must be one of {sorted(PROB_DTYPES)} (or the torch dtype), got {dtype!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """``"float32"`` for ``torch.float32`` etc."""
    return str(dtype).removeprefix("torch.")


def is_default(device: torch.device, dtype: torch.dtype) -> bool:
    """True for the CPU in float32: what an audit without ``device=``/``dtype=`` does."""
    return device.type == "cpu" and dtype == torch.float32


def device_extra(device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """What a report records in ``extra``: nothing for the default, else ``device`` and ``dtype``."""
    return {} if is_default(device, dtype) else {"device": str(device), "dtype": dtype_name(dtype)}


def device_keywords(device: torch.device, dtype: torch.dtype) -> dict[str, str | None]:
    """Keywords for a repro snippet (None values are left out of it)."""
    return {
        "device": None if device.type == "cpu" else str(device),
        "dtype": None if dtype == torch.float32 else dtype_name(dtype),
    }
