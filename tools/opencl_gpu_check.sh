#!/bin/bash
# The OpenCL backend, the device probe and `auto` on a machine with a real GPU and its vendor's
# OpenCL driver (run on an NVIDIA H200 lent for a session; see README "OpenCL on a real GPU").
# The machine has no network: prepare a wheel folder here first, on a machine with PyPI
# (the Python version and platform of the target):
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 --platform any -d .devwheels pyopencl pytest-asyncio pytest-timeout
#   pip download --no-deps --only-binary=:all: -d .devwheels rapidocr-onnxruntime   # the PP-OCR models
# then, on the target, from the checkout: OUT=out bash tools/opencl_gpu_check.sh
# Needs numpy, onnx, onnxruntime and pytest there already. Logs and JSON go to $OUT.
mkdir -p "${OUT:?set OUT to a folder for the logs}"
exec > >(tee "$OUT/log.txt") 2>&1
set -x
python3 -m pip install -q --no-index --find-links .devwheels pyopencl pytest-asyncio pytest-timeout
python3 -m pip install -q --no-index --no-deps .devwheels/rapidocr_onnxruntime-*.whl
# NVIDIA's driver ships libnvidia-opencl but, in a container, often no ICD file naming it.
if [ ! -s /etc/OpenCL/vendors/nvidia.icd ]; then
    LIB=$(find / -xdev -name "libnvidia-opencl.so*" 2>/dev/null | head -1)
    [ -n "$LIB" ] && mkdir -p /etc/OpenCL/vendors && echo "$LIB" > /etc/OpenCL/vendors/nvidia.icd
fi
export PYTHONPATH=$PWD
timeout 60 python3 -m edge_runtime probe --json > "$OUT/probe.json"
CLS=$(python3 -c "import importlib.util, pathlib; s=importlib.util.find_spec('rapidocr_onnxruntime'); \
print(next(pathlib.Path(list(s.submodule_search_locations)[0]).glob('models/*_cls_*.onnx')))")
timeout 150 python3 -m edge_runtime plan "$CLS" --shape x=1,3,48,192 --json > "$OUT/plan_cls.json"
timeout 360 python3 -m pytest -q -ra -p no:cacheprovider -o addopts="" tests/backends/test_backend_ops.py \
    tests/backends/opencl tests/planning -k "not vulkan and not ncnn and not tflite and not litert" \
    > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"
tail -5 "$OUT/pytest.txt"
