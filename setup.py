"""The lazygrad package."""

from setuptools import find_packages, setup

setup(
    name="lazygrad",
    version="0.1.0",
    description="A lazy, graph-compiling tensor framework",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["lazygrad", "lazygrad.*"]),
    package_data={"lazygrad.runtime": ["cuda_shim.h"]},
    python_requires=">=3.10",
    install_requires=["numpy", "llvmlite"],
    extras_require={
        "testing": ["pytest", "pytest-xdist", "hypothesis", "ruff", "torch==2.13.0", "safetensors"],
        "opencl": ["pyopencl", "pocl-binary-distribution"],
        # NVRTC and the headers it compiles with; the GPU is driven through the NVIDIA driver's libcuda (ctypes)
        "cuda": ["nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-runtime==13.0.*", "nvidia-cuda-crt==13.0.*"],
        # CUDA=1 MOCKCUDA=1 without a GPU: the same (and g++ from the system)
        "mockcuda": ["nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-runtime==13.0.*", "nvidia-cuda-crt==13.0.*"],
        # data-parallel training (lazygrad.distributed); mpi4py needs an MPI library, e.g. Debian's openmpi-bin
        "distributed": ["mpi4py"],
        "viz": ["graphviz"],
        "examples": ["tqdm", "matplotlib", "scikit-learn"],
    },
)
