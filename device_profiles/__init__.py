"""Facts about the device, and the catalogue of known devices they are matched against.

Standard library only (pyopencl is asked lazily, when installed)::

    from device_profiles import probe, match
    profile = probe("/")            # JSON-serialisable facts
    m = match(profile)              # m.name, m.reasons, m.backend_order, m.hints

This package imports nothing from ``backends`` or ``edge_runtime``.
"""

from __future__ import annotations

from device_profiles.catalog import CatalogEntry, CatalogError, ProfileMatch, load_catalog, match
from device_profiles.probe import probe

__all__ = ["CatalogEntry", "CatalogError", "ProfileMatch", "load_catalog", "match", "probe"]
