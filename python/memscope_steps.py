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

or ``memscope_steps.step_start()`` ... ``memscope_steps.step_end()`` around each step.

On a CUDA host without mstx the steps are NVTX ranges instead: ``nvtxRangePushA("step
start")``/``nvtxRangePop()`` of ``libnvToolsExt.so.1`` (found on the loader's path or in the
``nvidia-nvtx-cu12`` wheel's ``nvidia/nvtx/lib``), which memscope-bpf traces as it does mstx.
(``torch.cuda.nvtx`` cannot stand in: torch's NVTX is header-only and calls nothing a probe
can see unless a profiler is injected.) Steps
are numbered from 1 in the order they start; ``--steps``, the per-step leak report and the gap
table use them. Without an mstx library in reach every call is a no-op returning 0, so the
marks can stay in production code.
"""

import contextlib
import ctypes
import os
import sys

STEP_MESSAGE = b"step start"
_MSTX_LIBRARY = "libms_tools_ext.so"
_NVTX_LIBRARY = "libnvToolsExt.so.1"
_functions = None
# The open step's range id; None when no step is open (a real mstx library without a tool
# attached returns 0 for every range).
_open_range = None


def _mstx():
    """(range_start, range_end) from the process (a framework linked mstx) or the library,
    else NVTX's push and pop standing in for them."""
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
        if not _functions:
            _functions = _nvtx() or False
    return _functions


def _nvtx():
    """NVTX's (push, pop) as (range_start, range_end), or None."""
    wheel = [os.path.join(p, "nvidia", "nvtx", "lib", _NVTX_LIBRARY) for p in sys.path if p]
    for name in [_NVTX_LIBRARY] + [w for w in wheel if os.path.isfile(w)]:
        try:
            lib = ctypes.CDLL(name)
            push, pop = lib.nvtxRangePushA, lib.nvtxRangePop
        except (OSError, AttributeError):
            continue
        push.argtypes = [ctypes.c_char_p]
        push.restype = ctypes.c_int
        pop.argtypes = []
        pop.restype = ctypes.c_int

        # Push and pop return the nesting level (or -2 with no tool attached): not an id, so
        # the open step is marked with 1.
        def start(message, _stream):
            push(message)
            return 1

        def end(_range):
            pop()

        return (start, end)
    return None


def available():
    """True when an mstx or NVTX library was found (steps are then visible to the tracer)."""
    return bool(_mstx())


def backend():
    """"mstx", "nvtx", or None when neither library was found."""
    fns = _mstx()
    if not fns:
        return None
    return "nvtx" if fns[0].__name__ == "start" else "mstx"


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
