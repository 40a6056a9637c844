"""What the app sets up for its own process before it serves, so that a crowd's decode steps keep their cores:

- torch's CPU threads from the container's quota, not the host's cores (`explainer.runtime.threads`);
- visitors' text requests share decode steps (`explainer.batching`; EXPLAINER_DECODE=solo: one at a time);
- glibc keeps the memory the process frees (`explainer.runtime.malloc.keep_freed_memory`; docs/memory.md);
- Gradio's queue summarises its event log for its monitoring page once in 1,000 events instead of after every
  event: it builds a pandas table of every event since the start each time, so in a long demo each click cost more
  than the last (`GRADIO_ANALYTICS_CACHE_FREQUENCY`; a value set in the environment wins).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from explainer.decoding import enable_batching
from explainer.runtime.malloc import keep_freed_memory
from explainer.runtime.threads import configure_threads

ANALYTICS_EVERY = "1000"  # events between two summaries of Gradio's event log


@dataclass(frozen=True)
class Process:
    threads: int  # torch's intra-op threads
    keeps_freed_memory: bool  # whether glibc was told to keep it (glibc on Linux only)


def prepare() -> Process:
    """Call at import of the app, before the server's threads start and before the page's queue is made."""
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", ANALYTICS_EVERY)
    enable_batching()  # `decoding.choose_path` sends text requests to the batched decode
    return Process(threads=configure_threads(), keeps_freed_memory=keep_freed_memory())
