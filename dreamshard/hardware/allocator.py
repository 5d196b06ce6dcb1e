"""Torch's CPU allocator setting the fbgemm backend measures under (imports nothing heavy: a program reads
it before importing torch).

Torch's CPU allocator puts allocations of 2 MB and more on transparent huge pages when HUGE_PAGES_ENV is 1
(c10 alloc_cpu). It reads the variable once, at the process's first allocation, so the program sets it
before importing torch (`python -m pipeline` does, from params backend.fbgemm.huge_pages), and the backend
refuses to measure where the process's setting differs from its config. Building an operator first-touches
all its weights, most of a build's time; huge pages make that first touch, and so each measurement's
wall time, much shorter.
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def huge_pages_enabled(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether the process (its environment `environ`, default os.environ) has torch allocate on huge pages."""
    env = os.environ if environ is None else environ
    return env.get(HUGE_PAGES_ENV, "0").strip() == "1"


def set_huge_pages(enabled: bool, environ: MutableMapping[str, str] | None = None) -> None:
    """For a program's start, before torch is imported: the allocator setting of `enabled`."""
    env = os.environ if environ is None else environ
    env[HUGE_PAGES_ENV] = "1" if enabled else "0"
