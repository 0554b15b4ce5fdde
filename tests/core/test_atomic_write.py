"""The package's one atomic write (:func:`digirl_lite.paths.atomic_write_text`): all at
once, in UTF-8 whatever the locale, and nothing left behind when it fails."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from digirl_lite import paths
from digirl_lite.paths import atomic_write_text


def test_writes_and_replaces(tmp_path):
    p = tmp_path / "a.json"
    atomic_write_text(p, "one")
    atomic_write_text(str(p), "two")  # a str path too
    assert p.read_text() == "two"
    assert os.listdir(tmp_path) == ["a.json"]


@pytest.mark.parametrize("fail", ["encode", "fsync", "replace"])
def test_a_failed_write_leaves_no_temporary_file_and_the_old_content(tmp_path, monkeypatch,
                                                                      fail):
    p = tmp_path / "a.json"
    p.write_text("old")
    text = "new"
    if fail == "encode":
        text = "new \ud800"  # a lone surrogate: not UTF-8, raises half way through the write
    else:
        def boom(*a):
            raise OSError(f"{fail} failed")

        monkeypatch.setattr(paths.os, fail, boom)
    with pytest.raises((OSError, UnicodeEncodeError)):
        atomic_write_text(p, text)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["a.json"]
    assert p.read_text() == "old"


def test_an_interrupt_leaves_no_temporary_file(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(paths.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "a.json", "x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_utf8_under_an_ascii_locale(tmp_path):
    """The C locale without Python's UTF-8 mode: the locale's encoding is ASCII, where
    ``open(..., "w")`` without an encoding could not write the text at all."""
    p = tmp_path / "a.txt"
    text = "caf\u00e9 \u2192 \u6f22\u5b57"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0"}
    code = ("import locale, sys; from pathlib import Path; "
            "from digirl_lite.paths import atomic_write_text; "
            "assert locale.getpreferredencoding(False).lower() in ('ascii', 'ansi_x3.4-1968'), "
            "locale.getpreferredencoding(False); "
            f"atomic_write_text(Path(sys.argv[1]), {ascii(text)})")  # the code is ASCII
    r = subprocess.run([sys.executable, "-c", code, str(p)], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert p.read_bytes() == text.encode("utf-8")


def test_permissions_follow_the_umask(tmp_path):
    """As ``open()`` makes a file (0o666 less the umask), not a temporary file's 0o600: a
    results file stays readable by the group that reads the folder."""
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


def test_the_temporary_file_is_in_the_same_folder_with_its_own_name(tmp_path, monkeypatch):
    seen: list[str] = []
    real = os.replace

    def spy(src, dst):
        seen.append(os.fspath(src))
        real(src, dst)

    monkeypatch.setattr(paths.os, "replace", spy)
    atomic_write_text(tmp_path / "a.json", "1")
    atomic_write_text(tmp_path / "a.json", "2")
    assert len(set(seen)) == 2  # not a fixed ".tmp" two writers would share
    assert all(Path(s).parent == tmp_path and Path(s).name.startswith(".a.json.")
               for s in seen)
