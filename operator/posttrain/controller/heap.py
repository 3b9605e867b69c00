"""The operator's heap returns large blocks to the system when they are freed.

A job's body arrives whole in every watch event (up to 256 KiB of originalToml) and is dropped as soon as the
loop has what it needs. glibc's malloc raises its mmap threshold each time such a block is freed, after
which blocks of that size come from the heap and their pages stay with the process: 1,500 jobs of the
largest TOML left 486 MiB resident where 187 MiB were in use (hack/bench_operator.py --memory-jobs, heap
walk and malloc_trim). A fixed threshold keeps every block over 128 KiB in its own mapping, unmapped on free."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
LARGE_BLOCK_BYTES = 128 * 1024


def release_large_blocks() -> bool:
    """Fix glibc's mmap threshold at LARGE_BLOCK_BYTES; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES) == 1
    if not done:
        logger.info("mallopt(M_MMAP_THRESHOLD) refused; large blocks follow the allocator's default")
    return done
