"""Image inputs: decoding with Pillow, data/http(s)/file URLs under the allow-list, named errors.

Oracles: Pillow's own decode of the same bytes (and the pixels we encoded, for lossless
formats); a loopback ``http.server`` for fetches.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_runtime.errors import ConfigError, InvalidInputError
from edge_runtime.generation.vision.images import ImageAccess, image_digest, image_from_url, load_image

WHERE = "messages[1].content[2].image_url"
OPEN = ImageAccess()


def _pixels(width: int = 48, height: int = 32, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(array[:, :, 0] if channels == 1 else array, mode)


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def _data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _error(call) -> str:
    with pytest.raises(InvalidInputError) as info:
        call()
    message = str(info.value)
    assert message.startswith(WHERE + ": "), message
    return message


# --- decoding -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, params", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_lossless_formats_decode_to_the_encoded_pixels(fmt: str, params: dict) -> None:
    original = _pixels()
    image = image_from_url(_data_url(_encode(original, fmt, **params)), WHERE, OPEN)
    assert image.mode == "RGB" and image.size == original.size
    assert np.array_equal(np.asarray(image), np.asarray(original))


def test_jpeg_decodes_like_pillow() -> None:
    data = _encode(_pixels(64, 40), "JPEG", quality=80)
    image = load_image(data, WHERE, OPEN)
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_other_modes_come_back_rgb(mode: str) -> None:
    source = _pixels(mode="RGBA") if mode != "L" else _pixels(mode="L")
    if mode == "P":
        source = source.convert("RGB").quantize(16)
    data = _encode(source, "PNG")
    image = load_image(data, WHERE, OPEN)
    assert image.mode == "RGB"
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_exif_orientation_is_applied() -> None:
    original = _pixels(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = _encode(original, "JPEG", quality=95, exif=exif)
    image = load_image(data, WHERE, OPEN)
    assert image.size == (20, 40)


def test_pil_bytes_and_path_inputs(tmp_path: Path) -> None:
    original = _pixels()
    path = tmp_path / "x.png"
    original.save(path)
    expected = np.asarray(original)
    for source in (original, original.convert("RGBA"), path.read_bytes(), bytearray(path.read_bytes()), path):
        image = load_image(source, WHERE, OPEN)
        assert image.mode == "RGB" and np.array_equal(np.asarray(image), expected)


def test_unsupported_input_type() -> None:
    assert "expected a PIL image, bytes, a path or a URL, got int" in _error(lambda: load_image(3, WHERE, OPEN))


# --- named errors ----------------------------------------------------------------------------------

def test_data_url_without_comma() -> None:
    assert "missing ','" in _error(lambda: image_from_url("data:image/png;base64", WHERE, OPEN))


def test_data_url_not_base64() -> None:
    message = _error(lambda: image_from_url("data:image/png,%89PNG", WHERE, OPEN))
    assert "only base64 data URLs" in message and "'image/png'" in message


@pytest.mark.parametrize("payload", ["iVBORw0KGgo*AAAA", "iVBORw0KGgoAAA", "ü"])
def test_bad_base64(payload: str) -> None:
    assert "invalid base64" in _error(lambda: image_from_url(f"data:image/png;base64,{payload}", WHERE, OPEN))


def test_wrapped_base64_is_accepted() -> None:
    data = _encode(_pixels(), "PNG")
    text = base64.b64encode(data).decode()
    wrapped = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    image = image_from_url(f"data:image/png;base64,{wrapped}", WHERE, OPEN)
    assert np.array_equal(np.asarray(image), np.asarray(_pixels()))


def test_non_image_media_type() -> None:
    assert "got media type 'text/plain'" in _error(
        lambda: image_from_url(_data_url(b"hello", "text/plain"), WHERE, OPEN))


def test_empty_data() -> None:
    assert "got 0 bytes" in _error(lambda: image_from_url("data:image/png;base64,", WHERE, OPEN))
    assert "got 0 bytes" in _error(lambda: load_image(b"", WHERE, OPEN))


@pytest.mark.parametrize("fmt, name", [("GIF", "GIF"), ("BMP", "BMP"), ("TIFF", "TIFF")])
def test_unsupported_formats_are_named(fmt: str, name: str) -> None:
    message = _error(lambda: load_image(_encode(_pixels(), fmt), WHERE, OPEN))
    assert "expected a PNG, JPEG or WebP image" in message and f"a {name} image (unsupported format)" in message


def test_garbage_bytes() -> None:
    assert "expected a PNG, JPEG or WebP image, got 12 bytes" in _error(
        lambda: load_image(b"not an image", WHERE, OPEN))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_truncated_images(fmt: str) -> None:
    data = _encode(_pixels(64, 64), fmt)
    for cut in (len(data) * 2 // 3, 30):
        message = _error(lambda: load_image(data[:cut], WHERE, OPEN))
        assert "truncated" in message and ("PNG" in message or "JPEG" in message or "WebP" in message)


def test_pixel_cap_is_checked_from_the_header() -> None:
    # 8000x8000 1-bit PNG: a few kB on the wire, 64 Mpx (192 MB as RGB) decoded.
    data = _encode(Image.new("1", (8000, 8000)), "PNG")
    assert len(data) < 100_000
    message = _error(lambda: load_image(data, WHERE, OPEN))
    assert "expected at most 40000000 pixels, got 8000x8000 = 64000000" in message
    small_cap = ImageAccess(max_image_pixels=1000)
    assert "got 48x32 = 1536" in _error(lambda: load_image(_encode(_pixels(), "PNG"), WHERE, small_cap))
    assert "got 48x32 = 1536" in _error(lambda: load_image(_pixels(), WHERE, small_cap))


@pytest.mark.parametrize("pixels", [1500, 2500])  # over Pillow's cap (a warning), over twice it (an error)
def test_pillows_decompression_bomb_check_is_named(monkeypatch: pytest.MonkeyPatch, pixels: int) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = _encode(Image.new("RGB", (pixels // 10, 10)), "PNG")
    assert "decompression bomb" in _error(lambda: load_image(data, WHERE, ImageAccess(max_image_pixels=10**9)))


def test_byte_cap() -> None:
    data = _encode(_pixels(), "PNG")
    access = ImageAccess(max_image_bytes=len(data) - 1)
    assert f"expected at most {len(data) - 1} bytes" in _error(lambda: load_image(data, WHERE, access))
    assert f"expected at most {len(data) - 1} bytes" in _error(
        lambda: image_from_url(_data_url(data + b"\0" * 64), WHERE, access))


def test_unknown_scheme() -> None:
    assert "got scheme 'ftp'" in _error(lambda: image_from_url("ftp://example.com/x.png", WHERE, OPEN))
    assert "empty string" in _error(lambda: image_from_url("  ", WHERE, OPEN))


def test_access_config_errors() -> None:
    with pytest.raises(ConfigError, match="wildcards"):
        ImageAccess(allowed_domains=("*",))
    with pytest.raises(ConfigError, match="max_image_pixels"):
        ImageAccess(max_image_pixels=0)


# --- local files -----------------------------------------------------------------------------------

def test_file_urls_and_str_paths_need_the_allow_list(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    inside, outside = allowed / "a.png", tmp_path / "b.png"
    _pixels().save(inside)
    _pixels().save(outside)
    for url in (inside.as_uri(), str(inside)):
        assert "not allowed" in _error(lambda: image_from_url(url, WHERE, OPEN))
    access = ImageAccess(allowed_local_paths=(allowed,))
    for url in (inside.as_uri(), str(inside), "file://localhost" + str(inside)):
        assert np.array_equal(np.asarray(image_from_url(url, WHERE, access)), np.asarray(_pixels()))
    for url in (outside.as_uri(), str(allowed / ".." / "b.png")):
        assert "expected a file under one of the allowed local paths" in _error(
            lambda: image_from_url(url, WHERE, access))
    (allowed / "link.png").symlink_to(outside)
    assert "allowed local paths" in _error(lambda: image_from_url(str(allowed / "link.png"), WHERE, access))
    assert "readable image file" in _error(lambda: image_from_url(str(allowed / "missing.png"), WHERE, access))
    assert "on this host" in _error(lambda: image_from_url("file://other/x.png", WHERE, access))


# --- http(s) ---------------------------------------------------------------------------------------

PNG = _encode(_pixels(), "PNG")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/ok.png":
            self._send(200, PNG)
        elif self.path == "/big.png":
            self._send(200, PNG + b"\0" * 4096)
        elif self.path == "/chunked.png":  # no Content-Length: the cap holds while reading
            self.send_response(200)
            self.end_headers()
            self.wfile.write(PNG + b"\0" * 4096)
        elif self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "http://localhost:1/x.png")
            self.end_headers()
        elif self.path == "/here":
            self.send_response(302)
            self.send_header("Location", "/ok.png")
            self.end_headers()
        elif self.path == "/slow.png":
            time.sleep(1.5)
            self._send(200, PNG)
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_http_refused_by_default(server: str) -> None:
    message = _error(lambda: image_from_url(f"{server}/ok.png", WHERE, OPEN))
    assert "host '127.0.0.1' are not allowed (allowed domains: none)" in message
    other = ImageAccess(allowed_domains=("example.com",))
    assert "allowed domains: example.com" in _error(lambda: image_from_url(f"{server}/ok.png", WHERE, other))


def test_http_allowed_host(server: str) -> None:
    access = ImageAccess(allowed_domains=("127.0.0.1",))
    for path in ("/ok.png", "/here"):
        image = image_from_url(f"{server}{path}", WHERE, access)
        assert np.array_equal(np.asarray(image), np.asarray(_pixels()))


def test_http_errors(server: str) -> None:
    access = ImageAccess(allowed_domains=("127.0.0.1",), max_image_bytes=len(PNG) + 100, fetch_timeout_s=0.5)
    assert "HTTP 404" in _error(lambda: image_from_url(f"{server}/missing.png", WHERE, access))
    assert "Content-Length" in _error(lambda: image_from_url(f"{server}/big.png", WHERE, access))
    assert f"expected at most {len(PNG) + 100} bytes" in _error(
        lambda: image_from_url(f"{server}/chunked.png", WHERE, access))
    assert "redirect to a host not allowed" in _error(lambda: image_from_url(f"{server}/away", WHERE, access))
    assert "failed to fetch the image from 127.0.0.1" in _error(
        lambda: image_from_url(f"{server}/slow.png", WHERE, access))


# --- digest ----------------------------------------------------------------------------------------

def test_image_digest() -> None:
    image = _pixels()
    webp = load_image(_encode(image, "WEBP", lossless=True), WHERE, OPEN)
    assert len(image_digest(image)) == 16
    assert image_digest(image) == image_digest(webp)
    changed = image.copy()
    changed.putpixel((3, 4), (0, 0, 0) if image.getpixel((3, 4)) != (0, 0, 0) else (1, 1, 1))
    assert image_digest(changed) != image_digest(image)
    # Same bytes, other shape or mode: other digest.
    flat = Image.frombytes("RGB", (32, 48), image.tobytes())
    assert image_digest(flat) != image_digest(image)
    assert image_digest(Image.frombytes("L", (144, 32), image.tobytes())) != image_digest(image)


def test_access_lists_must_be_lists() -> None:
    with pytest.raises(ConfigError, match="allowed_domains must be a list"):
        ImageAccess(allowed_domains="example.com")  # type: ignore[arg-type]
    access = ImageAccess(allowed_domains=["Example.COM"], allowed_local_paths=["~"])  # type: ignore[arg-type]
    assert access.allowed_domains == ("example.com",) and access.allowed_local_paths == (Path.home().resolve(),)
