"""summary.json names the code that ran: the commit of its checkout, dirty or not, and libraries."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import torch

from fleet.report import provenance


def _git(repo, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git checkout standing in for fleetrl's own; code_provenance's cache emptied around it."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "tracked.py").write_text("x = 1\n")
    _git(tmp_path, "add", "tracked.py")
    _git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(provenance, "CHECKOUT", tmp_path)
    provenance.code_provenance.cache_clear()
    yield tmp_path
    provenance.code_provenance.cache_clear()


def test_the_commit_is_heads_and_a_changed_tracked_file_marks_it_dirty(checkout):
    head = _git(checkout, "rev-parse", "HEAD")
    (checkout / "untracked.log").write_text("a run's output\n")  # not code: not dirty
    code = provenance.code_provenance()
    assert code["commit"] == head
    assert code["libraries"]["torch"] == torch.__version__
    assert code["fleetrl"] and code["python"]

    (checkout / "tracked.py").write_text("x = 2\n")
    assert provenance.code_provenance()["commit"] == head, "computed once per process, at its first call"
    provenance.code_provenance.cache_clear()
    assert provenance.code_provenance()["commit"] == head + "+dirty"


def test_outside_a_checkout_the_commit_is_none_and_code_json_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "CHECKOUT", tmp_path / "site-packages")
    provenance.code_provenance.cache_clear()
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        code = provenance.write_code_json(run_dir)
    finally:
        provenance.code_provenance.cache_clear()
    assert code["commit"] is None
    assert json.loads((run_dir / "code.json").read_text()) == code


def test_this_checkout_is_the_one_whose_commit_a_run_records():
    """CHECKOUT is the folder of the top-level packages (foundation/, fleet/, ...), wherever the
    module that computes it lives: a run from this checkout records its HEAD."""
    repo = pathlib.Path(__file__).resolve().parent.parent
    assert provenance.CHECKOUT == repo
    provenance.code_provenance.cache_clear()
    try:
        commit = provenance.code_provenance()["commit"]
    finally:
        provenance.code_provenance.cache_clear()
    assert commit is not None and commit.split("+")[0] == _git(repo, "rev-parse", "HEAD")
