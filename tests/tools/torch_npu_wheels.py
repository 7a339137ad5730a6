#!/usr/bin/env python3
"""Fetches the torch_npu wheels of the release matrix into a cache and keeps only what the
static test reads: `CACHE/LIBS/VERSION/torch_npu/{lib/libtorch_npu.so,version.py}`, where LIBS is
`torch_npu_libs` for x86-64 and `torch_npu_libs_aarch64` for aarch64 (libs_dir).

    torch_npu_wheels.py CACHE PLATFORM VERSION...

PLATFORM is `x86_64` or `aarch64`. Each wheel is downloaded once with pip (`--no-deps`: torch
is not needed to read the library), unpacked, and deleted; a release already unpacked is not
fetched again. Prints one summary line; exits 1 when a wheel could not be fetched.
"""
import os
import subprocess
import sys
import tempfile
import zipfile

MEMBERS = ("torch_npu/lib/libtorch_npu.so", "torch_npu/version.py")


def libs_dir(cache, platform):
    """Where one platform's libraries are kept (x86-64's folder predates the others)."""
    return os.path.join(cache, "torch_npu_libs" if platform == "x86_64" else "torch_npu_libs_" + platform)


def fetch(cache, platform, version):
    """Unpacks one release; returns the bytes downloaded (0 when it was already there)."""
    dest = os.path.join(libs_dir(cache, platform), version)
    if all(os.path.isfile(os.path.join(dest, m)) for m in MEMBERS):
        return 0
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "--python-version", "3.11", "-d", tmp]
        for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014"):
            cmd += ["--platform", "%s_%s" % (tag, platform)]
        subprocess.run(cmd + ["torch-npu==" + version], check=True, stdout=subprocess.DEVNULL)
        (wheel,) = [os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl")]
        size = os.path.getsize(wheel)
        with zipfile.ZipFile(wheel) as z:
            for member in MEMBERS:
                out = os.path.join(dest, member)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out + ".part", "wb") as f:
                    f.write(z.read(member))
                os.replace(out + ".part", out)
    return size


def main():
    cache, platform, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(cache, exist_ok=True)
    downloaded, failed = 0, []
    for v in versions:
        try:
            downloaded += fetch(cache, platform, v)
        except Exception as e:  # noqa: BLE001 - reported below, per release
            failed.append("%s (%s)" % (v, e))
    libs = libs_dir(cache, platform)
    kept = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(libs) for f in fs
    )
    print(
        "%d torch_npu releases (%s): %.0f MB downloaded now, %.1f GB kept in %s"
        % (len(versions), platform, downloaded / 1e6, kept / 1e9, libs)
    )
    if failed:
        print("could not fetch: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
