"""``gmeta k8s render-prepare``: an Indexed Job of N prepare parts and the Job that combines them.

No cluster: the Jobs are rendered, parsed back from the YAML, and validated against the kubernetes
client's batch/v1 Job model (plus the Job rules the model does not encode).
"""
from __future__ import annotations

import copy
import shlex
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from gmeta_tf.cli.k8s_cmd import k8s_group
from gmeta_tf.errors import UserError
from launch.prepare_job import PrepareJob, job_errors, render, validate_job


def _job(**kw) -> PrepareJob:
    args = dict(image="registry.example/gmeta-tf:0.1.0", parts=4, inputs=("/data/raw",), dest="/data/prepared",
                pvc="shared-data", overrides=("prepare.shards=16", "prepare.query=8"))
    args.update(kw)
    return PrepareJob(**args)


def _container(doc, name):
    (c,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def test_renders_an_indexed_job_of_n_parts():
    prepare, combine = render(_job())
    spec = prepare["spec"]
    assert (prepare["apiVersion"], prepare["kind"]) == ("batch/v1", "Job")
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    c = _container(prepare, "prepare")
    cmd = c["command"] + c["args"]
    assert cmd[:3] == ["gmeta", "data", "prepare"]
    # The index reaches the command: the kubelet expands $(JOB_COMPLETION_INDEX) in args.
    assert cmd[cmd.index("--part") + 1] == "$(JOB_COMPLETION_INDEX)/4"
    assert cmd[cmd.index("--out") + 1] == "/data/prepared-parts/part-$(JOB_COMPLETION_INDEX)"
    assert cmd[cmd.index("--input") + 1] == "/data/raw"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"] == ["prepare.shards=16", "prepare.query=8"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}}]
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]


def test_the_combine_job_waits_for_every_part_then_combines_them():
    _, combine = render(_job(parts=3))
    assert combine["metadata"]["name"] == "gmeta-prepare-combine"
    c = _container(combine, "combine")
    parts = [f"/data/prepared-parts/part-{i}" for i in range(3)]
    assert c["command"] + c["args"] == ["gmeta", "data", "combine", *parts, "--out", "/data/prepared", "--overwrite"]
    (init,) = combine["spec"]["template"]["spec"]["initContainers"]
    script = init["args"][1]
    assert init["command"] + init["args"][:1] == ["sh", "-c"]
    for p in parts:
        assert f"{p}/schema.json" in script
    assert combine["spec"]["activeDeadlineSeconds"] > 0


def test_the_wait_script_is_valid_shell_and_returns_once_all_parts_exist(tmp_path):
    _, combine = render(_job(parts=2, dest=f"{tmp_path}/prepared", mount=str(tmp_path), inputs=(f"{tmp_path}/raw",)))
    script = combine["spec"]["template"]["spec"]["initContainers"][0]["args"][1]
    for i in range(2):
        d = tmp_path / "prepared-parts" / f"part-{i}"
        d.mkdir(parents=True)
        (d / "schema.json").write_text("{}")
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "all 2 parts prepared"
    assert shlex.split(script)  # quotes balance


def test_both_jobs_validate_and_a_typo_or_a_bad_value_is_named():
    prepare, combine = render(_job())
    assert job_errors(prepare) == [] and job_errors(combine) == []
    bad = copy.deepcopy(prepare)
    bad["spec"]["completionsMode"] = "Indexed"
    bad["spec"]["template"]["spec"]["containers"][0]["comand"] = ["gmeta"]
    bad["spec"]["backoffLimit"] = "3"
    errors = job_errors(bad)
    assert "spec.completionsMode: not a field of the batch/v1 Job model" in errors
    assert "spec.template.spec.containers[0].comand: not a field of the batch/v1 Job model" in errors
    assert any(e.startswith("spec.backoffLimit:") for e in errors)
    bad = copy.deepcopy(prepare)
    bad["spec"]["parallelism"] = 2
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(UserError, match="parallelism") as e:
        validate_job(bad)
    assert "restartPolicy" in str(e.value)
    bad = copy.deepcopy(prepare)
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    assert any("name" in e for e in job_errors(bad))


@pytest.mark.parametrize("parts", [0, -2, 10_001, True])
def test_a_bad_number_of_parts_is_refused_naming_the_option(parts):
    with pytest.raises(UserError, match="--parts"):
        render(_job(parts=parts))


@pytest.mark.parametrize("change, flag", [
    (dict(parts=17), "--parts"),  # more parts than prepare.shards=16
    (dict(dest="/elsewhere/prepared"), "--dest"),
    (dict(inputs=("/data/../raw",)), "--input"),
    (dict(pvc="Not_A_Claim"), "--pvc"),
    (dict(name="Prepare"), "--name"),
    (dict(memory="lots"), "--memory"),
    (dict(image="has space"), "--image"),
])
def test_bad_options_are_refused_naming_them(change, flag):
    with pytest.raises(UserError) as e:
        render(_job(**change))
    assert flag in str(e.value)


def test_cli_render_prepare(tmp_path):
    out = tmp_path / "prepare.yaml"
    args = ["render-prepare", "--image", "reg/gmeta:1", "--parts", "3", "--input", "/mnt/in/a", "--input", "/mnt/in/b",
            "--dest", "/mnt/prepared", "--pvc", "data", "--mount", "/mnt", "--set", "prepare.shards=6",
            "--namespace", "ml", "--out", str(out)]
    r = CliRunner().invoke(k8s_group, args)
    assert r.exit_code == 0, r.output
    assert "Job gmeta-prepare (3 indexed part(s))" in r.output
    prepare, combine = list(yaml.safe_load_all(out.read_text()))
    assert prepare["spec"]["completions"] == 3 and prepare["metadata"]["namespace"] == "ml"
    cmd = _container(prepare, "prepare")["args"]
    assert cmd.count("--input") == 2 and "$(JOB_COMPLETION_INDEX)/3" in cmd
    assert job_errors(prepare) == [] and job_errors(combine) == []
    bad = CliRunner().invoke(k8s_group, args[:4] + ["0"] + args[5:])
    assert bad.exit_code == 2 and "--parts" in bad.output and "Traceback" not in bad.output
    stdout = CliRunner().invoke(k8s_group, args[:-2])
    assert stdout.exit_code == 0 and stdout.output.startswith("---\napiVersion: batch/v1")
