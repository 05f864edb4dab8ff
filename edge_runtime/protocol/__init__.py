"""KServe v2 / Open Inference Protocol encoding, shared by the server and the cloud client.

Pure functions over JSON and bytes; no HTTP library and no status codes (those stay in
``edge_runtime.server``).
"""
