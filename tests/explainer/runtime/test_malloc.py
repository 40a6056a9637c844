"""glibc's malloc settings for the app (`runtime/malloc.py`): one arena for every thread, checked in a fresh process
through glibc's own report (`malloc_info`), and left alone where they do not apply."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from explainer.runtime import malloc

ROOT = Path(__file__).resolve().parents[3]

# Four threads allocate and free tensors; then glibc reports its arenas (one <heap> element each).
ARENAS = """
import ctypes, sys, tempfile, threading
import torch
from explainer.runtime.malloc import keep_freed_memory
applied = keep_freed_memory()
def work():
    for _ in range(20):
        torch.ones(1 << 20).sum()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile("r", suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(applied, f.read().count("<heap nr="))
"""


def _arenas(**env) -> tuple[str, int]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    out = subprocess.run([sys.executable, "-c", ARENAS], env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    applied, heaps = out.stdout.split()
    return applied, int(heaps)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_all_threads_share_one_arena_and_the_default_gives_them_their_own():
    assert _arenas() == ("True", 1)
    applied, heaps = _arenas(**{malloc.ENV: "system"})
    assert applied == "False" and heaps > 1  # glibc's default: the threads got arenas of their own


def test_it_applies_only_to_glibc(monkeypatch):
    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert malloc.keep_freed_memory() is False
    monkeypatch.setattr(malloc.platform, "system", lambda: "Darwin")
    assert malloc.keep_freed_memory() is False
