"""The lock that makes whole-GPU tests take turns across xdist workers (kits.whole_gpus)."""
import subprocess
import sys

from kits.whole_gpus import whole_gpus

TRY = """
import fcntl, sys
with open(sys.argv[1], "a") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)
"""


def _other_process_gets(lock) -> bool:
    return subprocess.run([sys.executable, "-c", TRY, str(lock)]).returncode == 0


def test_another_process_waits_while_the_lock_is_held_and_gets_it_after(tmp_path):
    lock = tmp_path / "gpus.lock"
    with whole_gpus(lock):
        assert not _other_process_gets(lock)
    assert _other_process_gets(lock)
