"""llama.cpp built the way bench/gpu_run needs it: the library the worker's llama-cpp-python
vendors and llama-server, from one source, with shared libraries; for CUDA on a machine
without a GPU, with nvcc 13.0 and NVIDIA's CUDA 13.0 wheels from PyPI for what a bare
toolkit lacks (cuBLAS, its headers, cuobjdump).

    python -m bench.lib.llama_build [--backend cuda|cpu] [--arch 90] [--jobs N]   # prints the folder

The source is the llama.cpp inside the worker's llama-cpp-python sdist (LLAMA_VERSION, from
PyPI): llama-server and the worker (llama-cpp-python pointed at these libraries with
LLAMA_CPP_LIB_PATH) then run the same llama.cpp. CPU flags are scripts/setup's portable ones.
For CUDA, GGML_CUDA_NO_VMM: no libcuda at build time (the GPU host's driver brings it). A
build is cached by version, backend and flags (~/.cache/tokenspool/llama/<key>), and a CUDA
one is checked: libggml-cuda.so must hold machine code for each architecture asked for
(`cuobjdump --list-elf`); tests/test_llama_build.py runs that check wherever the toolkit is.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_VERSION = "0.3.36"  # scripts/setup's, the worker's
CUDA_WHEELS = (  # CUDA 13.0 (driver 580), and the oldest cuobjdump PyPI has (13.2 reads 13.0's)
    "nvidia-cublas==13.0.2.14",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cuobjdump==13.2.51",
)
CPU_FLAGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tokenspool" / "llama"
LIBS = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")


def nvcc() -> Path | None:
    """nvcc, from CUDA_HOME, /usr/local/cuda*, or PATH."""
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/local/cuda-13.0"):
        if root and (Path(root) / "bin" / "nvcc").exists():
            return (Path(root) / "bin" / "nvcc").resolve()
    found = shutil.which("nvcc")
    return Path(found).resolve() if found else None


def cmake_args(backend: str, arch: str) -> list[str]:
    cuda = ["-DGGML_CUDA=ON", "-DGGML_CUDA_NO_VMM=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    return [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        *(cuda if backend == "cuda" else []),
        *CPU_FLAGS.split(),
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]


def key(backend: str, arch: str = "90") -> str:
    flags = cmake_args(backend, arch)
    return backend + "-" + hashlib.sha256(f"{LLAMA_VERSION} {CUDA_WHEELS} {flags}".encode()).hexdigest()[:16]


def _run(argv: list[str], **kw) -> None:
    print("+", " ".join(str(a) for a in argv), file=sys.stderr, flush=True)
    subprocess.run(argv, check=True, **kw)


def source(work: Path) -> Path:
    """The llama.cpp that llama-cpp-python LLAMA_VERSION vendors (its sdist from PyPI)."""
    tree = work / f"llama_cpp_python-{LLAMA_VERSION}" / "vendor" / "llama.cpp"
    if not tree.is_dir():
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(work)]
        _run([*pip, f"llama-cpp-python=={LLAMA_VERSION}"])
        with tarfile.open(work / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz") as tar:
            tar.extractall(work, filter="data")
    return tree


def toolkit(work: Path, compiler: Path) -> Path:
    """A CUDA root for CMake: the toolkit nvcc belongs to, with what it lacks (cuBLAS, its
    headers) from NVIDIA's PyPI wheels, as links."""
    root = work / "cuda-root"
    real = compiler.parent.parent
    if (root / "lib64" / "libcublas.so").exists():
        return root
    wheels = work / "cuda-wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(wheels),
            *CUDA_WHEELS,
        ]
    )
    for whl in wheels.glob("*.whl"):
        shutil.unpack_archive(str(whl), wheels / "unpacked", "zip")
    extra = wheels / "unpacked" / "nvidia" / "cu13"
    (extra / "bin" / "cuobjdump").chmod(0o755)  # a wheel's unpacking keeps no modes
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for part in ("nvvm", "targets"):
        os.symlink(real / part, root / part)
    folders = {
        "bin": [real / "bin", extra / "bin"],
        "include": [real / "include", extra / "include"],
        "lib64": [real / "lib64", extra / "lib"],
    }
    for folder, sources in folders.items():
        (root / folder).mkdir()
        for src in sources:
            for f in src.iterdir():
                if not (root / folder / f.name).exists():
                    os.symlink(f, root / folder / f.name)
    for lib in ("libcublas", "libcublasLt"):
        os.symlink(f"{lib}.so.13", root / "lib64" / f"{lib}.so")
    return root


def libraries(backend: str) -> tuple[str, ...]:
    return (*LIBS, "libggml-cuda.so") if backend == "cuda" else LIBS


def build(backend: str = "cuda", arch: str = "90", jobs: int | None = None) -> Path:
    """The build's folder (bin/: the libraries and llama-server), built once per key."""
    out = CACHE / key(backend, arch)
    done = [out / "bin" / name for name in (*libraries(backend), "llama-server")]
    if all(p.exists() for p in done):
        return out
    configure(out, backend, arch)
    _run(["cmake", "--build", str(out), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 2)])
    if backend == "cuda":
        check(out / "bin" / "libggml-cuda.so", arch)
    return out


def configure(out: Path, backend: str, arch: str = "90") -> None:
    """CMake's configuration of the build in `out` (the source, and a CUDA toolkit, made ready)."""
    work = CACHE / "work"
    work.mkdir(parents=True, exist_ok=True)
    args = cmake_args(backend, arch)
    if backend == "cuda":
        compiler = nvcc()
        if compiler is None:
            raise SystemExit("no nvcc: install NVIDIA's CUDA toolkit 13.0 (or set CUDA_HOME)")
        root = toolkit(work, compiler)
        args += [f"-DCUDAToolkit_ROOT={root}", f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}"]
    _run(["cmake", "-S", str(source(work)), "-B", str(out), "-G", "Ninja", *args])


def architectures(lib: Path) -> set[str]:
    """The sm_XX of the machine code (ELF cubins) in a CUDA library (`cuobjdump --list-elf`)."""
    tool = CACHE / "work" / "cuda-root" / "bin" / "cuobjdump"
    listed = subprocess.run([str(tool), "--list-elf", str(lib)], check=True, capture_output=True, text=True)
    return set(re.findall(r"\.(sm_\d+a?)\.cubin", listed.stdout))


def check(lib: Path, arch: str) -> None:
    have = architectures(lib)
    wanted = {f"sm_{a}" for a in arch.split(";")}
    if not wanted <= {h.rstrip("a") for h in have}:
        raise SystemExit(f"{lib} holds machine code for {sorted(have)}, not {sorted(wanted)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--arch", default="90", help="CMAKE_CUDA_ARCHITECTURES (90: H100, H200)")
    ap.add_argument("--jobs", type=int)
    args = ap.parse_args()
    print(build(args.backend, args.arch, args.jobs))


if __name__ == "__main__":
    main()
