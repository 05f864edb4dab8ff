"""The catalogue of known devices (``catalog/*.toml``) and matching a profile against it.

Entry format (key = file stem)::

    description = "..."
    priority = 20                      # higher wins among matching entries
    [match]                            # every rule must hold (see rules.RULES); empty = catch-all
    os = "android"
    gpu_vendor = "adreno"
    [backends]
    order = ["opencl", "tflite", "cpu"]
    [delegate]                         # optional TFLite external delegate
    library = "/vendor/lib64/libvulkan_delegate.so"
    options = { backend = "vulkan" }   # strings only: they go to the C API as char*
    [thresholds]                       # and any other tables: passed on as hints
    gpu_busy_threshold = 0.7

Backend names are plain strings here: ``device_profiles`` knows no backends.
The runtime passes the names its backend descriptors know (``known_backends``)
so a misspelled backend is caught at load; without them any lowercase
identifier is accepted.

Matching is deterministic: among entries whose rules all hold, the highest
``priority`` wins, then the one with more rules, then the first name.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from device_profiles.delegates import is_delegate_name
from device_profiles.rules import check, profile_facts, rule_error

log = logging.getLogger(__name__)

PACKAGED_CATALOG = Path(__file__).resolve().parent / "catalog"
_BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Backend names whose presence depends on a device API the probe reports.
_API_FACTS = (("opencl", "has_opencl"), ("vulkan", "has_vulkan"))
_RESERVED = ("description", "priority", "match", "backends")


class CatalogError(ValueError):
    """A catalogue file is malformed, or no entry matches; the message names the file and key."""


@dataclass(frozen=True)
class CatalogEntry:
    """One parsed catalogue file."""

    name: str
    path: str
    description: str
    priority: int
    rules: tuple[tuple[str, Any], ...]
    backend_order: tuple[str, ...]
    hints: dict = field(hash=False)


@dataclass(frozen=True)
class ProfileMatch:
    """The catalogue entry a profile matched, why, and what it implies.

    ``backend_order`` is the entry's order filtered for this device: it always
    contains "cpu" (the fallback that is always there); "opencl"/"vulkan" are
    dropped when the probe found no such device at all (PoCL keeps "opencl");
    "vulkan" is also dropped when its only devices are software ones (lavapipe). ``hints`` is the rest of the TOML
    (delegate, thresholds, …); ``hints["delegate"]["present"]`` says whether the
    probe found the delegate library.
    """

    name: str
    reasons: tuple[str, ...]
    backend_order: tuple[str, ...]
    hints: dict = field(hash=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "reasons": list(self.reasons), "backend_order": list(self.backend_order),
                "hints": self.hints}


def load_catalog(catalog_dir: str | os.PathLike | None = None,
                 known_backends: Collection[str] | None = None) -> dict[str, CatalogEntry]:
    """Every ``*.toml`` in ``catalog_dir`` (None = the packaged catalogue), by name.

    ``known_backends`` (optional) default: any lowercase identifier is a backend name.
    Raises CatalogError naming the file and the offending key when a file is
    malformed (a backend outside ``known_backends`` included), or when the
    directory holds no entry.
    """
    directory = Path(catalog_dir) if catalog_dir is not None else PACKAGED_CATALOG
    entries = {path.stem: _parse(path, known_backends) for path in sorted(directory.glob("*.toml"))}
    if not entries:
        raise CatalogError(f"catalogue {directory}: no *.toml entries")
    return entries


def _is_backend(name: Any, known_backends: Collection[str] | None) -> bool:
    if not isinstance(name, str) or not _BACKEND_NAME.fullmatch(name):
        return False
    return known_backends is None or name in known_backends


def _parse(path: Path, known_backends: Collection[str] | None) -> CatalogEntry:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"catalogue file {path}: {exc}") from exc
    where = f"catalogue file {path}"
    rules = data.get("match", {})
    if not isinstance(rules, dict):
        raise CatalogError(f"{where}: [match] must be a table, got {rules!r}")
    for rule, expected in rules.items():
        if (problem := rule_error(rule, expected)) is not None:
            raise CatalogError(f"{where}: [match] {problem}")
    order = (data.get("backends") or {}).get("order")
    if not isinstance(order, list) or not order or not all(_is_backend(b, known_backends) for b in order):
        known = sorted(known_backends) if known_backends is not None else "lowercase identifiers"
        raise CatalogError(f"{where}: [backends] order must list backends ({known}), got {order!r}")
    if "cpu" not in order or len(set(order)) != len(order):
        raise CatalogError(f"{where}: [backends] order must name 'cpu' and no backend twice, got {order!r}")
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise CatalogError(f"{where}: priority must be an integer, got {priority!r}")
    hints = {k: v for k, v in data.items() if k not in _RESERVED}
    _check_delegate(where, hints.get("delegate"))
    return CatalogEntry(path.stem, str(path), str(data.get("description", "")), priority,
                        tuple(sorted(rules.items())), tuple(order), hints)


def _check_delegate(where: str, delegate: Any) -> None:
    if delegate is None:
        return
    library = delegate.get("library") if isinstance(delegate, dict) else None
    if not isinstance(library, str) or not is_delegate_name(library):
        # NOTE: a library the probe does not report could never be found present.
        raise CatalogError(f"{where}: [delegate] library must be a TFLite *delegate*.so path the probe "
                           f"reports (see delegates.is_delegate_name), got {library!r}")
    options = delegate.get("options", {})
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise CatalogError(f"{where}: [delegate] options must be a table of strings, got {options!r}")


def match(profile: dict, catalog_dir: str | os.PathLike | None = None,
          known_backends: Collection[str] | None = None) -> ProfileMatch:
    """The catalogue entry that fits ``profile`` best, with the reasons and the filtered backend order.

    ``known_backends``: see :func:`load_catalog`. Raises CatalogError when the catalogue is malformed or no entry matches
    (the packaged catalogue has a catch-all, ``generic``).
    """
    facts = profile_facts(profile)
    entries = load_catalog(catalog_dir, known_backends)
    held: dict[str, list[str]] = {}
    rejected: list[str] = []
    for name, entry in entries.items():
        results = [check(rule, expected, facts) for rule, expected in entry.rules]
        failed = [text for ok, text in results if not ok]
        if failed:
            rejected.append(f"not {name}: {'; '.join(failed)}")
        else:
            held[name] = [text for _, text in results]
    if not held:
        raise CatalogError(f"no catalogue entry matches this device: {'; '.join(rejected)}")
    ranked = sorted(held, key=lambda n: (-entries[n].priority, -len(entries[n].rules), n))
    best = entries[ranked[0]]
    reasons = [f"{best.name}: {text}" for text in held[best.name]] or [f"{best.name}: catch-all (no rules)"]
    reasons += [f"preferred over {n}, which also matched: priority {best.priority} vs {entries[n].priority}, "
                f"{len(best.rules)} vs {len(entries[n].rules)} rules" for n in ranked[1:]]
    reasons += rejected
    order, hints, notes = _effective_order(best, profile, facts)
    log.debug("profile matched %s (order %s)", best.name, order)
    return ProfileMatch(best.name, tuple(reasons + notes), order, hints)


def _effective_order(entry: CatalogEntry, profile: dict, facts: dict) -> tuple[tuple[str, ...], dict, list[str]]:
    """The entry's backend order filtered for this device, hints with delegate presence, and notes."""
    order = list(entry.backend_order)
    notes: list[str] = []
    for backend, fact in _API_FACTS:
        if backend in order and not facts[fact]:
            order.remove(backend)
            notes.append(f"{backend} dropped: the probe found no {backend} device")
    if "vulkan" in order and not facts["has_vulkan_gpu"]:
        # NOTE: a software Vulkan device (lavapipe, SwiftShader) runs 20-45x slower than the CPU
        # itself: never chosen automatically, only when asked for by name.
        order.remove("vulkan")
        notes.append("vulkan dropped: only software Vulkan devices (used only when asked for by name)")
    hints = copy.deepcopy(entry.hints)
    delegate = hints.get("delegate")
    if delegate:
        found = {d.get("path") for d in profile.get("tflite_delegates") or []}
        delegate["present"] = delegate["library"] in found
        if not delegate["present"] and "tflite" in order and order.index("tflite") < order.index("cpu"):
            order.remove("tflite")
            order.insert(order.index("cpu"), "tflite")
            notes.append(f"tflite moved down to just before cpu: delegate {delegate['library']} not found, "
                         "so LiteRT would run on XNNPACK (CPU)")
    return tuple(order), hints, notes
