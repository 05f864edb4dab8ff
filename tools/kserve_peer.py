"""A KServe ``ModelServer`` serving one ONNX model with ONNX Runtime: the peer ``bench_server.py`` compares with.

Runs inside KServe's own virtual environment (its pins clash with ours), so it
imports nothing from this project::

    /work/venvs/kserve/bin/python tools/kserve_peer.py --model cls.onnx --name cls --port 8091

It is what a user would write following KServe's custom-model guide: a
``kserve.Model`` whose ``predict`` runs an ``InferenceSession`` on the v2
request's first input and answers every output (binary tensors when asked).
"""

from __future__ import annotations

import argparse
import uuid


def main() -> None:
    from importlib.metadata import version

    import onnxruntime as ort
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    args = parser.parse_args()

    class OnnxModel(Model):
        def __init__(self) -> None:
            super().__init__(args.name)
            self.session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
            self.input_name = self.session.get_inputs()[0].name
            self.output_names = [o.name for o in self.session.get_outputs()]
            self.ready = True

        async def predict(self, payload: InferRequest, headers: dict | None = None,
                          response_headers: dict | None = None) -> InferResponse:
            values = self.session.run(self.output_names, {self.input_name: payload.inputs[0].as_numpy()})
            binary = bool((payload.parameters or {}).get("binary_data_output", False))
            outputs = []
            for name, value in zip(self.output_names, values):
                output = InferOutput(name=name, shape=list(value.shape), datatype="FP32")
                output.set_data_from_numpy(value, binary_data=binary)
                outputs.append(output)
            # NOTE: KServe 0.21 rejects a response without an id; the benchmark sends none.
            return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id or uuid.uuid4().hex)

    print(f"kserve {version('kserve')}", flush=True)
    ModelServer(http_port=args.port, grpc_port=args.grpc_port, workers=1).start([OnnxModel()])


if __name__ == "__main__":
    main()
