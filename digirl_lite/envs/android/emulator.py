"""Start, reset and stop a set of Android emulators, each with its own Appium server.

The reference code re-copied an AVD for every reset (minutes) and killed processes by user
name. Here N read-only clones of one AVD run on distinct ports, a reset loads a snapshot
(seconds), a hard reset (every ``hard_reset_every`` episodes) cold-boots the clone from its
snapshot again, and only the processes this manager started are ever stopped: each emulator
and Appium server leads a new process group, recorded by its id when it starts, and stopping
it ends that group (the emulator's qemu, Appium's node children), SIGTERM then SIGKILL after
``stop_timeout_s`` (never a name, never a group it did not create).

    manager = EmulatorManager(EmulatorConfig(avd="digirl", n=4, sdk_root="~/Android/Sdk"))
    manager.start()                     # boots 4 clones, 4 Appium servers
    make_env = manager.env_factory()    # slot -> AndroidEnv, for any fleet
    ...
    manager.stop()
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from digirl_lite.envs.android.device import Adb, AndroidConfig

__all__ = ["EmulatorConfig", "EmulatorManager", "SdkToolMissing", "AndroidEnvFactory"]

log = logging.getLogger("digirl_lite.envs.android")


class SdkToolMissing(FileNotFoundError):
    """An Android SDK tool (or Appium) is not where the config says."""


@dataclass
class EmulatorConfig:
    """A fleet of emulator clones.

    Attributes:
        avd: the AVD to clone (created once with ``avdmanager``, with snapshot ``snapshot``).
        n: number of clones.
        sdk_root: Android SDK folder (None: ``$ANDROID_SDK_ROOT`` or ``$ANDROID_HOME``);
            ``emulator/emulator`` and ``platform-tools/adb`` are taken from it.
        appium: the Appium command (``["appium"]``: on PATH; CI uses ``.ci/node``).
        base_port: console port of clone 0; clone i uses ``base_port + 2 i`` (adb takes the
            odd port after it), so serials are ``emulator-5554``, ``emulator-5556``, ...
        appium_base_port: Appium server of clone i listens on ``appium_base_port + i``.
        snapshot: the snapshot a reset loads.
        hard_reset_every: cold-boot a clone after this many resets (0: never); keeps state
            that persists across soft resets from piling up (Darwin's periodic hard reset).
        boot_timeout_s: how long a boot (or an Appium server start) may take.
        emulator_args: extra emulator flags (the defaults run headless).
        stop_timeout_s: how long a stopped emulator or server (its whole process group) may
            take to exit after SIGTERM before the group gets SIGKILL.
    """

    avd: str
    n: int = 1
    sdk_root: str | None = None
    appium: list[str] = field(default_factory=lambda: ["appium"])
    base_port: int = 5554
    appium_base_port: int = 4723
    snapshot: str = "digirl"
    hard_reset_every: int = 50
    boot_timeout_s: float = 300.0
    emulator_args: list[str] = field(default_factory=lambda: [
        "-no-window", "-no-audio", "-no-boot-anim", "-gpu", "swiftshader_indirect"])
    stop_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be >= 1")
        if self.base_port % 2:
            raise ValueError("emulator console ports are even (adb takes the odd one after)")
        if self.hard_reset_every < 0:
            raise ValueError("hard_reset_every must be >= 0")
        if self.stop_timeout_s < 0:
            raise ValueError("stop_timeout_s must be >= 0")


class EmulatorManager:
    """N emulator clones and their Appium servers, started and stopped by this object.

    Args:
        config: the clones.
        run: ``subprocess.run`` for adb calls (tests pass a recorder).

    Raises:
        SdkToolMissing: at construction, when the emulator, adb or Appium is missing.
    """

    def __init__(self, config: EmulatorConfig,
                 run: Callable[..., Any] = subprocess.run) -> None:
        self.config = config
        self._run = run
        self.emulator, self.adb_path, self.appium = self._find_tools()
        self.emulators: dict[int, subprocess.Popen] = {}
        self.servers: dict[int, subprocess.Popen] = {}
        self.groups: dict[int, int] = {}
        """Process group id of each process this manager started (by process id)."""
        self.resets = [0] * config.n

    # -- tools ----------------------------------------------------------------------------
    def _find_tools(self) -> tuple[str, str, list[str]]:
        root = self.config.sdk_root or os.environ.get("ANDROID_SDK_ROOT") \
            or os.environ.get("ANDROID_HOME")
        missing = []
        if not root:
            missing.append("the Android SDK (set EmulatorConfig.sdk_root or ANDROID_SDK_ROOT)")
            emulator = adb = ""
        else:
            sdk = Path(root).expanduser()
            emulator, adb = str(sdk / "emulator" / "emulator"), str(sdk / "platform-tools" / "adb")
            for name, path in (("emulator", emulator), ("adb", adb)):
                if not os.access(path, os.X_OK):
                    missing.append(f"{name} at {path} (install it with sdkmanager)")
        appium = list(self.config.appium)
        if not appium or shutil.which(appium[0]) is None:
            missing.append(f"Appium ({appium[0] if appium else 'no command'}: "
                           f"npm install appium, then appium driver install uiautomator2)")
        if missing:
            raise SdkToolMissing("cannot run emulators; missing: " + "; ".join(missing))
        return emulator, adb, appium

    # -- names ----------------------------------------------------------------------------
    def port(self, i: int) -> int:
        return self.config.base_port + 2 * i

    def serial(self, i: int) -> str:
        return f"emulator-{self.port(i)}"

    def server_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.config.appium_base_port + i}"

    def adb(self, i: int) -> Adb:
        return Adb(self.adb_path, self.serial(i), run=self._run)

    def android_config(self, i: int, **overrides: Any) -> AndroidConfig:
        """How to reach clone ``i`` (its Appium server and serial; adb for typing)."""
        return AndroidConfig(**{"server_url": self.server_url(i), "udid": self.serial(i),
                                "adb_path": self.adb_path, **overrides})

    # -- lifecycle ------------------------------------------------------------------------
    def _emulator_argv(self, i: int, cold: bool) -> list[str]:
        c = self.config
        argv = [self.emulator, "-avd", c.avd, "-port", str(self.port(i)), "-read-only",
                *c.emulator_args]
        # -read-only lets the clones share one AVD; a cold boot ignores saved state
        return argv + (["-no-snapshot-load"] if cold else ["-snapshot", c.snapshot])

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        """Start ``argv`` as the leader of a new session, hence of a new process group whose
        id (its own process id) is recorded: stopping it ends that group and no other."""
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self.groups[p.pid] = os.getpgid(p.pid)  # not reaped yet: the id is still its own
        return p

    def _start_emulator(self, i: int, cold: bool = False) -> None:
        self.emulators[i] = self._spawn(self._emulator_argv(i, cold))

    def _start_server(self, i: int) -> None:
        port = self.config.appium_base_port + i
        self.servers[i] = self._spawn(
            [*self.appium, "--address", "127.0.0.1", "--port", str(port)])

    def start(self) -> None:
        """Boot every clone and its Appium server; wait until all are ready."""
        try:
            for i in range(self.config.n):
                self._start_emulator(i)
                self._start_server(i)
            for i in range(self.config.n):
                self.wait_for_boot(i)
                self.wait_for_server(i)
        except BaseException:
            self.stop()
            raise

    def wait_for_boot(self, i: int) -> None:
        """Until ``sys.boot_completed`` is 1 (TimeoutError after ``boot_timeout_s``)."""
        deadline = time.monotonic() + self.config.boot_timeout_s
        adb = self.adb(i)
        while time.monotonic() < deadline:
            p = self.emulators.get(i)
            if p is not None and (code := _exit_status(p)) is not None:
                raise RuntimeError(f"emulator {self.serial(i)} exited with {code}")
            try:
                if adb("shell", "getprop", "sys.boot_completed").strip() == "1":
                    return
            except Exception:  # not up yet: adb reports "device offline" while booting
                pass
            time.sleep(1.0)
        raise TimeoutError(f"{self.serial(i)} did not boot in {self.config.boot_timeout_s} s")

    def wait_for_server(self, i: int) -> None:
        """Until the Appium server of clone ``i`` answers ``/status``."""
        deadline = time.monotonic() + self.config.boot_timeout_s
        url = self.server_url(i) + "/status"
        while time.monotonic() < deadline:
            p = self.servers.get(i)
            if p is not None and (code := _exit_status(p)) is not None:
                raise RuntimeError(f"Appium server {url} exited with {code}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"Appium server {url} did not start in {self.config.boot_timeout_s} s")

    def reset(self, i: int) -> str:
        """Reset clone ``i``: load the snapshot (seconds), or every ``hard_reset_every``
        resets cold-boot it. Returns ``"snapshot"`` or ``"hard"``."""
        self.resets[i] += 1
        k = self.config.hard_reset_every
        if k and self.resets[i] % k == 0:
            self.hard_reset(i)
            return "hard"
        self.adb(i)("emu", "avd", "snapshot", "load", self.config.snapshot)
        self.wait_for_boot(i)
        return "snapshot"

    def home(self, i: int) -> None:
        """Darwin's minimal reset: back to the home screen, state kept."""
        self.adb(i).keyevent(3)

    def hard_reset(self, i: int) -> None:
        """Stop clone ``i`` (our own process) and cold-boot it again."""
        self._stop_process(self.emulators.pop(i, None))
        self._start_emulator(i, cold=True)
        self.wait_for_boot(i)

    def restart_server(self, i: int) -> None:
        self._stop_process(self.servers.pop(i, None))
        self._start_server(i)
        self.wait_for_server(i)

    def _stop_process(self, p: subprocess.Popen | None) -> None:
        """End the process group ``p`` leads: SIGTERM, up to ``stop_timeout_s`` for every
        member to exit, then SIGKILL; then reap ``p``.

        Until ``p`` is reaped (here, last) its process id stays taken, and with it the
        group's id, so the signals cannot reach a group this manager did not create.
        """
        if p is None:
            return
        pgid = self.groups.pop(p.pid, None)
        if pgid is None or p.returncode is not None:  # reaped already: the id may be reused
            return
        timeout = self.config.stop_timeout_s
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid, p):
            time.sleep(0.05)
        if _group_alive(pgid, p):
            log.warning("process group %d did not exit %.0f s after SIGTERM; killing it",
                        pgid, timeout)
        _signal_group(pgid, signal.SIGKILL)  # survivors, if any (harmless when none)
        try:
            p.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            log.error("process %d did not exit after SIGKILL", p.pid)

    def stop(self) -> None:
        """Stop every emulator and server this manager started (and nothing else)."""
        for procs in (self.servers, self.emulators):
            for i in list(procs):
                self._stop_process(procs.pop(i))

    def pids(self) -> list[int]:
        return [p.pid for p in (*self.emulators.values(), *self.servers.values())]

    def env_factory(self, judge: dict | None = None, horizon: int = 20,
                    minimal_reset: bool = False, hard_reset_every: int = 0,
                    setup: Any = (), teardown: Any = (),
                    **config: Any) -> AndroidEnvFactory:
        """``slot -> AndroidEnv`` for clone ``slot`` (for a fleet in this process: the
        snapshot resets call this manager). ``minimal_reset``: Home between episodes, and
        with ``hard_reset_every`` > 0 a snapshot load (:meth:`reset`) every that many
        episodes; ``setup`` / ``teardown``: the lifecycle's commands
        (:mod:`digirl_lite.envs.lifecycle`)."""
        return AndroidEnvFactory(self, judge, horizon, minimal_reset, config,
                                 hard_reset_every=hard_reset_every, setup=setup,
                                 teardown=teardown)

    def __enter__(self) -> EmulatorManager:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _exit_status(p: subprocess.Popen) -> int | None:
    """``p``'s exit status once it has ended, else None, without reaping it (a reaped
    process's id, and its group's, could be reused; :meth:`EmulatorManager._stop_process`
    reaps it after its group is gone)."""
    if p.returncode is not None or not hasattr(os, "waitid"):
        return p.poll()
    try:
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by someone else
        return p.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _group_alive(pgid: int, leader: subprocess.Popen) -> bool:
    """Whether the leader or any other live (not zombie) process of group ``pgid`` is left
    (the others are read from ``/proc`` where there is one)."""
    if _exit_status(leader) is None:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == leader.pid:
            continue
        try:
            fields = (d / "stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class AndroidEnvFactory:
    """``slot -> AndroidEnv`` on the clones of an :class:`EmulatorManager`."""

    def __init__(self, manager: EmulatorManager, judge: dict | None, horizon: int,
                 minimal_reset: bool, config: dict[str, Any], hard_reset_every: int = 0,
                 setup: Any = (), teardown: Any = ()) -> None:
        self.manager, self.judge, self.horizon = manager, judge, horizon
        self.minimal_reset, self.config = minimal_reset, config
        self.hard_reset_every, self.setup, self.teardown = hard_reset_every, setup, teardown

    def __call__(self, slot: int = 0):
        from digirl_lite.envs.android.env import AndroidEnv
        from digirl_lite.envs.judges import make_judge

        def snapshot() -> None:
            self.manager.reset(slot)

        reset: Any = "home" if self.minimal_reset else snapshot
        hard = {"hard_reset_every": self.hard_reset_every, "hard_reset": snapshot} \
            if self.minimal_reset and self.hard_reset_every else {}
        return AndroidEnv(self.manager.android_config(slot, **self.config),
                          judge=make_judge(self.judge), horizon=self.horizon, reset=reset,
                          setup=self.setup, teardown=self.teardown, **hard)
