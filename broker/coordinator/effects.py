"""The effect both coordinator cores emit to answer a request (sans-IO: no asyncio here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reply:
    """Answer the waiting request `ref` with `result`."""

    ref: Any
    result: Any
