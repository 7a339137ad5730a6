#!/usr/bin/env python3
"""Makes PyPI's CUDA build of torch import in a venv that has no `nvidia-*` wheels, as on an
Ascend host (where torch is the CPU build and no CUDA exists).

PyPI's x86-64 torch links its CUDA libraries (libtorch.so needs libtorch_cuda.so, which needs
libcudnn.so.8, libcublas.so.12, ...) and `import torch` fails without them. Pulling the real
ones costs ~3 GB per torch release for code the test bed never runs. This writes, under the
venv's `site-packages/nvidia/<package>/lib` (where torch looks for them), one small library
per missing soname that defines every name torch's libraries import from it, with the same
symbol versions: each returns 100 (`cudaErrorNoDevice`: "no CUDA device here") for the CUDA
runtime and 0 elsewhere. torch and torch_npu are not touched; nothing here runs unless
something calls CUDA.

usage: cuda_absent.py SITE_PACKAGES   (prints what it made; idempotent)
"""
import os
import re
import subprocess
import sys
import tempfile

# The nvidia-* package folder torch's loader searches for each soname's stem.
FOLDER = {
    "libcublas": "cublas", "libcublasLt": "cublas", "libcudart": "cuda_runtime",
    "libcudnn": "cudnn", "libcufft": "cufft", "libcurand": "curand", "libcusolver": "cusolver",
    "libcusparse": "cusparse", "libnccl": "nccl", "libnvToolsExt": "nvtx",
    "libnvrtc": "cuda_nvrtc", "libcupti": "cuda_cupti", "libnvJitLink": "nvjitlink",
    "libcusparseLt": "cusparselt", "libcufile": "cufile",
}
CUDA_SONAME = re.compile(r"^(lib[A-Za-z]+)\.so\.[0-9]+$")


def dynamic(path, *flags):
    out = subprocess.run(["nm", "-D", *flags, path], capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.split()]


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out)


def main():
    site = sys.argv[1]
    torch_lib = os.path.join(site, "torch", "lib")
    libs = [os.path.join(torch_lib, f) for f in sorted(os.listdir(torch_lib)) if ".so" in f]
    defined = set()
    for lib in libs:
        defined.update(n.split("@")[0] for n in dynamic(lib, "--defined-only"))
    missing = {}  # soname -> names torch imports from it
    for lib in libs:
        for soname in needed(lib):
            m = CUDA_SONAME.match(soname)
            if m and m.group(1) in FOLDER and not os.path.exists(os.path.join(torch_lib, soname)):
                missing.setdefault(soname, set())
    unversioned = set()
    for lib in libs:
        for name in dynamic(lib, "--undefined-only"):
            base, _, version = name.partition("@")
            if version.lstrip("@") in missing:
                missing[version.lstrip("@")].add(base)
            elif not version and base not in defined:
                unversioned.add(base)
    made = []
    for soname, names in sorted(missing.items()):
        stem = CUDA_SONAME.match(soname).group(1)
        out_dir = os.path.join(site, "nvidia", FOLDER[stem], "lib")
        target = os.path.join(out_dir, soname)
        if os.path.exists(target):
            continue
        os.makedirs(out_dir, exist_ok=True)
        # Versioned imports name their library; unversioned ones (NCCL's) by its prefix.
        names = names or {n for n in unversioned if n.lower().startswith(stem[3:].lower())}
        ret = 100 if stem == "libcudart" else 0
        with tempfile.TemporaryDirectory() as tmp:
            src, script = os.path.join(tmp, "absent.c"), os.path.join(tmp, "absent.map")
            with open(src, "w") as f:
                for i, name in enumerate(sorted(names)):
                    f.write(f'long absent_{i}(void) __asm__("{name}");\n'
                            f"long absent_{i}(void) {{ return {ret}; }}\n")
            cmd = ["cc", "-shared", "-fPIC", "-O0", f"-Wl,-soname,{soname}", "-o", target + ".tmp", src]
            if missing[soname]:
                with open(script, "w") as f:
                    f.write(f"{soname} {{ global: *; }};\n")
                cmd.insert(-1, f"-Wl,--version-script={script}")
            subprocess.run(cmd, check=True)
        os.replace(target + ".tmp", target)
        made.append(f"{soname} ({len(names)} names)")
    print("cuda_absent: " + (", ".join(made) if made else "nothing to make"))


if __name__ == "__main__":
    main()
