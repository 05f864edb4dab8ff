"""The packaged catalogue, the matching rules, and what a malformed catalogue file says."""

from __future__ import annotations

import pytest

from device_profiles import CatalogError, load_catalog, match
from device_profiles.rules import RULES

REQUIRED = {"generic-arm64-android", "adreno-phone", "mali-phone", "cloud-phone-container",
            "cloud-phone-vgpu", "x86_64-linux-dev"}


def _entry(directory, name, text):
    (directory / f"{name}.toml").write_text(text)


def test_packaged_catalogue_loads_and_is_complete():
    catalog = load_catalog()
    assert REQUIRED <= set(catalog)
    for name, entry in catalog.items():
        assert entry.name == name and entry.description
        assert "cpu" in entry.backend_order
        assert all(rule in RULES for rule, _ in entry.rules)
    for name in REQUIRED - {"x86_64-linux-dev"}:
        assert catalog[name].backend_order[-1] == "cpu", name
    assert catalog["adreno-phone"].backend_order == ("opencl", "tflite", "cpu")
    assert catalog["mali-phone"].backend_order[0] == "tflite"
    assert catalog["mali-phone"].hints["delegate"]["library"].endswith("delegate.so")
    assert catalog["cloud-phone-container"].backend_order == ("tflite", "cpu")


def test_catch_all_matches_an_empty_profile():
    m = match({})
    assert m.name == "generic"
    assert m.backend_order[0] == "cpu" and "opencl" not in m.backend_order  # no OpenCL device in {}
    assert any("catch-all" in r for r in m.reasons)


def test_partial_profile_is_enough():
    m = match({"os": "android", "arch": "aarch64", "opencl": {"devices": [{"type": "gpu", "software": False}]}})
    assert m.name == "generic-arm64-android"
    assert m.backend_order == ("tflite", "opencl", "cpu")
    assert m.to_dict()["backend_order"] == ["tflite", "opencl", "cpu"]


def test_highest_priority_then_most_rules_then_name(tmp_path):
    order = '[backends]\norder = ["cpu"]\n'
    _entry(tmp_path, "b-two-rules", f'priority = 5\n[match]\nos = "linux"\narch = "x86_64"\n{order}')
    _entry(tmp_path, "a-two-rules", f'priority = 5\n[match]\nos = "linux"\narch = ["x86_64", "aarch64"]\n{order}')
    _entry(tmp_path, "c-one-rule", f'priority = 5\n[match]\nos = "linux"\n{order}')
    _entry(tmp_path, "d-low", f'priority = 1\n[match]\nos = "linux"\narch = "x86_64"\nmin_usable_cores = 1\n'
                              f'{order}')
    profile = {"os": "linux", "arch": "x86_64", "cpu": {"usable_cores": 2}}
    m = match(profile, tmp_path)
    assert m.name == "a-two-rules"
    assert any(r.startswith("preferred over b-two-rules") for r in m.reasons)

    _entry(tmp_path, "e-high", f'priority = 9\n[match]\nmin_memory_gib = 1.5\n{order}')
    assert match({**profile, "memory": {"usable_bytes": 2 << 30}}, tmp_path).name == "e-high"
    m = match({**profile, "memory": {"usable_bytes": 1 << 30}}, tmp_path)
    assert m.name == "a-two-rules"
    assert "not e-high: memory_gib >= 1.5 (probe: 1.00)" in m.reasons


def test_no_matching_entry_is_an_error(tmp_path):
    _entry(tmp_path, "phones", '[match]\nos = "android"\n[backends]\norder = ["cpu"]\n')
    with pytest.raises(CatalogError, match="no catalogue entry matches.*os is 'android'"):
        match({"os": "linux"}, tmp_path)


@pytest.mark.parametrize(("text", "message"), [
    ('[match]\ncolour = "red"\n[backends]\norder = ["cpu"]\n', "unknown match rule 'colour'"),
    ('[match]\nandroid = "yes"\n[backends]\norder = ["cpu"]\n', "'android' expects true/false"),
    ('[match]\nmin_usable_cores = "4"\n[backends]\norder = ["cpu"]\n', "expects a number"),
    ('[backends]\norder = ["opencl", "npu", "cpu"]\n', "order must list backends"),
    ('[backends]\norder = ["opencl"]\n', "must name 'cpu'"),
    ('priority = "high"\n[backends]\norder = ["cpu"]\n', "priority must be an integer"),
    ('[backends]\norder = ["tflite", "cpu"]\n[delegate]\nlibrary = "/vendor/lib64/libfoo.so"\n',
     "TFLite \\*delegate\\*.so"),
    ('[backends]\norder = ["tflite", "cpu"]\n[delegate]\nlibrary = "/vendor/lib64/libgpu_delegate.so"\n'
     'options = { threads = 4 }\n', "options must be a table of strings"),
    ('[backends\norder = ["cpu"]\n', "bad.toml"),
])
def test_malformed_entry_names_file_and_key(tmp_path, text, message):
    _entry(tmp_path, "bad", text)
    with pytest.raises(CatalogError, match=message) as caught:
        load_catalog(tmp_path, known_backends=("cpu", "opencl", "vulkan", "tflite"))
    assert "bad.toml" in str(caught.value)


def test_backend_names_are_checked_against_the_names_the_caller_knows(tmp_path):
    # device_profiles knows no backends: without known_backends any identifier passes, a non-name does not.
    _entry(tmp_path, "npu", '[backends]\norder = ["npu", "cpu"]\n')
    assert load_catalog(tmp_path)["npu"].backend_order == ("npu", "cpu")
    with pytest.raises(CatalogError, match="order must list backends"):
        load_catalog(tmp_path, known_backends=("cpu",))
    _entry(tmp_path, "npu", '[backends]\norder = ["Open CL", "cpu"]\n')
    with pytest.raises(CatalogError, match="lowercase identifiers"):
        load_catalog(tmp_path)


def test_empty_catalogue_dir_is_an_error(tmp_path):
    with pytest.raises(CatalogError, match="no \\*.toml entries"):
        load_catalog(tmp_path)
