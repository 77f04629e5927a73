import os
import subprocess
import sys
from pathlib import Path

import pytest

from crmstack.stack import Stack, StackConfig, StackError
from crmstack.state import LauncherLock, Recorded, write_state


def test_a_second_launcher_on_the_same_data_refuses_naming_the_stop_command(
    tmp_path: Path,
) -> None:
    holder = LauncherLock(tmp_path)
    assert holder.acquire()
    launcher = Recorded.of("launcher", os.getpid())
    assert launcher is not None
    write_state(tmp_path, {"launcher": launcher.as_json(), "processes": []})
    try:
        with pytest.raises(StackError) as refused:
            Stack(StackConfig(data_dir=tmp_path)).claim_data_dir()
    finally:
        holder.release()
    assert f"already running from {tmp_path} (launcher PID {os.getpid()})" in str(refused.value)
    assert f"`python -m crmstack stop --data-dir {tmp_path}`" in str(refused.value)


def test_processes_a_dead_launcher_left_running_are_stopped_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = Stack(StackConfig(data_dir=tmp_path))
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        recorded = Recorded.of("records", left.pid)
        assert recorded is not None
        write_state(tmp_path, {"launcher": None, "processes": [recorded.as_json()]})
        stack.claim_data_dir()
        assert left.wait(20) is not None
        assert f"left running: records (PID {left.pid})" in capsys.readouterr().out
    finally:
        left.kill()
        left.wait()
        stack.stop()
