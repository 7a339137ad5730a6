"""Training steps for memscope-bpf, marked from inside a Python program.

msMemScope counts a step for every mstx range whose message is ``"step start"``. torch_npu's
own mstx API (``torch_npu.npu.mstx.range_start``) does nothing unless torch_npu's profiler is
running, so in an ordinary training job it never reaches the mstx library and no tracer sees a
step. This module calls the exported mstx C functions (``mstxRangeStartA``/``mstxRangeEnd`` of
``libms_tools_ext.so``) directly, as C or C++ code would, and memscope-bpf's probes on them
see every step, whether it launched the job or attached to it with ``--pid``:

    import memscope_steps

    for batch in loader:
        with memscope_steps.step():
            train_one_step(batch)

or ``memscope_steps.step_start()`` ... ``memscope_steps.step_end()`` around each step. Steps
are numbered from 1 in the order they start; ``--steps``, the per-step leak report and the gap
table use them. Without an mstx library in reach every call is a no-op returning 0, so the
marks can stay in production code.
"""

import contextlib
import ctypes

STEP_MESSAGE = b"step start"
_MSTX_LIBRARY = "libms_tools_ext.so"
_functions = None
# The open step's range id; None when no step is open (a real mstx library without a tool
# attached returns 0 for every range).
_open_range = None


def _mstx():
    """(range_start, range_end) from the process (a framework linked mstx) or the library."""
    global _functions
    if _functions is None:
        _functions = False
        for name in (None, _MSTX_LIBRARY):
            try:
                lib = ctypes.CDLL(name)
                start, end = lib.mstxRangeStartA, lib.mstxRangeEnd
            except (OSError, AttributeError):
                continue
            start.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            start.restype = ctypes.c_uint64
            end.argtypes = [ctypes.c_uint64]
            end.restype = None
            _functions = (start, end)
            break
    return _functions


def available():
    """True when an mstx library was found (steps are then visible to the tracer)."""
    return bool(_mstx())


def step_start():
    """Starts a step (ending the one still open). Returns the mstx range id, 0 without mstx."""
    global _open_range
    step_end()
    fns = _mstx()
    if not fns:
        return 0
    _open_range = fns[0](STEP_MESSAGE, None)
    return _open_range


def step_end():
    """Ends the open step, if any."""
    global _open_range
    fns = _mstx()
    if fns and _open_range is not None:
        fns[1](_open_range)
    _open_range = None


@contextlib.contextmanager
def step():
    """``with step(): ...`` marks one training step."""
    range_id = step_start()
    try:
        yield range_id
    finally:
        step_end()
