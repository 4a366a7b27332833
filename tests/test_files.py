"""Files written whole, and never rewritten unchanged."""
import os

import pytest

from dlas_predict.files import replace_if_changed, scratch_path, write_if_changed


def test_the_same_bytes_leave_the_file_and_its_time_as_they_were(tmp_path):
    path = tmp_path / "f.bin"
    assert write_if_changed(path, b"one")
    os.utime(path, ns=(1, 1))
    assert not write_if_changed(path, b"one")
    assert path.stat().st_mtime_ns == 1 and path.read_bytes() == b"one"
    assert write_if_changed(path, b"two") and path.read_bytes() == b"two"
    assert list(tmp_path.iterdir()) == [path]  # no scratch file left behind


def test_a_written_scratch_file_replaces_only_a_different_file_and_is_gone(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("a")
    os.utime(path, ns=(1, 1))
    tmp = scratch_path(path)
    assert tmp.parent == path.parent and tmp.name.startswith(".")
    tmp.write_text("a")
    assert not replace_if_changed(tmp, path) and not tmp.exists()
    assert path.stat().st_mtime_ns == 1
    tmp.write_text("b")
    assert replace_if_changed(tmp, path) and not tmp.exists() and path.read_text() == "b"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_if_changed(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


def test_rows_appended_read_back_by_name_and_a_cut_line_is_redone(tmp_path):
    from dlas_predict.files import append_row, read_rows

    path = tmp_path / "out.jsonl"
    assert read_rows(path) == {}
    append_row(path, {"name": "a", "ms": 1.0})
    append_row(path, {"name": "b", "ms": 2.0})
    with path.open("a") as f:
        f.write('{"name": "c", "ms"')  # killed mid-write
    assert sorted(read_rows(path)) == ["a", "b"]
    assert list(read_rows(path, keep=lambda r: r["ms"] > 1.5)) == ["b"]
