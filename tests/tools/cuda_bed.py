#!/usr/bin/env python3
"""Puts the simulated CUDA (tests/fixtures/cuda, `make -C tests/fixtures cuda`) into a venv of
PyPI's CUDA torch, where the wheel's DT_RPATH looks (`site-packages/nvidia/cuda_runtime/lib`:
LD_LIBRARY_PATH cannot override an RPATH), and stubs for the other nvidia libraries torch links
(NVTX is NVIDIA's own `nvidia-nvtx-cu12` wheel, installed by xtask/src/cuda_bed.rs)
(cublas, cudnn, nccl, ...: tests/tools/cuda_absent.py, which returns success from them). Checks
that the simulated runtime defines every `cuda*` name torch imports from libcudart.so.12 (a
new torch release that needs more fails here, by name, not at import).

usage: cuda_bed.py SITE_PACKAGES BUILD_CUDA_DIR   (idempotent: copies only what changed)
"""
import filecmp
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def names(path, *flags):
    out = subprocess.run(["nm", "-D", *flags, path], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()}


def main():
    site, built = sys.argv[1], sys.argv[2]
    lib_dir = os.path.join(site, "nvidia", "cuda_runtime", "lib")
    for name, package in [("libcudart.so.12", "cuda_runtime"), ("libcuda.so.1", "cuda_runtime")]:
        os.makedirs(os.path.join(site, "nvidia", package, "lib"), exist_ok=True)
        src, dst = os.path.join(built, name), os.path.join(site, "nvidia", package, "lib", name)
        if not (os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False)):
            shutil.copyfile(src, dst + ".tmp")
            os.replace(dst + ".tmp", dst)
    runtime = names(os.path.join(lib_dir, "libcudart.so.12"), "--defined-only")
    torch_lib = os.path.join(site, "torch", "lib")
    wanted = set()
    for f in os.listdir(torch_lib):
        if ".so" in f:
            wanted |= {n for n in names(os.path.join(torch_lib, f), "--undefined-only")
                       if n.endswith("@libcudart.so.12")}
    absent = sorted(n.split("@")[0] for n in wanted if n.replace("@", "@@", 1) not in runtime)
    if absent:
        sys.exit(f"cuda_bed: the simulated libcudart.so.12 lacks {', '.join(absent)} "
                 "(add them to tests/fixtures/cuda/cudart.c)")
    subprocess.run([sys.executable, os.path.join(HERE, "cuda_absent.py"), site], check=True)


if __name__ == "__main__":
    main()
