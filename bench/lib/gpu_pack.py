"""bench/gpu_run's bundle: everything a GPU host with Python 3.12, nvcc 13.0 and no package
index needs to run the benchmark, in at most BUDGET bytes (a device call carries 64 MiB with
the working tree).

- `llama.tar.xz`: llama.cpp built here (bench/lib/llama_build.py: CUDA for sm_90, or the CPU for a
  rehearsal) with shared libraries, and llama-server from the same build, stripped.
- `wheels/`: Python 3.12 wheels of everything the API, the worker and the benchmark import,
  llama-cpp-python among them built without its native part (the worker loads the bundle's
  libraries: LLAMA_CPP_LIB_PATH). numpy stays out of a CUDA bundle: 16 MB it has no room
  for, and the GPU host's Python has it (bench/gpu_run reaches it from the new venv).
- `project.tar.gz`: tokenspool's code (what the runs import), and `tokenizer.gguf`: the
  default model's tokenizer and chat template for the random models (2 MB, not 98).
- `device.sh` (bench/lib/gpu_device.sh): the one device call, `bash DIR/device.sh`, and `gpu_run`,
  which it runs with the host's Python before any venv exists.
- `bundle.json`: what is in it, and its sizes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.lib import llama_build
from devstack import random_model

BUDGET = 60 * 2**20  # 64 MiB less the working tree that travels beside it
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
PLATFORMS += ("manylinux1_x86_64", "manylinux_2_5_x86_64", "linux_x86_64", "any")
ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("api", "worker", "contract", "devstack", "bench", "pyproject.toml", "README.md")
EXTRA = (
    "httpx>=0.27",
    "gguf>=0.17",
    "tqdm>=4",
)  # the benchmark's client, its model writer; the worker's progress lines


LEFT_OUT = ("llama-cpp-python", "huggingface_hub")  # its native part comes built; no Hub offline


def requirements(numpy: bool) -> list[str]:
    """The project's dependencies (pyproject.toml) and the benchmark's, less what the bundle
    brings otherwise (llama-cpp-python's native part), what an offline host cannot use (the
    Hub: the benchmark's models are written there), and what the host has (numpy, for CUDA)."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    reqs = [*meta["dependencies"], *extras["worker"], *extras["local"], *EXTRA]
    return [r for r in reqs if not r.startswith(LEFT_OUT) and (numpy or not r.startswith("numpy"))]


def _run(argv: list[str], **kw) -> None:
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    subprocess.run(argv, check=True, **kw)


def wheels(out: Path, numpy: bool) -> None:
    """Python 3.12 wheels, manylinux x86-64, then llama-cpp-python without its native build."""
    platforms = [f"--platform={p}" for p in PLATFORMS]
    pip = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version=3.12"]
    _run([*pip, "--implementation=cp", *platforms, "-d", str(out), *requirements(numpy)])
    if not numpy:
        for whl in out.glob("numpy-*.whl"):  # a dependency's dependency: the host has it
            whl.unlink()
    pure = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-cache-dir",
        "--no-deps",
        "--no-binary=llama-cpp-python",
    ]
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF"}
    _run([*pure, f"llama-cpp-python=={llama_build.LLAMA_VERSION}", "-w", str(out)], env=env)
    llama_deps = ("typing-extensions>=4.5", "diskcache>=5.6.1", "jinja2>=2.11.3")
    _run([*pip, "--implementation=cp", *platforms, "-d", str(out), *llama_deps])


def natives(out: Path, backend: str, arch: str) -> None:
    """The build's libraries (llama-server's own among them) and llama-server, stripped, as
    llama.tar.xz (links kept)."""
    built = llama_build.build(backend, arch) / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "llama"
        stage.mkdir()
        for path in sorted(built.iterdir()):
            if path.name == "llama-server" or (path.name.startswith("lib") and ".so" in path.name):
                shutil.copy(path, stage / path.name, follow_symlinks=False)
        for path in stage.iterdir():
            if not path.is_symlink():
                _run(["strip", "--strip-unneeded", str(path)])
        with tarfile.open(out / "llama.tar.xz", "w:xz", preset=9) as tar:
            tar.add(stage, arcname="llama")


def project(out: Path) -> None:
    """The project as the working tree has it (what git tracks, and new files it does not
    ignore), less the pictures and the Markdown."""
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *PROJECT]
    files = subprocess.run(listed, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split("\0")
    with tarfile.open(out / "project.tar.gz", "w:gz") as tar:
        for name in filter(None, files):
            if not name.endswith((".png", ".md")) or name == "README.md":
                tar.add(ROOT / name, arcname=f"project/{name}")


def pack(out: Path, backend: str = "cuda", arch: str = "90") -> dict:
    """Write the bundle into `out` (emptied first); its description."""
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    natives(out, backend, arch)
    wheels(out / "wheels", numpy=backend != "cuda")
    project(out)
    shutil.copy(
        ROOT / "bench" / "lib" / "gpu_device.sh", out / "device.sh"
    )  # the device call: `bash DIR/device.sh`
    shutil.copy(ROOT / "bench" / "gpu_run", out / "gpu_run")  # what device.sh runs, before any venv
    random_model.vocabulary(out / "tokenizer.gguf")
    sizes = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    info = {
        "backend": backend,
        "arch": arch if backend == "cuda" else None,
        "llama_cpp_python": llama_build.LLAMA_VERSION,
        "cmake": llama_build.cmake_args(backend, arch),
        "bytes": sum(sizes.values()),
        "files": sizes,
    }
    (out / "bundle.json").write_text(json.dumps(info, indent=1) + "\n")
    if info["bytes"] > BUDGET:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
        raise SystemExit(
            f"the bundle is {info['bytes'] / 2**20:.1f} MiB, over {BUDGET / 2**20:.0f}: {biggest}"
        )
    print(f"bundle: {out} ({info['bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
    return info
