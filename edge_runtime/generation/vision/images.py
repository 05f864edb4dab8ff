"""Image inputs: PIL images, bytes, paths and URLs decoded into fully loaded RGB images.

Accepted encodings are PNG, JPEG and WebP (what Pillow decodes among them); anything else,
empty or oversized data, bad base64, undecodable or truncated files and decompression bombs
raise :class:`InvalidInputError` whose message starts with the caller's ``where`` (e.g.
``messages[1].content[2].image_url``) and says what was expected and what came.

Remote and local sources are refused unless :class:`ImageAccess` allows them: by default
only ``data:`` URLs, raw bytes, PIL images and ``pathlib.Path`` objects (which only a
Python caller can make) are read. A ``str`` is always treated as a URL (a bare path as a
``file`` URL), so text that arrived over the wire never reaches the file system unchecked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.errors import ConfigError, InvalidInputError

if TYPE_CHECKING:
    from PIL import Image

FORMATS = ("PNG", "JPEG", "WEBP")

# Leading bytes of formats people send that we refuse, only to name them in the error.
_OTHER_MAGIC = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
                (b"MM\x00*", "TIFF"), (b"\x00\x00\x01\x00", "ICO"), (b"%PDF", "PDF"),
                (b"<svg", "SVG"), (b"<?xml", "XML/SVG"))
_DATA_MEDIA_TYPES = ("", "application/octet-stream")
_FETCH_CHUNK = 1 << 16


@dataclass(frozen=True)
class ImageAccess:
    """What image sources may be read (``[vision]`` in a model's config.toml); default: fetch nothing.

    ``allowed_domains``: hosts whose ``http(s)`` URLs may be fetched (exact host names,
    case-insensitive; redirects must stay on them). ``allowed_local_paths``: ``file`` URLs
    and ``str`` paths must resolve under one of these folders. ``max_image_bytes`` caps the
    encoded size, ``max_image_pixels`` the decoded width*height (read from the header,
    before decoding). ``fetch_timeout_s`` bounds each network operation of a fetch.
    """

    allowed_domains: tuple[str, ...] = ()
    allowed_local_paths: tuple[Path, ...] = ()
    max_image_bytes: int = 20 * 2**20
    max_image_pixels: int = 40_000_000
    fetch_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for key in ("allowed_domains", "allowed_local_paths"):
            if isinstance(getattr(self, key), (str, bytes, os.PathLike)):
                raise ConfigError(f"[vision] {key} must be a list, got {getattr(self, key)!r}")
        domains = tuple(str(d).strip().lower() for d in self.allowed_domains)
        for domain in domains:
            if not domain or "*" in domain or "/" in domain:
                raise ConfigError(f"[vision] allowed_domains: expected host names, got {domain!r} "
                                  "(wildcards are not allowed)")
        object.__setattr__(self, "allowed_domains", domains)
        object.__setattr__(self, "allowed_local_paths",
                           tuple(Path(p).expanduser().resolve() for p in self.allowed_local_paths))
        for key in ("max_image_bytes", "max_image_pixels"):
            if getattr(self, key) < 1:
                raise ConfigError(f"[vision] {key} must be >= 1, got {getattr(self, key)}")
        if not self.fetch_timeout_s > 0:
            raise ConfigError(f"[vision] fetch_timeout_s must be > 0, got {self.fetch_timeout_s}")


def image_from_url(url: str, where: str, access: ImageAccess) -> Image.Image:
    """Decode the image at ``url``: ``data:`` (base64 only), ``http(s)`` or ``file``.

    A string without a scheme is a local path, under the same rule as ``file`` URLs.
    Returns a fully loaded RGB image; raises :class:`InvalidInputError`.
    """
    if not isinstance(url, str):
        raise InvalidInputError(f"{where}: expected a URL string, got {type(url).__name__}")
    text = url.strip()
    scheme = text.split(":", 1)[0].lower() if ":" in text else ""
    if scheme == "data":
        return decode_image(_data_url_bytes(text, where, access), where, access)
    if scheme in ("http", "https"):
        return decode_image(_fetch(text, where, access), where, access)
    if scheme == "file":
        parsed = urllib.parse.urlsplit(text)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidInputError(f"{where}: expected a file URL on this host, got host {parsed.netloc!r}")
        return decode_image(_read_local(Path(urllib.request.url2pathname(parsed.path)), where, access),
                            where, access)
    if not text:
        raise InvalidInputError(f"{where}: expected an image URL, got an empty string")
    if len(scheme) > 1 and scheme.isascii() and scheme.replace("+", "").replace("-", "").isalnum():
        raise InvalidInputError(f"{where}: expected a data:, http(s) or file URL, got scheme {scheme!r}")
    return decode_image(_read_local(Path(text), where, access), where, access)


def load_image(source: Image.Image | bytes | str | os.PathLike, where: str,
               access: ImageAccess) -> Image.Image:
    """Any image input of the embedded API as a fully loaded RGB image.

    A PIL image is converted (its pixel count is checked too); bytes are decoded; a
    ``str`` is a URL (see :func:`image_from_url`); an ``os.PathLike`` is read as given,
    without the allow-list (only a Python caller can pass one).
    """
    from PIL import Image

    if isinstance(source, Image.Image):
        _check_pixels(source.size, where, access)
        try:
            source.load()
            return source if source.mode == "RGB" else source.convert("RGB")
        except (OSError, ValueError, SyntaxError) as exc:
            raise InvalidInputError(f"{where}: expected a decodable image, got {exc}") from exc
    if isinstance(source, (bytes, bytearray, memoryview)):
        return decode_image(bytes(source), where, access)
    if isinstance(source, str):
        return image_from_url(source, where, access)
    if isinstance(source, os.PathLike):
        return decode_image(_read_file(Path(source), where, access), where, access)
    raise InvalidInputError(f"{where}: expected a PIL image, bytes, a path or a URL, "
                            f"got {type(source).__name__}")


def image_size(source: object, access: ImageAccess) -> tuple[int, int] | None:
    """(width, height) of an image input as it will be decoded, read from its header only; None when
    that is not known without fetching or reading a file (http(s), file and path inputs) or the
    input is bad (decoding it later names the fault)."""
    from PIL import Image

    try:
        if isinstance(source, Image.Image):
            return source.size
        if isinstance(source, str) and source.strip()[:5].lower() == "data:":
            source = _data_url_bytes(source.strip(), "image", access)
        if not isinstance(source, (bytes, bytearray, memoryview)):
            return None
        with warnings.catch_warnings():  # a bomb is refused by the decode that follows, not here
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(bytes(source)), formats=FORMATS)  # reads the header only
        with image:
            width, height = image.size
            # EXIF orientations 5-8 turn the image a quarter (decoding applies them), which changes a
            # tiled image's rows and columns. Read for JPEG only, whose EXIF precedes the pixels:
            # PNG's getexif decodes the whole image (an eXIf chunk may follow the data); a rotated PNG
            # is rare, and costs at most a mis-estimate of a few marker tokens.
            turned = image.format == "JPEG" and image.getexif().get(0x0112) in (5, 6, 7, 8)
            return (height, width) if turned else (width, height)
    except (InvalidInputError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def decode_image(data: bytes, where: str, access: ImageAccess) -> Image.Image:
    """Decode PNG/JPEG/WebP bytes into a fully loaded RGB image (EXIF orientation applied)."""
    from PIL import Image, ImageOps

    if not data:
        raise InvalidInputError(f"{where}: expected image data, got 0 bytes")
    if len(data) > access.max_image_bytes:
        raise InvalidInputError(f"{where}: expected at most {access.max_image_bytes} bytes of image data, "
                                f"got {len(data)}")
    # NOTE: catch_warnings is process-wide state; the worst a concurrent decode can see is
    # this filter (an over-size image then fails there too, as it would by our own cap).
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=FORMATS)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise InvalidInputError(f"{where}: expected at most {access.max_image_pixels} pixels, "
                                    f"got a decompression bomb ({exc})") from exc
        except Image.UnidentifiedImageError as exc:
            raise InvalidInputError(f"{where}: expected a PNG, JPEG or WebP image, "
                                    f"got {_describe(data)}") from exc
        except (OSError, ValueError, SyntaxError) as exc:
            raise InvalidInputError(f"{where}: expected a PNG, JPEG or WebP image, got "
                                    f"{_describe(data)} ({exc})") from exc
        _check_pixels(image.size, where, access)
        try:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
            return image if image.mode == "RGB" else image.convert("RGB")
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise InvalidInputError(f"{where}: expected a complete {image.format} image, got an "
                                    f"undecodable or truncated one ({exc})") from exc


def image_digest(image: Image.Image) -> bytes:
    """A 16-byte content hash of ``image`` (mode, size and pixels): equal pixels, equal digest."""
    # SHA-256 (truncated): CPUs have instructions for it (ARMv8 crypto, x86 SHA-NI); blake2b has none.
    digest = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    digest.update(image.tobytes())
    return digest.digest()[:16]


def _check_pixels(size: tuple[int, int], where: str, access: ImageAccess) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise InvalidInputError(f"{where}: expected a non-empty image, got {width}x{height} pixels")
    if width * height > access.max_image_pixels:
        raise InvalidInputError(f"{where}: expected at most {access.max_image_pixels} pixels, got "
                                f"{width}x{height} = {width * height} (decompression-bomb cap)")


def _describe(data: bytes) -> str:
    head = data[:16].lstrip()
    name = ("PNG" if data.startswith(b"\x89PNG") else "JPEG" if data.startswith(b"\xff\xd8\xff")
            else "WebP" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else None)
    if name is not None:
        return f"a truncated or corrupt {name} file ({len(data)} bytes)"
    for magic, name in _OTHER_MAGIC:
        if head.startswith(magic):
            return f"a {name} image (unsupported format)"
    if data[:4] == b"RIFF" and data[8:12] != b"WEBP":
        return "a RIFF file that is not WebP"
    if data[4:8] == b"ftyp":
        return f"an ISO media file ({data[8:12].decode('ascii', 'replace')}; HEIC/AVIF are unsupported)"
    return f"{len(data)} bytes starting {data[:8]!r}"


def _data_url_bytes(url: str, where: str, access: ImageAccess) -> bytes:
    """RFC 2397 with vLLM's rules: a ',' must follow the header, and only ``;base64`` is accepted."""
    header, sep, payload = url[len("data:"):].partition(",")
    if not sep:
        raise InvalidInputError(f"{where}: invalid data URL: expected 'data:<type>;base64,<data>', "
                                "missing ',' separator")
    media_type, _, params = header.partition(";")
    if params.split(";")[-1].strip().lower() != "base64":
        raise InvalidInputError(f"{where}: expected a base64 data URL ('data:<type>;base64,...'), "
                                f"got header {header[:60]!r} (only base64 data URLs are supported)")
    media_type = media_type.strip().lower()
    if not (media_type.startswith("image/") or media_type in _DATA_MEDIA_TYPES):
        raise InvalidInputError(f"{where}: expected an image/* data URL, got media type {media_type[:60]!r}")
    # Line breaks inside base64 (RFC 2045 wrapping) are common in pasted data; nothing else is skipped.
    payload = "".join(payload.split())
    if len(payload) // 4 * 3 > access.max_image_bytes + 2:
        raise InvalidInputError(f"{where}: expected at most {access.max_image_bytes} bytes of image data, "
                                f"got about {len(payload) // 4 * 3} in the data URL")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError(f"{where}: expected base64 image data in the data URL, got invalid "
                                f"base64 ({exc})") from exc


def _read_local(path: Path, where: str, access: ImageAccess) -> bytes:
    """A local file named by a request: it must resolve under an allowed folder."""
    if not access.allowed_local_paths:
        raise InvalidInputError(f"{where}: local image files are not allowed (no [vision] "
                                "allowed_local_paths); send the image as a data: URL")
    resolved = path.expanduser().resolve()
    if not any(resolved.is_relative_to(root) for root in access.allowed_local_paths):
        raise InvalidInputError(f"{where}: expected a file under one of the allowed local paths "
                                f"({', '.join(map(str, access.allowed_local_paths))}), got {str(path)!r}")
    return _read_file(resolved, where, access)


def _read_file(path: Path, where: str, access: ImageAccess) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(access.max_image_bytes + 1)
    except OSError as exc:
        raise InvalidInputError(f"{where}: expected a readable image file, got {str(path)!r} "
                                f"({exc.strerror or exc})") from exc
    if len(data) > access.max_image_bytes:
        raise InvalidInputError(f"{where}: expected at most {access.max_image_bytes} bytes of image data, "
                                f"got more in {str(path)!r}")
    return data


def _host_allowed(url: str, access: ImageAccess) -> bool:
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme.lower() in ("http", "https") and (parsed.hostname or "") in access.allowed_domains


class _AllowListRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host: the allow-list must hold for every hop."""

    def __init__(self, access: ImageAccess) -> None:
        self._access = access

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's API)
        if not _host_allowed(newurl, self._access):
            raise urllib.error.HTTPError(newurl, code, f"redirect to a host not allowed: {newurl[:200]}",
                                         headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _fetch(url: str, where: str, access: ImageAccess) -> bytes:
    """GET an allowed ``http(s)`` URL with the stdlib, capped at ``max_image_bytes``.

    Proxies from the environment are not used: the allow-list is about where the daemon
    connects, and nothing below the facade reads the environment.
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    if not _host_allowed(url, access):
        allowed = ", ".join(access.allowed_domains) or "none"
        raise InvalidInputError(f"{where}: image URLs from host {host!r} are not allowed (allowed "
                                f"domains: {allowed}); send the image as a data: URL")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _AllowListRedirects(access))
    request = urllib.request.Request(url, headers={"User-Agent": "edge-runtime", "Accept": "image/*"})
    # The socket timeout bounds each read; the deadline bounds a server that drips bytes.
    deadline = time.monotonic() + access.fetch_timeout_s
    chunks: list[bytes] = []
    size = 0
    try:
        with opener.open(request, timeout=access.fetch_timeout_s) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > access.max_image_bytes:
                raise InvalidInputError(f"{where}: expected at most {access.max_image_bytes} bytes of "
                                        f"image data, got Content-Length {length} from {host}")
            while size <= access.max_image_bytes:
                chunk = response.read(min(_FETCH_CHUNK, access.max_image_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if time.monotonic() > deadline:
                    raise InvalidInputError(f"{where}: failed to fetch the image from {host}: not "
                                            f"complete within {access.fetch_timeout_s:g} s")
    except InvalidInputError:
        raise
    except urllib.error.HTTPError as exc:
        raise InvalidInputError(f"{where}: failed to fetch the image from {host}: HTTP {exc.code} "
                                f"{exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InvalidInputError(f"{where}: failed to fetch the image from {host}: {reason}") from exc
    if size > access.max_image_bytes:
        raise InvalidInputError(f"{where}: expected at most {access.max_image_bytes} bytes of image data, "
                                f"got more from {host}")
    return b"".join(chunks)
