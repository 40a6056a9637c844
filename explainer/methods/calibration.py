"""Calibration weights of `macs_calibrated`: the file format, the model's config fingerprint, where weights are found.

A weights file is small JSON, one per model, keyed by the fingerprint of the language model's configuration (the
architecture facts that fix what the L layers are, `config_fingerprint`): weights fitted for one model are refused for
another. It states how the weights were made (data, rows, seed, masks, fit time) so a reader can judge them.

Where `find_weights` looks, in order: the weights shipped with the package (`explainer/data/calibration/
<fingerprint>.json`, the embedded model's); the user's calibration folder (`$EXPLAINER_CALIBRATION`, else
`models.cache_root()/calibration`), where `explainer calibrate` writes by default. No request names a file: the app's
visitors cannot make the server open one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from ..errors import InputError, ModelLoadError
from ..models.loading import EMBEDDED_MODEL, cache_root, embedded_folder, embedded_gguf_path
from ..runtime.memory import language_config

FORMAT = "macs-calibration/1"
SHIPPED_DIR: Traversable = resources.files("explainer").joinpath("data", "calibration")  # package data
# The configuration keys that make two models' layers the same layers; names, dtypes and versions are left out.
FINGERPRINT_KEYS = (
    "model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
    "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta", "tie_word_embeddings",
    "layer_types", "sliding_window", "head_dim",
)  # fmt: skip


def _text_config(model: torch.nn.Module | Any) -> Any:
    """The language model's configuration of a model, or of a configuration (a VLM's text part)."""
    if isinstance(model, torch.nn.Module):
        return language_config(model)
    text = model.get_text_config() if hasattr(model, "get_text_config") else model
    return text if text is not None else model


def config_fingerprint(model: torch.nn.Module | Any) -> str:
    """16 hex digits of the SHA-256 of the language model's architecture facts (`FINGERPRINT_KEYS`), from the model
    or its configuration (`model_config`): the same for both."""
    config = _text_config(model)
    facts = {key: getattr(config, key, None) for key in FINGERPRINT_KEYS}
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def user_dir() -> Path:
    """The user's calibration folder: $EXPLAINER_CALIBRATION, else `cache_root()/calibration`."""
    env = os.environ.get("EXPLAINER_CALIBRATION")
    return Path(env) if env else cache_root() / "calibration"


@dataclass
class CalibrationWeights:
    """One model's fitted layer weights and how they were made.

    Attributes:
        fingerprint: `config_fingerprint` of the model they were fitted on.
        model: the model's name when fitted (for people; the fingerprint is what is checked).
        layer_weights: L floats, one per decoder layer: the exponent of that layer's MACS factor.
        fit: how they were made: data, rows, seed, masks, objective, fit seconds, loss, date.
    """

    fingerprint: str
    model: str
    layer_weights: list[float]
    fit: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path | Traversable) -> CalibrationWeights:
        """Read a weights file.

        Raises:
            InputError: missing, not JSON, or not a weights file of this format.
        """
        try:
            data = json.loads((Path(path) if isinstance(path, str) else path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"No calibration weights file at {str(path)!r}.") from None
        except (OSError, ValueError) as e:
            raise InputError(f"Cannot read calibration weights {str(path)!r}: {e}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{str(path)!r} is not a calibration weights file ({FORMAT}).")
        weights = data.get("layer_weights")
        if not isinstance(weights, list) or not all(isinstance(w, (int, float)) for w in weights) or not weights:
            raise InputError(f"{str(path)!r} has no list of layer weights.")
        return cls(str(data.get("fingerprint")), str(data.get("model", "")), [float(w) for w in weights],
                   dict(data.get("fit") or {}))  # fmt: skip


def calibrate_command(model_name: str, images: bool = False) -> str:
    """The command that makes weights for a model (what the missing-weights message shows): on SQuAD 2.0 train, or
    with `images` (a vision-language model) on a folder of the user's images."""
    data = "--images FOLDER" if images else "--data squad_v2-train"
    return f"explainer calibrate --model {model_name} {data}"


def is_vision_model(model: torch.nn.Module | Any) -> bool:
    """Whether a model (or configuration) has a vision tower: its weights are then fitted on images."""
    config = model.config if isinstance(model, torch.nn.Module) else model
    return getattr(config, "vision_config", None) is not None


def _weights_file(fingerprint: str) -> Path | Traversable | None:
    """The weights file of a fingerprint: shipped, else in the user's folder; None if neither has one."""
    candidates = [SHIPPED_DIR.joinpath(f"{fingerprint}.json"), user_dir() / f"{fingerprint}.json"]
    return next((p for p in candidates if p.is_file()), None)


def available(model: torch.nn.Module | Any) -> bool:
    """Whether weights for this model (or configuration, `model_config`) exist, shipped or in the user's folder: what
    a front end reads to offer `macs_calibrated` (the file itself is checked when a request runs)."""
    return _weights_file(config_fingerprint(model)) is not None


def model_config(name_or_path: str | None) -> Any:
    """A model's configuration, read without its weights, for `available` before the model is loaded: a folder's or
    a Hub id's config.json; the embedded model's (None) from its converted copy, else from the GGUF's metadata (a few
    seconds).

    Raises:
        ModelLoadError: no such model, or its configuration cannot be read.
    """
    name = name_or_path or EMBEDDED_MODEL
    try:
        if name not in (EMBEDDED_MODEL, "embedded", "default"):
            return AutoConfig.from_pretrained(name, trust_remote_code=False)
        gguf = embedded_gguf_path()
        if (embedded_folder(gguf) / "config.json").is_file():
            return AutoConfig.from_pretrained(str(embedded_folder(gguf)))
        return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"Could not read the configuration of model {name!r}: {e}") from e


def find_weights(model: torch.nn.Module, path: str | Path | None = None, name: str | None = None) -> CalibrationWeights:
    """The calibration weights of `model`: from `path` if given, else shipped, else in the user's folder.

    Raises:
        InputError: no weights for this model (the message gives the `explainer calibrate` command), or the file
            given was fitted on another model, or its layer count differs from the model's.
    """
    fingerprint = config_fingerprint(model)
    name = name or getattr(language_config(model), "name_or_path", "") or "MODEL"
    layers = language_config(model).num_hidden_layers
    if path:
        found = CalibrationWeights.load(path)
        if found.fingerprint != fingerprint:
            raise InputError(
                f"The calibration weights in {str(path)!r} were fitted for another model ({found.model!r}, config "
                f"fingerprint {found.fingerprint}); this one's is {fingerprint}. Make weights for it with: "
                f"{calibrate_command(name)}"
            )
    else:
        existing = _weights_file(fingerprint)
        if existing is None:
            images = is_vision_model(model)
            data = "your images, each asked --question" if images else "SQuAD 2.0 train, downloaded once, or a file"
            raise InputError(
                f"macs_calibrated has no weights for {name} (config fingerprint {fingerprint}). Make them with: "
                f"{calibrate_command(name, images)} ({data}); "
                f"they are written to {user_dir()} (or the folder $EXPLAINER_CALIBRATION names) and found there."
            )
        found = CalibrationWeights.load(existing)
    if len(found.layer_weights) != layers:
        raise InputError(f"The calibration weights have {len(found.layer_weights)} layer weights; the model {layers}.")
    return found


def shipped_files() -> list[Traversable]:
    """The weights files that ship with the package."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted((p for p in SHIPPED_DIR.iterdir() if p.name.endswith(".json")), key=lambda p: p.name)


def training_ids(paths: list[Path | Traversable] | None = None) -> set[str]:
    """The row ids the shipped weights were fitted on, which evaluations leave out."""
    ids: set[str] = set()
    for path in paths if paths is not None else shipped_files():
        ids.update(str(i) for i in CalibrationWeights.load(path).fit.get("row_ids", []))
    return ids
