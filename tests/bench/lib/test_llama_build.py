"""The CUDA build (bench/lib/llama_build.py), checked wherever NVIDIA's toolkit is: llama.cpp's
CUDA backend, configured as the GPU benchmark builds it (nvcc 13.0, cuBLAS from PyPI),
compiles to machine code for the H100 and H200 (sm_90), as `cuobjdump --list-elf` reads it;
and the whole library, once built, holds it too."""

from __future__ import annotations

import subprocess

import pytest

from bench.lib import llama_build
from tests.system import missing

pytestmark = pytest.mark.skipif(
    llama_build.nvcc() is None, reason=missing("nvcc (NVIDIA's CUDA toolkit 13.0)")
)

OBJECT = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/acc.cu.o"


def test_the_cuda_backend_compiles_to_sm_90_machine_code_here(tmp_path):
    build = tmp_path / "build"
    llama_build.configure(build, "cuda", "90")
    subprocess.run(["ninja", "-C", str(build), OBJECT], check=True, capture_output=True)
    assert "sm_90" in llama_build.architectures(build / OBJECT)


def test_the_built_library_holds_sm_90_machine_code():
    lib = llama_build.CACHE / llama_build.key("cuda", "90") / "bin" / "libggml-cuda.so"
    if not lib.exists():
        pytest.skip(
            "no CUDA build here yet: `python -m bench.lib.llama_build` (or bench/gpu_run --pack) makes it"
        )
    assert "sm_90" in llama_build.architectures(lib)
