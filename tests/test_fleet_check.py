"""`fleetrl fleet check` and `fleet render` as a user runs them: the plan of a good spec, the
precise error of a bad one."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from fleet.cli.main import main
from fleet.launch.spec import parse_spec
from fleet.launch.spec_schema import HOST_SCHEMA, KUBERNETES_SCHEMA, SCHEMA, SLURM_SCHEMA
from tests.test_fleet_spec import README_SPEC

REPO = pathlib.Path(__file__).resolve().parents[1]

PLAN = """\
run big: 4 hosts, run_dir runs/big on every host
hosts:
  redis-a   10.0.0.5         redis 7000, 7001
  redis-b   10.0.0.6         redis 7002
  services  10.0.0.7         buffer :50051; aggregator :50052; evaluator x1 (id 0)
  sim-1     10.0.0.8         sampler x8 (ids 0-7, cpus 0,1,2,3,4,5,6,7); learner x1 (id 0)
ports to open (TCP, from every other host of the fleet):
  10.0.0.5         7000 Redis node, 17000 Redis cluster bus of 7000, 7001 Redis node, 17001 Redis cluster bus of 7001
  10.0.0.6         7002 Redis node, 17002 Redis cluster bus of 7002
  10.0.0.7         50051 buffer, 50052 aggregator
"""

DERIVED = """\
derived settings:
  sampler.num_samplers = 8 (summed over the hosts)
  learner.num_learners = 1 (summed over the hosts)
  aggregator.grads_per_step = 1 -> 1 gradients per step (set in the config)
  buffer.replicas_to_ack = 0
"""


def _check(tmp_path, capsys, text: str, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    status = main(["fleet", "check", str(path), *extra])
    out, err = capsys.readouterr()
    return status, out, err


def test_check_prints_hosts_ports_and_derived_settings(tmp_path, capsys):
    status, out, err = _check(tmp_path, capsys, README_SPEC)
    assert (status, err) == (0, "")
    assert out.startswith(f"{tmp_path / 'fleet.yaml'}: ok\n{PLAN}")
    assert DERIVED in out
    assert "redis cluster: 3 nodes, 3 primaries, redis_replicas 0 (formed by redis-a" in out
    assert "results: summary.json, checkpoints, evals.jsonl and tb/ in runs/big/ on services" in out
    assert "stop: services (the aggregator's host) stops the whole fleet at target_success 0.9, max_wall_sec" in out
    assert "redis data (buffer.durable): redis-a in runs/big/redis/redis-a, redis-b in runs/big/redis/redis-b;" in out
    assert "under slurm: SIGUSR1 120 s before the end, requeue on (slurm.warning_sec, slurm.requeue)" in out
    _, out, _ = _check(tmp_path, capsys, README_SPEC + "slurm: {warning_sec: 0, requeue: false}\n", "--set",
                       "buffer.durable=false")  # fmt: skip
    assert "redis data: none kept (buffer.durable false)" in out and "under slurm: no warning, requeue off" in out


def test_check_derives_the_step_from_the_learners_and_warns_of_learners_that_would_all_be_stale(tmp_path, capsys):
    reach = README_SPEC.replace("{sim.task: FetchPush-v4}", "{sim.task: FetchReach-v4}")  # no preset K
    status, out, _ = _check(tmp_path, capsys, reach.replace("learner: 1}", "learner: 4}"))
    assert status == 0 and "aggregator.grads_per_step = 0 -> 4 gradients per step (every learner of the spec)" in out
    assert "most are dropped as stale" not in out
    # FetchPush's preset steps on every gradient (K=1) with max_grad_staleness 2, measured with 2 learners
    status, out, _ = _check(tmp_path, capsys, README_SPEC.replace("learner: 1}", "learner: 2}"))
    assert status == 0 and "most are dropped as stale" not in out
    status, out, _ = _check(tmp_path, capsys, README_SPEC.replace("learner: 1}", "learner: 8}"))
    assert status == 0
    assert "warning: 8 learners at 1 gradients per step: a gradient arrives about 7 versions behind" in out
    status, out, _ = _check(
        tmp_path, capsys, README_SPEC.replace("learner: 1}", "learner: 8}"), "--set", "aggregator.grads_per_step=0"
    )
    assert status == 0 and "0 -> 8 gradients per step" in out and "most are dropped as stale" not in out


def test_check_shows_replicas_and_a_replica_beside_its_primary(tmp_path, capsys):
    text = README_SPEC.replace("run_id: big", "run_id: big\nredis_replicas: 1").replace(
        "redis: [7002]", "redis: [7002, 7003, 7004, 7005]"
    )
    status, out, _ = _check(tmp_path, capsys, text)
    assert status == 0
    assert "redis cluster: 6 nodes, 3 primaries, redis_replicas 1" in out
    assert "replica 10.0.0.6:7003 follows 10.0.0.5:7000\n" in out
    assert "replica 10.0.0.6:7005 follows 10.0.0.6:7002  <- same address as its primary" in out
    assert "buffer.replicas_to_ack = 1" in out


def test_check_warns_when_grads_per_step_exceeds_the_learners(tmp_path, capsys):
    status, out, _ = _check(tmp_path, capsys, README_SPEC, "--set", "aggregator.grads_per_step=3")
    assert status == 0
    assert "aggregator.grads_per_step = 3 -> 3 gradients per step (set in the config)" in out
    assert "warning: grads_per_step 3 > 1 learners: every step closes by aggregator.step_deadline_ms" in out


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("learner: 1", "learner: 0", ":7: hosts.sim-1.learner (0) must be >= 1"),
        ("buffer: 50051", "buffer: 50052", ":6: hosts.services.aggregator: port 50052 on 10.0.0.7 is wanted for"),
        ("evaluator: 1", "evaluater: 1", ":6: hosts.services.evaluater: unknown key; did you mean 'evaluator'?"),
        ("hosts:", "hosts: []\nx:", ":3: hosts ([]) must be a non-empty mapping of host name -> host"),
        (
            "config: {sim.task: FetchPush-v4}",
            "config: {sim.task: FetchPsh-v4}",
            ":2: config.sim.task: 'FetchPsh-v4' is not a registered task; did you mean 'FetchPush-v4'?",
        ),
    ],
)
def test_check_refuses_a_bad_spec_with_the_precise_error(tmp_path, capsys, old, new, message):
    status, out, err = _check(tmp_path, capsys, README_SPEC.replace(old, new, 1))
    assert (status, out) == (2, "")
    assert err.startswith("fleetrl fleet check: error: ") and message in err, err


def test_render_writes_the_manifests_and_lists_them(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(README_SPEC)
    assert main(["fleet", "render", "--k8s", str(path), "--out", str(tmp_path / "k8s")]) == 0
    paths, steps = capsys.readouterr().out.split("\n\nnext steps:\n")
    assert paths.split() == sorted(str(p) for p in (tmp_path / "k8s").iterdir()) and len(paths.split()) == 9
    assert "kubectl -n default create secret generic big-secrets --from-literal=token=" in steps
    assert f"kubectl apply -f {tmp_path / 'k8s'}\n" in steps
    assert "kubectl -n default delete pvc -l fleetrl/redis=big-redis" in steps  # the kept Redis data, once done


def test_render_takes_its_one_format_without_k8s(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(README_SPEC)
    assert main(["fleet", "render", str(path), "--out", str(tmp_path / "k8s")]) == 0
    assert len(list((tmp_path / "k8s").iterdir())) == 9 and "kubectl apply" in capsys.readouterr().out


def test_fleet_up_help_points_at_the_spec_doc_which_names_every_key(capsys):
    with pytest.raises(SystemExit):
        main(["fleet", "up", "--help"])
    assert "docs/fleet-spec.md" in capsys.readouterr().out
    doc = (REPO / "docs" / "fleet-spec.md").read_text()
    sections = [*SLURM_SCHEMA["properties"], *KUBERNETES_SCHEMA["properties"]]
    keys = [*SCHEMA["properties"], *HOST_SCHEMA["properties"], *sections, "port", "count", "cpus"]
    assert [key for key in keys if f"`{key}`" not in doc] == []


def test_the_docs_spec_is_the_one_checked_here_and_its_by_hand_lines_agree(tmp_path, capsys):
    doc = (REPO / "docs" / "fleet-spec.md").read_text()
    block = doc.split("```yaml\n# fleet.yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(block) == yaml.safe_load(README_SPEC)  # the plan below is the docs' first example
    by_hand = doc.split("## Starting each role by hand", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    services = parse_spec(yaml.safe_load(block)).service("buffer").split(":")[0]
    assert f"--buffer {services}:50051" in by_hand and f"--advertise {services}:50052" in by_hand


LOCAL_SPEC = """\
run_id: here
hosts:
  redis:    {address: 127.0.0.1, redis: [7000, 7001, 7002]}
  services: {address: 127.0.0.1, buffer: 50051, aggregator: 50052, evaluator: 1}
  sim:      {address: 127.0.0.1, sampler: {count: 3, cpus: [0, 1, 9999]}, learner: 1}
"""


def test_check_refuses_cpus_beyond_this_hosts_naming_the_file_and_line(tmp_path, capsys):
    status, out, err = _check(tmp_path, capsys, LOCAL_SPEC)
    assert (status, out) == (2, "")
    assert err.startswith(f"fleetrl fleet check: error: {tmp_path / 'fleet.yaml'}:5: hosts.sim.sampler.cpus.2 (9999)")
    assert "must be <" in err and "would not start" in err
    status, _, _ = _check(tmp_path, capsys, LOCAL_SPEC.replace("9999", "0"))
    assert status == 0


def test_check_warns_but_passes_a_spec_with_no_evaluator(tmp_path, capsys):
    status, out, err = _check(tmp_path, capsys, README_SPEC.replace(", evaluator: 1", ""))
    assert status == 0 and out.startswith(f"{tmp_path / 'fleet.yaml'}: ok")
    assert "fleetrl fleet check: warning: " in err and "nothing would score the policy" in err
    _, _, err = _check(tmp_path, capsys, README_SPEC)
    assert "warning" not in err


def test_fleet_slurm_refuses_cpus_beyond_its_cpus_per_task(tmp_path, capsys):
    path = tmp_path / "fleet.yaml"
    path.write_text(README_SPEC)
    argv = ["fleet", "slurm", str(path), "--cpus-per-task", "4", "--out", str(tmp_path / "job.sh")]
    assert main(argv) == 2
    assert "hosts.sim-1.sampler.cpus.4 (4) must be < 4" in capsys.readouterr().err
    assert not (tmp_path / "job.sh").exists()
