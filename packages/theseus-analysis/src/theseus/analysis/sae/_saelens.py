"""An SAE as SAELens's two files, ``cfg.json`` and ``sae_weights.safetensors``, and back.

SAELens (6.x) loads a folder holding these two files with ``SAE.load_from_disk``. The
config names the architecture (our ``relu`` is SAELens's ``standard``, applying ``b_dec``
to the input as we do; ``topk`` carries ``k``; ``jumprelu``), the sizes ``d_in`` and
``d_sae``, and a ``metadata`` object (``sae_lens_version`` at 6.0.0 or later tells the
loader the file is in the 6.x layout; ``model_name``, ``hook_name`` and ``context_size``
say where the activations came from; ``training_architecture_details`` holds the sparsity
settings under SAELens's names). The weights are ``W_enc [d_in, d_sae]``,
``W_dec [d_sae, d_in]``, ``b_enc [d_sae]``, ``b_dec [d_in]`` and, for ``jumprelu``,
``threshold [d_sae]`` (``exp(log_threshold)``), float32; SAELens loads them strictly,
so no other tensor is written.

The safetensors bytes are written and read here (an 8-byte little-endian header length,
a JSON header of dtype, shape and byte range per tensor, then the raw little-endian
data), so the base install needs no ``safetensors`` package. Reading also takes what
SAELens's own ``save_model`` writes, folding two of its switches into the weights
exactly: ``apply_b_dec_to_input: false`` (into ``b_enc``) and, for ``topk``,
``rescale_acts_by_decoder_norm: true`` (the decoder rows made unit, their norms moved
into the encoder, as SAELens itself does when it saves an inference model).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from theseus.analysis.sae._model import SAEConfig
from theseus.errors import TheseusError

__all__ = ["SAELensError", "read_saelens", "saelens_files"]

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"
#: Our architecture names to SAELens's, and back.
_NAMES = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}
_OURS = {theirs: ours for ours, theirs in _NAMES.items()}
#: The sparsity settings of SAEConfig under the names of SAELens's training configs.
_SETTINGS = {
    "relu": {"l1": "l1_coefficient"},
    "topk": {},
    "jumprelu": {
        "l0": "l0_coefficient",
        "threshold": "jumprelu_init_threshold",
        "bandwidth": "jumprelu_bandwidth",
    },
}
#: The SAELens version whose on-disk layout the files follow (the loader converts
#: configs of older versions, which kept the metadata at the top level).
FORMAT_VERSION = "6.0.0"
#: safetensors dtypes read (widened to float32 exactly; bfloat16's bits are the top half
#: of float32's); only F32 is written.
_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}


class SAELensError(TheseusError, ValueError):
    """SAELens files that cannot be written or read (the message says what to change)."""


def saelens_files(
    params: Mapping[str, Any],
    config: SAEConfig,
    *,
    hook_name: str,
    model_name: str,
    context_size: int,
) -> dict[str, bytes]:
    """The SAE ``params`` of ``config`` as SAELens's ``cfg.json`` and ``sae_weights.safetensors``.

    Args:
        params: ``W_enc``, ``W_dec``, ``b_enc``, ``b_dec`` (and ``log_threshold`` for
            ``jumprelu``), NumPy or JAX arrays of the shapes ``config`` gives.
        config: the SAE's configuration.
        hook_name: where its activations are read (the site, e.g. ``blocks_1/mlp``).
        model_name: the model they are read from.
        context_size: the sequence length it was trained on.

    Returns:
        ``{"cfg.json": ..., "sae_weights.safetensors": ...}``; write both into one folder
        and ``sae_lens.SAE.load_from_disk(folder)`` loads it.

    Raises:
        SAELensError: a parameter is missing or has the wrong shape.

    Example:
        >>> import jax
        >>> from theseus.analysis.sae import SAEConfig, init_params, read_saelens
        >>> config = SAEConfig(d_in=4, width=8, architecture="topk", k=2)
        >>> files = saelens_files(init_params(config, jax.random.key(0)), config,
        ...                       hook_name="blocks_0/mlp", model_name="tiny", context_size=16)
        >>> sorted(files)
        ['cfg.json', 'sae_weights.safetensors']
        >>> read_saelens(files)[0] == config
        True
    """
    shapes = {
        "W_enc": (config.d_in, config.width),
        "W_dec": (config.width, config.d_in),
        "b_enc": (config.width,),
        "b_dec": (config.d_in,),
    }
    if config.architecture == "jumprelu":
        shapes["log_threshold"] = (config.width,)
    arrays = {}
    for name, shape in shapes.items():
        if name not in params:
            raise SAELensError(
                f"the {config.architecture} SAE's params lack {name!r}; expected "
                f"{', '.join(shapes)} (as init_params makes them)."
            )
        array = np.asarray(params[name]).astype(np.float32)
        if array.shape != shape:
            raise SAELensError(
                f"params[{name!r}] has shape {array.shape}; expected {shape} for "
                f"d_in={config.d_in}, width={config.width}."
            )
        arrays[name] = array
    if config.architecture == "jumprelu":
        log_threshold = arrays.pop("log_threshold").astype(np.float64)
        arrays["threshold"] = np.exp(log_threshold).astype(np.float32)
    details = {
        theirs: getattr(config, ours) for ours, theirs in _SETTINGS[config.architecture].items()
    }
    cfg: dict[str, Any] = {
        "architecture": _NAMES[config.architecture],
        "d_in": config.d_in,
        "d_sae": config.width,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
    }
    if config.architecture == "topk":
        cfg |= {"k": config.k, "rescale_acts_by_decoder_norm": False}
    cfg["metadata"] = {
        "sae_lens_version": FORMAT_VERSION,
        "sae_lens_training_version": None,
        "model_name": model_name,
        "hook_name": hook_name,
        "hook_head_index": None,
        "context_size": context_size,
        "training_architecture": _NAMES[config.architecture],
        "training_architecture_details": details,
    }
    text = json.dumps(cfg, indent=2, allow_nan=False) + "\n"
    return {CFG: text.encode("utf-8"), WEIGHTS: _pack(arrays)}


def read_saelens(files: Mapping[str, bytes]) -> tuple[SAEConfig, dict[str, np.ndarray]]:
    """The :class:`SAEConfig` and params (float32 NumPy) of SAELens's two files.

    Takes what :func:`saelens_files` writes and what SAELens's ``save_model`` writes for
    its ``standard``, ``topk`` and ``jumprelu`` SAEs (a ``log_threshold`` tensor of older
    files too); ``jumprelu``'s ``threshold`` comes back as ``log_threshold`` (a threshold
    at or below 0 gates like 0, whose log is ``-inf``).

    Args:
        files: ``{"cfg.json": bytes, "sae_weights.safetensors": bytes}``.

    Raises:
        SAELensError: a file is missing or malformed, or describes an SAE that this
            model does not compute (another architecture, an input normalization).
    """
    for name in (CFG, WEIGHTS):
        if name not in files:
            raise SAELensError(
                f"no {name} among the files {sorted(files)}; expected both {CFG} and {WEIGHTS}."
            )
    try:
        cfg = json.loads(bytes(files[CFG]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SAELensError(
            f"{CFG} is not UTF-8 JSON ({error}); expected SAELens's config object."
        ) from None
    if not isinstance(cfg, dict):
        raise SAELensError(
            f"{CFG} holds a {type(cfg).__name__}; expected a JSON object (SAELens's config)."
        )
    architecture = cfg.get("architecture")
    if architecture not in _OURS:
        raise SAELensError(
            f"{CFG} has architecture {architecture!r}; expected one of {', '.join(_OURS)} "
            "(SAELens's names for relu, topk and jumprelu)."
        )
    ours = _OURS[architecture]
    d_in, d_sae = _integer(cfg, "d_in"), _integer(cfg, "d_sae")
    fixes = {
        "normalize_activations": "fold the normalization into the weights first",
        "reshape_activations": "encode here reads flat activations [..., d_in]",
    }
    for key, fix in fixes.items():
        if cfg.get(key, "none") not in ("none", None):
            raise SAELensError(f"{CFG} has {key}={cfg[key]!r}; expected 'none' ({fix}).")
    metadata = cfg.get("metadata", {})
    if not isinstance(metadata, dict):
        raise SAELensError(
            f"{CFG}'s metadata is a {type(metadata).__name__}; expected a JSON object."
        )
    details = metadata.get("training_architecture_details") or {}
    settings: dict[str, Any] = {}
    for field, theirs in _SETTINGS[ours].items():
        value = cfg.get(theirs, details.get(theirs) if isinstance(details, dict) else None)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SAELensError(f"{CFG} has {theirs}={value!r}; expected a number.")
            settings[field] = float(value)
    if ours == "topk":
        settings["k"] = _integer(cfg, "k")
    try:
        config = SAEConfig(d_in=d_in, width=d_sae, architecture=ours, **settings)
    except ValueError as error:
        raise SAELensError(f"{CFG} describes no valid SAE: {error}") from None

    tensors = _unpack(bytes(files[WEIGHTS]))
    scale = tensors.pop("scaling_factor", None)  # older SAELens wrote ones here
    if scale is not None and not np.all(scale == 1):
        raise SAELensError(
            f"{WEIGHTS} holds a scaling_factor other than 1; expected none (fold it into W_dec first)."
        )
    if ours == "jumprelu" and "threshold" not in tensors and "log_threshold" in tensors:
        tensors["threshold"] = np.exp(tensors.pop("log_threshold").astype(np.float64)).astype(
            np.float32
        )
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    if ours == "jumprelu":
        shapes["threshold"] = (d_sae,)
    if set(tensors) != set(shapes):
        raise SAELensError(
            f"{WEIGHTS} holds {sorted(tensors)}; expected exactly {sorted(shapes)} for {architecture}."
        )
    for name, shape in shapes.items():
        if tensors[name].shape != shape:
            raise SAELensError(
                f"{WEIGHTS}'s {name} has shape {tensors[name].shape}; expected {shape} "
                f"for d_in={d_in}, d_sae={d_sae}."
            )
    params = {name: tensors[name] for name in ("W_enc", "W_dec", "b_enc", "b_dec")}
    if not _flag(cfg, "apply_b_dec_to_input", True):  # x W_enc = (x - b_dec) W_enc + b_dec W_enc
        fold = params["b_dec"].astype(np.float64) @ params["W_enc"].astype(np.float64)
        params["b_enc"] = (params["b_enc"] + fold).astype(np.float32)
    if ours == "topk" and _flag(cfg, "rescale_acts_by_decoder_norm", False):
        norms = np.maximum(np.linalg.norm(params["W_dec"], axis=1), np.float32(1e-8))
        params["W_enc"] = params["W_enc"] * norms
        params["b_enc"] = params["b_enc"] * norms
        params["W_dec"] = params["W_dec"] / norms[:, None]
    if ours == "jumprelu":
        with np.errstate(divide="ignore"):  # a threshold of 0 is log -inf
            threshold = np.maximum(tensors["threshold"].astype(np.float64), 0.0)
            params["log_threshold"] = np.log(threshold).astype(np.float32)
    return config, params


def _integer(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SAELensError(f"{CFG} has {key}={value!r}; expected a positive integer.")
    return value


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise SAELensError(f"{CFG} has {key}={value!r}; expected true or false.")
    return value


def _pack(arrays: Mapping[str, np.ndarray]) -> bytes:
    """float32 arrays as one safetensors file, tensors in name order."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(arrays):
        array = arrays[name]
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    data = b"".join(np.ascontiguousarray(arrays[name], "<f4").tobytes() for name in sorted(arrays))
    return struct.pack("<Q", len(text)) + text + data


def _unpack(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file as float32 arrays (F32, F16 or BF16 stored)."""
    if len(data) < 8:
        raise SAELensError(
            f"{WEIGHTS} has {len(data)} bytes; expected at least the 8-byte header length."
        )
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise SAELensError(
            f"{WEIGHTS}'s header length {length} runs past its {len(data)} bytes; expected a whole file."
        )
    try:
        header = json.loads(data[8 : 8 + length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SAELensError(
            f"{WEIGHTS}'s header is not UTF-8 JSON ({error}); expected a safetensors file."
        ) from None
    if not isinstance(header, dict):
        raise SAELensError(
            f"{WEIGHTS}'s header is a {type(header).__name__}; expected a JSON object."
        )
    body = memoryview(data)[8 + length :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            code = entry["dtype"]
            shape = tuple(int(n) for n in entry["shape"])
            start, stop = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SAELensError(
                f"{WEIGHTS}'s header entry for {name!r} is {entry!r}; expected dtype, shape and data_offsets."
            ) from None
        if code not in _DTYPES:
            raise SAELensError(
                f"{WEIGHTS}'s {name} is {code}; expected one of {', '.join(_DTYPES)}."
            )
        dtype = _DTYPES[code]
        if min(shape, default=0) < 0 or not 0 <= start <= stop <= len(body):
            raise SAELensError(
                f"{WEIGHTS}'s {name} spans bytes [{start}, {stop}) of {len(body)}; expected a range inside the data."
            )
        if stop - start != dtype.itemsize * math.prod(shape):
            raise SAELensError(
                f"{WEIGHTS}'s {name} spans {stop - start} bytes; expected {dtype.itemsize * math.prod(shape)} for {code} {list(shape)}."
            )
        values = np.frombuffer(body[start:stop], dtype).reshape(shape)
        if code == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = values.astype(np.float32)
    return tensors
