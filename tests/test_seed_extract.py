"""Unpacking an environment image's workspace seed (a .venv, node_modules) on the host."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from orchestrator.runner import seed


def _archive(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _file(name: str, data: bytes, mode: int = 0o644, uid: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode, info.uid, info.gid, info.uname, info.gname = mode, uid, uid, "", ""
    return info, data


def _spool(buf: io.BytesIO, tmp_path):
    # the runner hands the archive over as a file on disk
    path = tmp_path / "seed.tar"
    path.write_bytes(buf.getvalue())
    return open(path, "rb")


@pytest.mark.parametrize("tar_on_path", [True, False], ids=["system-tar", "tarfile"])
def test_a_seed_unpacks_with_its_owners_modes_and_links(tmp_path, monkeypatch, tar_on_path):
    if not tar_on_path:
        monkeypatch.setattr(seed.shutil, "which", lambda name: None)
    link = tarfile.TarInfo(".venv/bin/python")
    link.type, link.linkname = tarfile.SYMTYPE, "python3"
    members = [
        _file(".venv/bin/python3", b"#!bin", mode=0o755, uid=1000),
        (link, None),
        _file(".venv/pyvenv.cfg", b"home = /usr/bin\n", mode=0o640, uid=1000),
    ]
    with _spool(_archive(members), tmp_path) as spool:
        seed._extract(spool, tmp_path / "x")
    venv = tmp_path / "x" / ".venv"
    assert (venv / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert os.readlink(venv / "bin" / "python") == "python3"
    st = os.stat(venv / "bin" / "python3")
    assert (st.st_mode & 0o777, st.st_uid) == (0o755, 1000 if os.geteuid() == 0 else os.geteuid())
    assert (os.stat(venv / "pyvenv.cfg").st_mode & 0o777) == 0o640


@pytest.mark.parametrize("tar_on_path", [True, False], ids=["system-tar", "tarfile"])
@pytest.mark.parametrize("escape", ["dotdot", "through-a-link"])
def test_a_seed_that_reaches_outside_its_folder_is_refused_and_writes_nothing_there(
    tmp_path, monkeypatch, tar_on_path, escape
):
    if not tar_on_path:
        monkeypatch.setattr(seed.shutil, "which", lambda name: None)
    outside = tmp_path / "outside"
    outside.mkdir()
    if escape == "dotdot":
        members = [_file("seed/ok.txt", b"ok"), _file("../outside/evil.txt", b"evil")]
    else:
        link = tarfile.TarInfo("seed/link")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        members = [(link, None), _file("seed/link/evil.txt", b"evil")]
    with _spool(_archive(members), tmp_path) as spool, pytest.raises(OSError):
        seed._extract(spool, tmp_path / "into" / "x")
    assert list(outside.iterdir()) == []
