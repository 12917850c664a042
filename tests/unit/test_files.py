"""A file replaced in one step, with the mode it asks for and nothing left beside it."""

import os
import stat

from infergate.files import write_atomically


def test_the_file_is_replaced_whole_and_no_partial_file_stays(tmp_path):
    target = tmp_path / "table.json"
    target.write_text("old")
    write_atomically(target, '{"new": "é"}')
    assert target.read_text(encoding="utf-8") == '{"new": "é"}'
    write_atomically(target, b"bytes")
    assert target.read_bytes() == b"bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]


def test_a_file_of_secrets_is_readable_by_its_owner_only(tmp_path):
    target = tmp_path / "keys.yaml"
    write_atomically(target, "digest: x\n", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    write_atomically(tmp_path / "page.http", b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "page.http").stat().st_mode) == 0o666 & ~umask


def test_a_partial_file_a_crash_left_does_not_lend_its_mode(tmp_path):
    target = tmp_path / "keys.yaml"
    leftover = tmp_path / "keys.yaml.partial"
    leftover.write_text("half")
    leftover.chmod(0o644)
    write_atomically(target, "digest: x\n", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_text() == "digest: x\n" and not leftover.exists()
