"""glibc's malloc told to keep the memory the process frees (the app calls `keep_freed_memory` once, at start).

By default glibc gives the threads that allocate their own arenas (up to 8 per core) and hands freed memory back to
the system: a thread arena's heap shrinks or is unmapped once its top is free, the main heap is trimmed above 128 KiB.
The app's threads come and go (the batcher's thread ends when its last row does, each request decodes its prompt in a
worker thread), and every decode step allocates and frees its tensors, so the next allocation touches fresh pages:
each one a page fault, the kernel zeroing it.

Measured on the 2-core CPU (native bf16; the app, 4 visitors at once, `scripts/load_test.py --crowd 1,4`): 35 to
40 thousand page faults a second in the crowd's rounds, a quarter of both cores in the kernel, and the batch's decode
steps twice as slow (about 195 ms instead of 95). With one arena, a 512 MiB trim threshold and a 64 MiB top pad the
faults stop once the process has served its first crowds, and the rounds no longer take twice as long at random.

The cost: up to `TRIM_BYTES` of freed memory (plus `TOP_PAD_BYTES`) stays with the process instead of going back to
the system, and the threads share one arena's lock (they allocate little next to the time their tensors' work takes).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_ARENA_MAX = -1, -2, -8  # mallopt's parameters (glibc's malloc.h)
TRIM_BYTES = 512 << 20  # freed memory kept at the top of the heap before any goes back to the system
TOP_PAD_BYTES = 64 << 20  # the heap grows by this much more than each request needs
ENV = "EXPLAINER_MALLOC"  # "system": leave glibc's defaults


def keep_freed_memory() -> bool:
    """One malloc arena for all threads and freed memory kept for the next allocations (see the module docstring).

    Call it early, before the threads that serve requests start: a thread keeps the arena it had. Returns whether the
    settings were applied: not where the C library is not glibc (macOS, Windows, Alpine's musl), nor with
    EXPLAINER_MALLOC=system.
    """
    if os.environ.get(ENV, "").strip().lower() == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = all(mallopt(p, v) == 1 for p, v in ((M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, TRIM_BYTES),
                                                   (M_TOP_PAD, TOP_PAD_BYTES)))  # fmt: skip
    if not applied:
        log.warning("glibc refused a malloc setting; freed memory goes back to the system as by default")
    return applied
