"""The embedded PostgreSQL runs as an unprivileged user when the launcher is root: the folders
above its data and its binaries are made passable for that user (search bit only), so a checkout
under a private folder (mktemp -d, /root) still starts it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from crmstack.infra import _make_traversable


def test_every_folder_above_a_path_becomes_passable_but_not_listable(tmp_path: Path) -> None:
    private = tmp_path / "private"
    binaries = private / "repo" / ".venv" / "bin"
    binaries.mkdir(parents=True)
    for folder in (private, private / "repo", private / "repo" / ".venv", binaries):
        os.chmod(folder, 0o700)

    _make_traversable(binaries)

    for folder in (tmp_path, private, private / "repo", private / "repo" / ".venv", binaries):
        mode = folder.stat().st_mode
        assert mode & stat.S_IXOTH, folder
    assert not private.stat().st_mode & stat.S_IROTH  # passable, not listable
    assert stat.S_IMODE(private.stat().st_mode) == 0o701
