#!/usr/bin/env bash
# cibuildwheel's before-all on Linux: the CUDA compiler and runtime headers/libraries into the
# manylinux_2_28 container (AlmaLinux 8), from NVIDIA's RHEL 8 repository. Only what the build
# uses: nvcc (with its front end and ptxas), the static runtime, cuda.h / cudaTypedefs.h, and
# the CCCL headers that cuda_fp16.h / cuda_bf16.h include.
# CUDA_VERSION: major.minor (default 12.8).
set -euo pipefail
ver="${CUDA_VERSION:-12.8}"
case "$(uname -m)" in
  x86_64) repo=x86_64 ;;
  aarch64) repo=sbsa ;;
  *) echo "no CUDA repository for $(uname -m)" >&2; exit 1 ;;
esac
dnf install -y -q dnf-plugins-core
dnf config-manager --add-repo "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/${repo}/cuda-rhel8.repo"
pkg="${ver/./-}"
dnf install -y -q "cuda-nvcc-${pkg}" "cuda-cudart-devel-${pkg}" "cuda-driver-devel-${pkg}" "cuda-cccl-${pkg}"
ln -sfn "/usr/local/cuda-${ver}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
