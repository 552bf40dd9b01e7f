"""What the server says of the one model it serves: its name, file, size, fingerprint and GGUF facts.

Read once from the loaded Llama when the app starts, for the routes that describe the model (Ollama's
`/api/tags`, `/api/show` and `/api/ps`), which then need nothing of llama.cpp.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import llama_cpp

__all__ = ["ServedModel"]

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<fraction>(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")
_FTYPE_PREFIXES = ("LLAMA_FTYPE_MOSTLY_", "LLAMA_FTYPE_ALL_")
# llama.cpp's file types by number (general.file_type), named as quantizations are: Q4_K_M, F16, ...
_FILE_TYPES = {
    getattr(llama_cpp, name): name.removeprefix("LLAMA_FTYPE_MOSTLY_").removeprefix("LLAMA_FTYPE_ALL_")
    for name in dir(llama_cpp)
    if name.startswith(_FTYPE_PREFIXES)
}


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The served model, as the routes that describe it need it (`on_gpu`: its layers offloaded;
    `reads_images`: served with its projector)."""

    name: str
    path: Path
    size: int
    modified_at: datetime
    fingerprint: str
    n_ctx: int
    n_params: int
    on_gpu: bool = False
    reads_images: bool = False
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, llm: llama_cpp.Llama, name: str, fingerprint: str, *, reads_images: bool = False
    ) -> ServedModel:
        """What `llm` (served as `name`, its states under `fingerprint`, with its projector where
        `reads_images`) is."""
        path = Path(llm.model_path)
        size, modified = 0, datetime.now(timezone.utc)
        with contextlib.suppress(OSError):
            stat = path.stat()
            size, modified = stat.st_size, datetime.fromtimestamp(stat.st_mtime, timezone.utc)
        return cls(
            name=name,
            path=path,
            size=size,
            modified_at=modified,
            fingerprint=fingerprint,
            n_ctx=int(llm.n_ctx()),
            n_params=int(llama_cpp.llama_model_n_params(llm.model)),
            on_gpu=bool(llama_cpp.llama_supports_gpu_offload()) and llm.model_params.n_gpu_layers != 0,
            reads_images=reads_images,
            metadata={str(k): str(v) for k, v in llm.metadata.items()},
        )

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "")

    @property
    def chat_template(self) -> str:
        return self.metadata.get("tokenizer.chat_template", "")

    @property
    def quantization(self) -> str:
        """The file's quantization as llama.cpp names it (Q4_K_M, F16, ...), or "" if unknown."""
        try:
            return _FILE_TYPES.get(int(self.metadata.get("general.file_type", "")), "")
        except ValueError:
            return ""

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama writes it: 268.10M, 8.0B."""
        if self.n_params >= 1_000_000_000:
            return f"{self.n_params / 1e9:.1f}B"
        if self.n_params >= 1_000_000:
            return f"{self.n_params / 1e6:.2f}M"
        return str(self.n_params)

    def typed_metadata(self) -> dict[str, Any]:
        """The GGUF's metadata with numbers as numbers (llama-cpp-python gives every value as text);
        the chat template left out (it is told apart)."""
        typed: dict[str, Any] = {}
        for key, value in self.metadata.items():
            if key == "tokenizer.chat_template" or key.startswith("tokenizer.chat_template."):
                continue
            typed[key] = value if key.endswith("version") else _number(value)
        typed["general.parameter_count"] = self.n_params
        return typed


def _number(value: str) -> Any:
    """`value` as a number where it is written as a JSON number (an int unless it has a fraction or
    an exponent, a float where finite), else the text."""
    found = _JSON_NUMBER.fullmatch(value)
    if found is None:
        return value
    if not found["fraction"]:
        return int(value)
    number = float(value)
    return number if math.isfinite(number) else value
