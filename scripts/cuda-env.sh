# Sourced by scripts/gpu-check.sh (and usable by hand: `. scripts/cuda-env.sh`): puts the CUDA 13
# libraries (driver, NVRTC, cuBLAS) on LD_LIBRARY_PATH from the toolkit, the distribution, or pip
# wheels (nvidia-*-cu13 / nvidia/cu13/lib), and keeps f32 GEMMs f32 (never TF32).
for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/lib/x86_64-linux-gnu /usr/lib64 \
         $(python3 -c 'import site,glob;print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null) \
         "$PWD/.whl/nvidia/cu13/lib"; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH
export NVIDIA_TF32_OVERRIDE=0
