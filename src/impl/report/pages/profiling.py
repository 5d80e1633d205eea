"""Emptied: its pages are two-file pages now (memory_profiling, gradient_checkpointing, training_step); the
next commit drops it from build.PAGE_MODULES and deletes it."""
from __future__ import annotations


def pages(ctx) -> list:
    return []
