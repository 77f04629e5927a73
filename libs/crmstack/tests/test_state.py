import os
import subprocess
import sys
from pathlib import Path

from crmstack.state import LauncherLock, Recorded, read_state, recorded_processes, write_state


def test_one_launcher_lock_per_data_folder_released_with_its_holder(tmp_path: Path) -> None:
    first, second = LauncherLock(tmp_path), LauncherLock(tmp_path)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_a_recorded_pid_is_running_only_while_the_same_process_holds_it(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        recorded = Recorded.of("sleeper", child.pid)
        assert recorded is not None
        assert recorded.is_running()
        reused = Recorded("sleeper", child.pid, recorded.started - 1)  # same PID, another one
        assert not reused.is_running()
        write_state(tmp_path, {"processes": [recorded.as_json(), {"name": "broken"}]})
        assert recorded_processes(read_state(tmp_path)) == [recorded]
    finally:
        child.kill()
        child.wait()
    assert not recorded.is_running()
    assert Recorded.of("me", os.getpid()) is not None
