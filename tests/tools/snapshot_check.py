"""Checks memscope-bpf's memory snapshot against the framework's own (probe-user/tests/snapshot.rs).

    python snapshot_check.py compare OURS THEIRS SCRIPT [--c-frames]
        the same segments (address, total_size), the same blocks in each (address, size, state),
        the same alloc/free actions in the same order (action, address), and, for each action,
        the same lines of SCRIPT in the Python frames (innermost first); with --c-frames, each
        alloc and free whose C stack was not cut short also has C frames with file:line (the
        symbolizer's), one of them in torch_npu's own frames where its unwinder found any
        (2.14.0's says `<unwind unsupported>`); exit 1 with the differences otherwise
    python snapshot_check.py render OURS OUTDIR
        torch's own torch/cuda/_memory_viz.py draws OURS: trace_plot and segment_plot (HTML
        pages), memory, segments and compare (flame graph input; the flame graph itself needs
        flamegraph.pl from the network, so the folded text is kept), segsum and trace (text)
    python snapshot_check.py pages OUTDIR VIZDIR OURS [THEIRS]
        self-contained memory_viz pages for headless Chromium, one per view and snapshot
        (OUTDIR/ours_VIEW.html, theirs_VIEW.html): VIZDIR holds PyTorch's
        torch/utils/viz/MemoryViz.js and d3.min.js (d3 5, the version it imports), both
        inlined (the pages torch writes load them from a CDN). A snapshot's own bytes are
        embedded, read by the viewer's own unpickler as a file dropped on the memory_viz page
        is; and the pages trace_plot and segment_plot wrote (OUTDIR/*_plot.html, from render)
        as OUTDIR/torch_*_plot.html

Only the torch wheel of the interpreter running it is used.
"""

import os
import pickle
import sys

ACTIONS = ("segment_alloc", "alloc", "free_requested", "free_completed", "segment_free")


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def script_lines(frames, script):
    return [(f["line"], f["name"]) for f in frames if f["filename"] == script]


def segments(snap):
    return sorted(
        (s["device"], s["address"], s["total_size"],
         tuple((b["address"], b["size"], b["state"]) for b in s["blocks"]))
        for s in snap["segments"]
    )


def actions(snap, script):
    out = []
    for device, trace in enumerate(snap["device_traces"]):
        for e in trace:
            if e["action"] in ACTIONS:
                out.append((device, e["action"], e["addr"], tuple(script_lines(e["frames"], script))))
    return out


def c_frames(frames):
    return {(os.path.basename(f["filename"]), f["line"], f["name"])
            for f in frames if f["line"] > 0 and not f["filename"].endswith(".py")}


def compare(ours_path, theirs_path, script, with_c_frames):
    ours, theirs = load(ours_path), load(theirs_path)
    bad = []
    if segments(ours) != segments(theirs):
        bad.append(f"segments differ:\n  ours   {segments(ours)}\n  theirs {segments(theirs)}")
    a, b = actions(ours, script), actions(theirs, script)
    if [x[:3] for x in a] != [x[:3] for x in b]:
        width = max(len(a), len(b))
        pad = lambda xs: [x[:3] for x in xs] + [None] * (width - len(xs))  # noqa: E731
        bad.append("actions differ (device, action, address):\n" + "\n".join(
            f"  {'  ' if x == y else '! '}ours {x}  theirs {y}" for x, y in zip(pad(a), pad(b))))
    else:
        for x, y in zip(a, b):
            if x[3] != y[3]:
                bad.append(f"{x[1]} 0x{x[2]:x}: Python frames in {script}: ours {x[3]}, theirs {y[3]}")
    if with_c_frames and not bad:
        ours_e = [e for t in ours["device_traces"] for e in t]
        ours_c = [(e["action"], e["addr"], c_frames(e["frames"])) for e in ours_e]
        theirs_c = [c_frames(e["frames"]) for t in theirs["device_traces"] for e in t]
        cut = {i for i, e in enumerate(ours_e) if any(f["name"] == "[truncated]" for f in e["frames"])}
        checked = 0
        for i, ((action, addr, o), t) in enumerate(zip(ours_c, theirs_c)):
            # A stack the tracer's copy cut short may end before any frame with a line.
            if action not in ("alloc", "free_requested") or i in cut:
                continue
            if not o:
                bad.append(f"{action} 0x{addr:x}: no C frame with file:line in ours")
            # torch_npu's own unwinder fails on some releases (`<unwind unsupported>`): no
            # ground truth there.
            if not t:
                continue
            checked += 1
            if not o & t:
                bad.append(f"{action} 0x{addr:x}: no C frame with file:line in common: ours {sorted(o)}, theirs {sorted(t)}")
        if checked == 0 and any(theirs_c):
            bad.append("every C stack was cut short: no C frame compared")
        print(f"C frames with file:line in common with torch_npu's: "
              f"{sum(len(o & t) for (_, _, o), t in zip(ours_c, theirs_c))} "
              f"({checked} actions compared, {len(cut)} with their stack cut short)")
    # The live blocks' own frames too.
    theirs_frames = {b["address"]: script_lines(b["frames"], script)
                     for s in theirs["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    for s in ours["segments"]:
        for blk in s["blocks"]:
            if blk["state"] == "active_allocated" and theirs_frames.get(blk["address"]) != script_lines(blk["frames"], script):
                bad.append(f"block 0x{blk['address']:x}: ours {script_lines(blk['frames'], script)}, theirs {theirs_frames.get(blk['address'])}")
    n_blocks = sum(len(s["blocks"]) for s in ours["segments"])
    n_live = sum(b["state"] == "active_allocated" for s in ours["segments"] for b in s["blocks"])
    print(f"segments {len(ours['segments'])}, blocks {n_blocks} ({n_live} live), actions {len(a)}; "
          f"their actions {len(b)}; with script frames {sum(bool(x[3]) for x in a)}")
    if bad:
        print("\n".join(bad))
        sys.exit(1)


def render(ours_path, outdir):
    from torch.cuda import _memory_viz as mv
    snap = load(ours_path)
    folded = lambda text: text  # noqa: E731  (flamegraph.pl would be downloaded)
    outputs = {
        "trace_plot.html": mv.trace_plot(snap),
        "segment_plot.html": mv.segment_plot(snap),
        "memory.folded": mv.memory(snap, format_flamegraph=folded),
        "segments.folded": mv.segments(snap, format_flamegraph=folded),
        "compare.folded": mv.compare(snap["segments"], [], format_flamegraph=folded),
        "segsum.txt": mv.segsum(snap),
        "trace.txt": mv.trace(snap),
    }
    os.makedirs(outdir, exist_ok=True)
    for name, text in outputs.items():
        if not text:
            print(f"{name}: empty")
            sys.exit(1)
        with open(os.path.join(outdir, name), "w") as f:
            f.write(text)
    print(" ".join(f"{k}={len(v)}" for k, v in outputs.items()))


VIEWS = {
    "timeline": "Active Memory Timeline",
    "state": "Allocator State History",
    "segments": "Active Cached Segment Timeline",
}
CDN_IMPORT = 'import {add_local_files} from "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"'


def viewer(vizdir):
    """MemoryViz.js as a module with no import (d3 comes from the inlined bundle)."""
    import re
    with open(os.path.join(vizdir, "MemoryViz.js")) as f:
        js = f.read()
    js, n = re.subn(r'^import .* from "https://cdn\.skypack\.dev/[^"]+";\n', "", js, flags=re.M)
    if n != 5:
        sys.exit(f"MemoryViz.js: expected its 5 d3 imports, found {n}")
    js = js.replace("export function", "function")
    header = "const d3 = window.d3;\nconst {axisLeft, scaleLinear, zoom, zoomIdentity, brushX} = d3;\n"
    with open(os.path.join(vizdir, "d3.min.js")) as f:
        d3 = f.read()
    return d3, header + js


def page(d3, js, body):
    return (f"<!DOCTYPE html>\n<html>\n<head>\n<script>\n{d3}\n</script>\n</head>\n<body>\n"
            f'<script type="module">\n{js}\n{body}\n</script>\n</body>\n</html>\n')


def pages(outdir, vizdir, snapshots):
    import base64
    import json
    d3, js = viewer(vizdir)
    written = []
    for who, pickle_path in zip(("ours", "theirs"), snapshots):
        with open(pickle_path, "rb") as f:
            raw = f.read()
        raw += b"\x00" * (3 - len(raw) % 3)
        files = json.dumps([{"name": os.path.basename(pickle_path), "base64": base64.b64encode(raw).decode()}])
        for name, kind in VIEWS.items():
            path = os.path.join(outdir, f"{who}_{name}.html")
            with open(path, "w") as f:
                f.write(page(d3, js, f"const local_files = {files};\nadd_local_files(local_files, {kind!r});"))
            written.append(path)
    for name in ("trace_plot", "segment_plot"):
        with open(os.path.join(outdir, f"{name}.html")) as f:
            html = f.read()
        start, end = html.index('<script type="module">'), html.index("</script>")
        module = html[start + len('<script type="module">'):end]
        if CDN_IMPORT not in module:
            sys.exit(f"{name}.html: the viewer's import line changed")
        path = os.path.join(outdir, f"torch_{name}.html")
        with open(path, "w") as f:
            f.write(page(d3, js, module.replace(CDN_IMPORT, "")))
        written.append(path)
    print("\n".join(written))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "compare":
        compare(sys.argv[2], sys.argv[3], sys.argv[4], "--c-frames" in sys.argv[5:])
    elif cmd == "render":
        render(sys.argv[2], sys.argv[3])
    elif cmd == "pages":
        pages(sys.argv[2], sys.argv[3], sys.argv[4:6])
    else:
        sys.exit(f"unknown command {cmd}")
