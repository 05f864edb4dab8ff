"""Model optimisation: int8/fp16 conversion (``quantize``), its accuracy and speed reports, calibration data.

Heavy libraries (onnx, onnxruntime.quantization) are imported inside the functions.
"""
