"""Fixtures shared by the engine's tests."""

import pytest


@pytest.fixture
def victim(tmp_path):
    """A folder outside the run, which a planted link points at: a file, a
    subfolder and a SavedModel-like name, whose listing and bytes a test checks
    are unchanged (tests/engine/run_dir/test_links.py, runtime/test_files.py)."""
    folder = tmp_path / "victim"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_bytes(b"precious\n")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    (folder / "saved_model.pb").write_bytes(b"not yours")
    return folder
