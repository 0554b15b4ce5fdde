"""One process writes a run folder: the lock a Trainer and an evolution take, and the grid's
job locks (the same :class:`~digirl_lite.paths.FileLock`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from needs import hold

from digirl_lite.errors import FolderBusyError
from digirl_lite.paths import FileLock, lock_run_folder


@pytest.mark.slow
def test_a_held_lock_names_its_holder_and_dies_with_it(tmp_path):
    path = tmp_path / "run" / "run.lock"
    p = hold(path)
    try:
        assert FileLock(path).acquire() == f"process {p.pid} on host {socket.gethostname()}"
        with pytest.raises(FolderBusyError, match=rf"{tmp_path / 'run'} is in use by "
                                                   rf"process {p.pid} on host"):
            lock_run_folder(tmp_path / "run")
    finally:
        p.kill()  # as kill -9 would: the system drops the lock, no stale file blocks
        p.wait()
    assert path.is_file()  # left behind by the killed holder, and taken over
    lock = lock_run_folder(tmp_path / "run")
    assert lock.held and path.read_text().split() == [str(os.getpid()), socket.gethostname()]
    # this process holds it: a second object shares it (a notebook cell run again), and the
    # file goes with the last release, while another process stays refused throughout
    second = FileLock(path)
    assert second.acquire() is None and second.fileno() == lock.fileno()
    lock.release()
    assert path.is_file() and not lock.held and second.held
    check = subprocess.run([sys.executable, "-c", "import sys; from digirl_lite.paths import "
                            "FileLock; print(FileLock(sys.argv[1]).acquire())", str(path)],
                           capture_output=True, text=True).stdout.strip()
    assert check == f"process {os.getpid()} on host {socket.gethostname()}"
    second.release()
    assert not path.exists() and not second.held
    again = FileLock(path)
    assert again.acquire() is None
    again.release()


def test_a_lock_file_no_process_holds_is_taken_over(tmp_path):
    path = tmp_path / "run.lock"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    path.write_text(f"{dead} {socket.gethostname()}\n")  # its writer died without a release
    lock = FileLock(path)
    assert lock.acquire() is None
    assert path.read_text().split()[0] == str(os.getpid())
    lock.release()


@pytest.mark.slow
def test_a_trainer_refuses_a_folder_another_process_writes(tmp_path):
    """A resume started while the run's first process still runs stops before it reaches a
    phone, reads a checkpoint or writes anything into the folder."""
    from digirl_lite.train.config import sim_quick
    from digirl_lite.train.trainer import Trainer

    cfg = sim_quick(pile_size=4, iterations=1, eval_tasks=2)
    out = tmp_path / "run"
    p = hold(out / "run.lock")
    try:
        with pytest.raises(FolderBusyError, match=f"in use by process {p.pid}"):
            Trainer(cfg, out, cache_dir=None, progress=False)
        assert sorted(os.listdir(out)) == ["run.lock"]  # nothing read, nothing written
    finally:
        p.kill()
        p.wait()
    trainer = Trainer(cfg, out, cache_dir=None, progress=False)  # the holder gone: taken
    assert (out / "run.lock").read_text().split()[0] == str(os.getpid())
    trainer.close()  # lets the folder go
    assert not (out / "run.lock").exists()


def test_an_evolution_refuses_a_folder_another_process_writes(tmp_path):
    from digirl_lite.harness.evolve import EvolveConfig, run_evolution

    out = tmp_path / "run"
    p = hold(out / "run.lock")
    try:
        with pytest.raises(FolderBusyError, match=f"in use by process {p.pid}"):
            run_evolution(EvolveConfig(), out, resume=True, log=lambda *a: None)
        assert sorted(os.listdir(out)) == ["run.lock"]
    finally:
        p.kill()
        p.wait()
