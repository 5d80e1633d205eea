"""One timed suite run per device at a time: a second run's load would be in the first one's
timings (an SDPA row went from 0.03 to 31.98 ms that way), so it is refused, naming the run that
holds the device. The lock is a file `out/locks/<device>.lock` holding the holder's pid, host, start
time and command; a lock whose process is gone (same host, pid dead) is stale and taken over.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: str  # UTC, ISO 8601
    command: str

    def alive(self) -> bool:
        if self.host != socket.gethostname():
            return True  # another machine's process: cannot tell, so assume it runs
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # exists, owned by someone else
        return True


class DeviceBusy(RuntimeError):
    pass


class RunLock:
    def __init__(self, folder: Path, device: str):
        self.path = folder / f"{device}.lock"
        self.device = device
        self.me = Holder(os.getpid(), socket.gethostname(), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         " ".join(sys.argv))

    def holder(self) -> Holder | None:
        try:
            return Holder(**json.loads(self.path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise DeviceBusy(f"{self.path}: unreadable lock ({exc}); remove it if no suite run is timing on "
                             f"{self.device}") from None

    def acquire(self) -> None:
        """Takes the lock, or raises DeviceBusy naming the run that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self.me)))
        try:
            for _ in range(2):  # a stale lock is removed once, then the link is tried again
                try:
                    os.link(tmp, self.path)  # atomic, and fails where the lock exists: never a half-written lock
                    return
                except FileExistsError:
                    other = self.holder()
                    if other is not None and other.alive():
                        raise DeviceBusy(
                            f"another suite run is timing on {self.device}: pid {other.pid} on {other.host}, started "
                            f"{other.started} ({other.command}). Its timings would include this run's load: wait "
                            f"for it, or remove {self.path} if that process is gone") from None
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
            raise DeviceBusy(f"{self.path}: another run took the lock at the same moment")
        finally:
            tmp.unlink(missing_ok=True)

    def release(self) -> None:
        try:
            if self.holder() == self.me:
                self.path.unlink()
        except (DeviceBusy, FileNotFoundError):
            pass
