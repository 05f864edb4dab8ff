"""CloudClient against a real second edge-runtime process: wire formats, auth, retries, TLS."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from cloud_fixtures import TOKEN, build_cnn, cnn_feeds, free_port, ort_outputs
from netem_proxy import LinkProfile, ShapingProxy


def _success_count(url: str, model: str) -> int:
    request = urllib.request.Request(f"{url}/v2/models/{model}/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        stats = json.loads(response.read())
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_onnxruntime(cloud_config, binary: bool) -> None:
    from edge_runtime.cloud.client import CloudClient

    feeds = cnn_feeds(seed=3)
    expected = ort_outputs(build_cnn(), feeds)["probabilities"]
    with CloudClient(dataclasses.replace(cloud_config, binary_tensors=binary)) as client:
        call = client.infer("cnn", feeds)
    assert set(call.outputs) == {"probabilities"}
    np.testing.assert_allclose(call.outputs["probabilities"], expected, rtol=1e-5, atol=1e-7)
    assert call.outputs["probabilities"].dtype == np.float32
    assert call.attempts == 1 and not call.retried
    assert call.server_ms is not None and 0 <= call.server_ms < call.elapsed_ms
    # Binary tensors are smaller on the wire than the same floats written as JSON text.
    assert call.sent_bytes >= feeds["image"].nbytes if binary else call.sent_bytes > 2 * feeds["image"].nbytes


def test_token_is_required_and_sent(cloud_config) -> None:
    from edge_runtime.cloud.client import CloudCallError, CloudClient

    with CloudClient(dataclasses.replace(cloud_config, token=None)) as client:
        assert client.ready()  # health probes are public
        with pytest.raises(CloudCallError) as caught:
            client.infer("cnn", cnn_feeds())
    assert caught.value.kind == "http_error" and caught.value.status == 401
    assert not caught.value.maybe_ran
    with CloudClient(cloud_config) as client:
        assert client.ready("cnn") and not client.ready("no_such_model")
        metadata = client.metadata("cnn")
    assert [i["name"] for i in metadata["inputs"]] == ["image"]


def test_refused_connection_is_retried_with_backoff() -> None:
    from edge_runtime.cloud.client import CloudCallError, CloudClient
    from edge_runtime.cloud.config import CloudConfig

    config = CloudConfig(url=f"http://127.0.0.1:{free_port()}", retries=2, retry_backoff_ms=40)
    started = time.monotonic()
    with CloudClient(config) as client:
        with pytest.raises(CloudCallError) as caught:
            client.infer("cnn", cnn_feeds())
    elapsed_s = time.monotonic() - started
    assert caught.value.kind == "refused" and caught.value.attempts == 3
    assert not caught.value.sent and not caught.value.maybe_ran
    assert 0.11 <= elapsed_s < 3.0  # back-offs of 40 + 80 ms happened, and nothing hung


def test_timeout_after_sending_is_not_retried_and_the_peer_did_run_it(cloud_server, cloud_config) -> None:
    from edge_runtime.cloud.client import CloudCallError, CloudClient

    before = _success_count(cloud_server.url, "cnn")
    with ShapingProxy("127.0.0.1", cloud_server.port, LinkProfile("slow", delay_ms=400)) as proxy:
        config = dataclasses.replace(cloud_config, url=f"http://127.0.0.1:{proxy.port}", timeout_ms=300, retries=3)
        with CloudClient(config) as client:
            with pytest.raises(CloudCallError) as caught:
                client.infer("cnn", cnn_feeds())
        assert caught.value.kind == "timeout" and caught.value.attempts == 1
        assert caught.value.maybe_ran
        assert proxy.connections == 1  # one try only
        # The request was delivered after the client gave up: the peer ran it (why it must not be retried).
        deadline = time.monotonic() + 5
        while _success_count(cloud_server.url, "cnn") == before and time.monotonic() < deadline:
            time.sleep(0.05)
    assert _success_count(cloud_server.url, "cnn") == before + 1


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_is_verified_and_a_custom_ca_is_accepted(cloud_server, cloud_config, tmp_path: Path) -> None:
    import ssl

    from edge_runtime.cloud.client import CloudCallError, CloudClient

    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with ShapingProxy("127.0.0.1", cloud_server.port, ssl_context=context) as proxy:
        url = f"https://127.0.0.1:{proxy.port}"
        with CloudClient(dataclasses.replace(cloud_config, url=url, retries=3)) as client:
            with pytest.raises(CloudCallError) as caught:
                client.infer("cnn", cnn_feeds())
        assert caught.value.kind == "tls" and caught.value.attempts == 1  # a bad certificate is not retried
        assert "certificate" in str(caught.value).lower()
        with CloudClient(dataclasses.replace(cloud_config, url=url, ca_file=cert)) as client:
            call = client.infer("cnn", cnn_feeds())
    np.testing.assert_allclose(call.outputs["probabilities"], ort_outputs(build_cnn(), cnn_feeds())["probabilities"],
                               rtol=1e-5, atol=1e-7)
