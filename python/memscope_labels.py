"""Decompose labels for memscope-bpf, sent from inside a Python program.

memscope-bpf traces from outside the process, so it cannot offer msMemScope's in-process
``describe`` API. Instead a program says what it is allocating with mstx marks, which
memscope-bpf reads with its probe on ``mstxMarkA`` (see docs/output.md, "decompose"):

    import memscope_labels as ml

    with ml.label("vllm", level=ml.COMPONENT):
        with ml.label("weights", level=ml.DETAIL_1):
            load_weights()            # pool blocks owned by PTA@vllm@weights
    ml.tag_address(t.data_ptr(), "lora", level=ml.DETAIL_2)

Without mstx (no libms_tools_ext.so in the process) every call is a no-op, so the labels can
stay in production code. Trace with ``memscope-bpf --analysis=decompose -- python train.py``.
"""

import contextlib
import ctypes

COMPONENT, PROCESS, DETAIL_1, DETAIL_2 = 1, 2, 3, 4
USER_DEFINED_1, USER_DEFINED_2, USER_DEFINED_3 = 5, 6, 7

_MSTX_LIBRARY = "libms_tools_ext.so"
_mark_fn = None


def _mark(text):
    global _mark_fn
    if _mark_fn is None:
        _mark_fn = False
        # The process's own symbols first (a framework linked mstx), then the library.
        for name in (None, _MSTX_LIBRARY):
            try:
                fn = ctypes.CDLL(name).mstxMarkA
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            fn.restype = None
            _mark_fn = fn
            break
    if _mark_fn:
        _mark_fn(text.encode(), None)


def _check(label, level):
    if not 1 <= level <= 7:
        raise ValueError(f"level must be 1..7, not {level}")
    if not label or len(label.encode()) > 128 or label.startswith("@") or ";" in label:
        raise ValueError(f"bad label {label!r}: 1-128 bytes, no ';', not starting with '@'")


def push(label, level=USER_DEFINED_1):
    """Labels what this thread allocates from now on (until ``pop``)."""
    _check(label, level)
    _mark(f"memscope-label-push: level={level};label={label}")


def pop(label, level=USER_DEFINED_1):
    _check(label, level)
    _mark(f"memscope-label-pop: level={level};label={label}")


@contextlib.contextmanager
def label(name, level=USER_DEFINED_1):
    """``with label("weights", DETAIL_1): ...`` labels the allocations made inside."""
    push(name, level)
    try:
        yield
    finally:
        pop(name, level)


def tag_address(ptr, name, level=DETAIL_1):
    """Relabels the live PTA block that holds address ``ptr``."""
    _check(name, level)
    _mark(f"memscope-label-addr: ptr=0x{int(ptr):x};level={level};label={name}")
