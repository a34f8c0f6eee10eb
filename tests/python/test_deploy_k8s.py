"""deploy/k8s and deploy/docker against the truth: `kubectl kustomize` renders every overlay; every
rendered object validates against the Kubernetes schemas (kubernetes-validate, strict); and the
manifests agree with the binaries: every flag is one the binary's --help lists (with an allowed
value), ports and probes match the flags, the probes' grpc.health.v1 service names answer SERVING
on a running stack, the scheduler finds its workers, the gateway finds every replica, Prometheus'
Kubernetes relabelling (run by promtool) turns every metrics port into a target with the labels
the dashboard uses, and the image recipe ships what the manifests run."""
import json
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from conftest import BIN, REPO, binary
from observability import kubernetes_config_as_file_sd, promtool, require_tool

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ["base", "overlays/h200", "overlays/rtx4090d-tp4"]
GPU_OVERLAYS = {"overlays/h200": 1, "overlays/rtx4090d-tp4": 4}
KUBERNETES_VERSION = "1.34.0"
# What kubectl 1.20's built-in kustomize (v2.0.3, Debian 12's kubernetes-client) understands.
KUSTOMIZE_V2_FIELDS = {"apiVersion", "kind", "resources", "bases", "patchesStrategicMerge", "patchesJson6902",
                       "configMapGenerator", "secretGenerator", "images", "namespace", "namePrefix", "nameSuffix",
                       "commonLabels", "commonAnnotations", "generatorOptions", "vars"}


@lru_cache(maxsize=None)
def render(overlay: str) -> tuple:
    proc = subprocess.run([require_tool("kubectl"), "kustomize", str(K8S / overlay)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {overlay}:\n{proc.stderr}"
    warnings = [l for l in proc.stderr.splitlines() if l.strip() and "is deprecated" not in l]
    assert not warnings, f"kubectl kustomize {overlay}: {warnings}"
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def objects(overlay, kind):
    return [o for o in render(overlay) if o["kind"] == kind]


def one(overlay, kind, name):
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name}"
    return found[0]


def pod_specs(overlay):
    return [(o, o["spec"]["template"]["spec"]) for o in render(overlay) if o["kind"] in ("Deployment", "StatefulSet")]


def config_value(overlay, ref):
    for cm in objects(overlay, "ConfigMap"):
        if cm["metadata"]["name"] == ref["name"]:
            return cm["data"][ref["key"]]
    raise AssertionError(f"{overlay}: no ConfigMap {ref['name']}")


def expanded_args(overlay, container):
    """The container's args with $(VAR) replaced as the kubelet does, from env values and ConfigMaps."""
    env = {}
    for e in container.get("env", []):
        env[e["name"]] = e["value"] if "value" in e else config_value(overlay, e["valueFrom"]["configMapKeyRef"])
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container.get("args", [])]


def flags(args):
    """--name=value / --name -> [(name, value or None)]; every arg must be of that form."""
    out = []
    for a in args:
        m = re.fullmatch(r"(--[a-z0-9-]+)(?:=(.*))?", a)
        assert m, f"argument {a!r}: write flags as --name=value"
        out.append((m.group(1), m.group(2)))
    return out


def flag(args, name, default=None):
    values = [v for n, v in flags(args) if n == name]
    return values[-1] if values else default


@lru_cache(maxsize=None)
def help_options(name: str) -> dict:
    """Options from `<binary> --help`: name -> (takes a value, allowed values or None, (lo, hi) or None)."""
    proc = subprocess.run([str(binary(name)), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    options = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s+(?:-\w,)?(--[a-z0-9-]+)(?:\s+(TEXT|INT|UINT|FLOAT)(\S*))?", line)
        if not m:
            continue
        choices = re.search(r":\{([^}]*)\}", m.group(3) or "")
        bounds = re.search(r"in \[(\S+) - (\S+)\]", line)
        options[m.group(1)] = (m.group(2) is not None, set(choices.group(1).split(",")) if choices else None,
                               (float(bounds.group(1)), float(bounds.group(2))) if bounds else None)
    assert "--port" in options and "--metrics-port" in options, proc.stdout
    return options


def containers(overlay):
    for owner, spec in pod_specs(overlay):
        for c in spec["containers"]:
            yield owner, spec, c


def binary_name(container):
    command = container["command"][0]
    assert command.startswith("/opt/ferry/bin/"), command
    return Path(command).name


def validator():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is missing: run scripts/setup.sh (it pip-installs it into .venv)")
    return kubernetes_validate


# ---- rendering and schemas ----

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_renders(overlay):
    kinds = sorted(o["kind"] for o in render(overlay))
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "HorizontalPodAutoscaler", "HorizontalPodAutoscaler",
                            "NetworkPolicy", "NetworkPolicy", "PersistentVolumeClaim",
                            "PodDisruptionBudget", "PodDisruptionBudget", "Service", "Service", "StatefulSet"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomizations_use_only_what_kubectl_1_20_reads(overlay):
    kustomization = yaml.safe_load((K8S / overlay / "kustomization.yaml").read_text())
    assert set(kustomization) <= KUSTOMIZE_V2_FIELDS, set(kustomization) - KUSTOMIZE_V2_FIELDS
    assert all(not (K8S / overlay / r).is_dir() for r in kustomization.get("resources", [])), \
        "kustomize v2.0.3 takes directories only under `bases`"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay):
    kubernetes_validate = validator()
    for obj in render(overlay):
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


def test_validation_rejects_a_misspelt_field():
    kubernetes_validate = validator()

    bad = json.loads(json.dumps(one("base", "Deployment", "ferry-gateway")))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


# ---- the manifests against the binaries ----

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_flag_is_one_the_binary_accepts(overlay):
    for _, _, c in containers(overlay):
        options = help_options(binary_name(c))
        for name, value in flags(expanded_args(overlay, c)):
            assert name in options, f"{overlay} {c['name']}: {binary_name(c)} has no {name}"
            takes_value, choices, bounds = options[name]
            assert (value is not None) == takes_value, f"{overlay} {c['name']}: {name} {'needs' if takes_value else 'takes no'} value"
            if choices:
                assert value in choices, f"{overlay} {c['name']}: {name}={value} not in {choices}"
            if bounds:
                assert bounds[0] <= float(value) <= bounds[1], f"{overlay} {c['name']}: {name}={value} outside {bounds}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_and_probes_match_the_flags(overlay):
    for _, _, c in containers(overlay):
        args = expanded_args(overlay, c)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        by_suffix = {"grpc": "--port", "metrics": "--metrics-port", "http": "--http-port"}
        for port_name, number in ports.items():
            flag_name = by_suffix[port_name.split("-")[-1]]
            assert flag(args, flag_name) == str(number), f"{overlay} {c['name']}: port {port_name} vs {flag_name}"
        for flag_name in ("--port", "--metrics-port", "--http-port"):
            if flag(args, flag_name) is not None:
                assert int(flag(args, flag_name)) in ports.values(), f"{overlay} {c['name']}: {flag_name} has no port"
        assert flag(args, "--host") == "0.0.0.0", "the kubelet probes and Prometheus reach the pod IP"
        # A worker's liveness asks for "": it turns NOT_SERVING on a failed engine or a hung step,
        # which only a restart cures. The others' "" follows what is behind them (a scheduler
        # waiting for a lost worker), so their liveness asks only whether the process serves.
        liveness = "" if binary_name(c) == "ferry-worker" else "liveness"
        for kind, service in (("startupProbe", "liveness"), ("livenessProbe", liveness), ("readinessProbe", "")):
            probe = c[kind]["grpc"]
            assert str(probe["port"]) == flag(args, "--port"), f"{overlay} {c['name']} {kind}"
            assert probe.get("service", "") == service, f"{overlay} {c['name']} {kind}"


def test_probe_services_answer_serving_on_a_running_stack(stack):
    """The service names the probes ask for are the ones the binaries serve."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    names = set()
    for overlay in OVERLAYS:
        for _, _, c in containers(overlay):
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                names.add(c[kind]["grpc"].get("service", ""))
    assert names == {"", "liveness"}
    addresses = [stack.gateway, stack.scheduler] + [f"127.0.0.1:{w['grpc_port']}" for w in stack.ports["workers"]]
    for address in addresses:
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        for name in names:
            status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, (address, name)
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="no-such-service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scheduler_finds_every_worker_rank(overlay):
    spec = one(overlay, "StatefulSet", "ferry-replica")["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in spec["containers"]}
    workers = sorted((n for n in by_name if n.startswith("worker-")), key=lambda n: int(n.split("-")[1]))
    tp = int(config_value(overlay, {"name": next(cm["metadata"]["name"] for cm in objects(overlay, "ConfigMap")
                                                 if "tensor-parallel-size" in cm["data"]),
                                    "key": "tensor-parallel-size"}))
    assert len(workers) == tp == GPU_OVERLAYS.get(overlay, 1)
    sched_args = expanded_args(overlay, by_name["scheduler"])
    worker_addresses = [v for n, v in flags(sched_args) if n == "--worker"]
    expected = []
    for rank, name in enumerate(workers):
        args = expanded_args(overlay, by_name[name])
        assert flag(args, "--tp-rank") == str(rank) and flag(args, "--tensor-parallel-size") == str(tp)
        expected.append(f"127.0.0.1:{flag(args, '--port')}")
        gpus = by_name[name]["resources"].get("limits", {}).get("nvidia.com/gpu")
        if overlay in GPU_OVERLAYS:
            assert gpus == 1 and flag(args, "--device") == "cuda", f"{overlay} {name}: one GPU each, the GPU engine"
            assert flag(args, "--cuda-device") == "0", "a container sees only its own GPU, as device 0"
            assert int(flag(args, "--max-num-seqs")) >= int(flag(sched_args, "--max-num-seqs"))
        else:
            assert gpus is None and flag(args, "--device") == "cpu"
    assert worker_addresses == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_finds_every_replica(overlay):
    sts = one(overlay, "StatefulSet", "ferry-replica")
    svc = one(overlay, "Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    sched = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "scheduler")
    sched_port = flag(expanded_args(overlay, sched), "--port")
    [svc_port] = svc["spec"]["ports"]
    assert str(svc_port["port"]) == sched_port
    gateway = one(overlay, "Deployment", "ferry-gateway")["spec"]["template"]["spec"]["containers"][0]
    args = flags(expanded_args(overlay, gateway))
    # Replica discovery through the headless Service's records: every pod of the StatefulSet, however
    # many it has (its HPA changes the count), and no static list to keep in step.
    assert [v for n, v in args if n == "--scheduler-dns"] == [f"{svc['metadata']['name']}:{sched_port}"]
    assert [v for n, v in args if n == "--scheduler"] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_replicas_scale_on_their_schedulers_saturation_and_scale_down_waits_for_the_drain(overlay):
    sts = one(overlay, "StatefulSet", "ferry-replica")
    hpa = one(overlay, "HorizontalPodAutoscaler", "ferry-replica")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                             "name": sts["metadata"]["name"]}
    metrics = {m["pods"]["metric"]["name"]: m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert set(metrics) == {"ferry_scheduler_requests", "ferry_scheduler_kv_cache_usage_ratio"}
    assert metrics["ferry_scheduler_requests"]["pods"]["metric"]["selector"]["matchLabels"] == {"state": "waiting"}
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    # Down one pod at a time, each only after the last had its whole termination grace to drain.
    pod = sts["spec"]["template"]["spec"]
    scheduler = next(c for c in pod["containers"] if c["name"] == "scheduler")
    drain_s = int(flag(expanded_args(overlay, scheduler), "--drain-grace-s"))
    assert pod["terminationGracePeriodSeconds"] > drain_s
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["policies"] and all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"])
    assert min(p["periodSeconds"] for p in down["policies"]) >= pod["terminationGracePeriodSeconds"]


def port_number(container_ports, port):
    """A NetworkPolicy port (a number or a container port's name) as the container's port number; None for a
    name no container of the pod has (it matches nothing there: the workers' ports of a larger overlay)."""
    if isinstance(port, int):
        return port
    return next((p["containerPort"] for p in container_ports if p.get("name") == port), None)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_only_the_gateway_reach_schedulers_and_nothing_reach_workers(overlay):
    gateway_pod = one(overlay, "Deployment", "ferry-gateway")["spec"]["template"]
    replica_pod = one(overlay, "StatefulSet", "ferry-replica")["spec"]["template"]
    gateway_labels, replica_labels = gateway_pod["metadata"]["labels"], replica_pod["metadata"]["labels"]
    policies = {p["metadata"]["name"]: p["spec"] for p in objects(overlay, "NetworkPolicy")}
    assert set(policies) == {"ferry-gateway", "ferry-replica"}

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector["matchLabels"].items())

    replica = policies["ferry-replica"]
    assert selects(replica["podSelector"], replica_labels) and not selects(replica["podSelector"], gateway_labels)
    assert replica["policyTypes"] == ["Ingress"]
    containers = replica_pod["spec"]["containers"]
    ports = [p for c in containers for p in c.get("ports", [])]
    scheduler = next(c for c in containers if c["name"] == "scheduler")
    sched_grpc = int(flag(expanded_args(overlay, scheduler), "--port"))
    worker_grpc = {int(flag(expanded_args(overlay, c), "--port")) for c in containers if c["name"].startswith("worker")}
    reachable = {}  # port -> the `from` entries that reach it
    for rule in replica["ingress"]:
        assert rule.get("from"), "a rule open to every pod"
        for p in rule["ports"]:
            number = port_number(ports, p["port"])
            if number is not None:
                reachable.setdefault(number, []).extend(rule["from"])
    assert [selects(f["podSelector"], gateway_labels) and "namespaceSelector" not in f
            for f in reachable[sched_grpc]] == [True], "only the gateway's pods reach the scheduler"
    assert not worker_grpc & set(reachable), "a worker's gRPC port is reachable from outside its pod"
    metrics = {p["containerPort"] for p in ports if p["name"].endswith("metrics")}
    assert metrics <= set(reachable), "Prometheus cannot scrape every metrics port"

    gateway = policies["ferry-gateway"]
    assert selects(gateway["podSelector"], gateway_labels)
    public = [r for r in gateway["ingress"] if "from" not in r]
    gateway_ports = gateway_pod["spec"]["containers"][0]["ports"]
    assert {port_number(gateway_ports, p["port"]) for r in public for p in r["ports"]} == {50051, 8000}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_selectors_and_budgets_point_at_the_pods(overlay):
    pods = [(o, spec) for o, spec in pod_specs(overlay)]
    for obj in objects(overlay, "Service") + objects(overlay, "PodDisruptionBudget"):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        matched = [(o, spec) for o, spec in pods
                   if all(o["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        assert len(matched) == 1, f"{overlay}: {obj['kind']}/{obj['metadata']['name']} selects {len(matched)} workloads"
        if obj["kind"] == "Service":
            port_names = {p["name"] for c in matched[0][1]["containers"] for p in c["ports"]}
            for port in obj["spec"]["ports"]:
                assert port["targetPort"] in port_names, f"{overlay}: {obj['metadata']['name']} -> {port['targetPort']}"
    for owner, _ in pods:
        assert owner["spec"]["selector"]["matchLabels"].items() <= owner["spec"]["template"]["metadata"]["labels"].items()
    hpa = one(overlay, "HorizontalPodAutoscaler", "ferry-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ferry-gateway"}
    pods_metric = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")["pods"]["metric"]
    adapter = yaml.safe_load((REPO / "deploy" / "prometheus" / "adapter-rules.yaml").read_text())
    assert pods_metric["name"] in {r["name"]["as"] for r in adapter["rules"]}


def test_pods_restart_their_containers():
    """The scheduler never kills a process: the kubelet restarts every container that exits (a
    worker that lost a tensor-parallel peer exits 3 so that it is restarted)."""
    for overlay in OVERLAYS:
        for owner, spec in pod_specs(overlay):
            assert spec["restartPolicy"] == "Always", f"{overlay}: {owner['metadata']['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_hung_worker_is_restarted_within_the_recovery_timeout(overlay):
    """The scheduler sets both failure timeouts explicitly and every worker has the scheduler's step
    timeout (past it the worker's health turns NOT_SERVING, so the kubelet restarts a worker the
    scheduler declared lost); a worker failing its liveness probe is killed without the preStop
    wait (its short kill grace), and killing and restarting it fits in the scheduler's
    --worker-recovery-timeout-s with room left to load the model."""
    spec = one(overlay, "StatefulSet", "ferry-replica")["spec"]["template"]["spec"]
    sched = next(c for c in spec["containers"] if c["name"] == "scheduler")
    sched_args = expanded_args(overlay, sched)
    step_timeout_s, recovery_s = flag(sched_args, "--step-timeout-s"), flag(sched_args, "--worker-recovery-timeout-s")
    assert step_timeout_s and recovery_s, f"{overlay}: set --step-timeout-s and --worker-recovery-timeout-s"
    for c in spec["containers"]:
        if binary_name(c) != "ferry-worker":
            continue
        assert flag(expanded_args(overlay, c), "--step-timeout-s") == step_timeout_s, f"{overlay} {c['name']}"
        probe = c["livenessProbe"]
        pre_stop_wait_s = int(re.search(r"seq (\d+)", c["lifecycle"]["preStop"]["exec"]["command"][-1]).group(1))
        grace_s = probe.get("terminationGracePeriodSeconds")
        assert grace_s is not None and grace_s < pre_stop_wait_s, \
            f"{overlay} {c['name']}: the liveness probe needs a kill grace shorter than the preStop wait ({pre_stop_wait_s} s)"
        kill_s = probe["failureThreshold"] * probe["periodSeconds"] + probe["timeoutSeconds"] + grace_s
        second_restart_backoff_s = 10  # the kubelet's, for a second restart within 10 minutes
        assert kill_s + second_restart_backoff_s <= float(recovery_s) / 2, \
            f"{overlay} {c['name']}: less than half of --worker-recovery-timeout-s={recovery_s} left to load the model"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_covers_the_drain(overlay):
    for owner, spec, c in containers(overlay):
        args = expanded_args(overlay, c)
        grace = spec["terminationGracePeriodSeconds"]
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        if binary_name(c) in ("ferry-gateway", "ferry-scheduler"):
            assert pre_stop[0] == "/bin/sleep"
            assert grace >= int(pre_stop[1]) + int(flag(args, "--drain-grace-s")) + 10, f"{overlay} {c['name']}"
        else:  # a worker waits for its scheduler to exit (its metrics port closes), bounded
            sched = next(x for x in spec["containers"] if x["name"] == "scheduler")
            sched_args = expanded_args(overlay, sched)
            script = pre_stop[-1]
            assert f"/dev/tcp/127.0.0.1/{flag(sched_args, '--metrics-port')}" in script
            wait_s = int(re.search(r"seq (\d+)", script).group(1))
            sched_pre_stop = int(sched["lifecycle"]["preStop"]["exec"]["command"][1])
            assert sched_pre_stop + int(flag(sched_args, "--drain-grace-s")) <= wait_s <= grace - 10


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_keys_and_lanes_come_from_mounted_secret_and_configmap(overlay):
    spec = one(overlay, "Deployment", "ferry-gateway")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = expanded_args(overlay, c)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    keys_dir, keys_file = flag(args, "--api-keys-file").rsplit("/", 1)
    assert "secret" in mounts[keys_dir], "API keys come from a Secret"
    lanes_dir, lanes_file = flag(args, "--lanes-file").rsplit("/", 1)
    cm = mounts[lanes_dir]["configMap"]["name"]
    assert lanes_file in one(overlay, "ConfigMap", cm)["data"]
    json.loads(one(overlay, "ConfigMap", cm)["data"][lanes_file])


def test_prometheus_kubernetes_relabelling_scrapes_every_metrics_port(tmp_path):
    """Runs prometheus.yml's relabelling (promtool check service-discovery) on the targets Kubernetes
    pod discovery would give for the rendered pods: every metrics port becomes a target labelled
    as the dashboard expects; no other port does."""
    groups, expected = [], {}
    for index, overlay in enumerate(OVERLAYS):  # one discovery run: each overlay's pods on their own IP
        for owner, spec, c in containers(overlay):
            template = owner["spec"]["template"]["metadata"]
            pod = f"{owner['metadata']['name']}-0" if owner["kind"] == "StatefulSet" else f"{owner['metadata']['name']}-abc12"
            for port in c["ports"]:
                address = f"10.1.{index}.3:{port['containerPort']}"
                labels = {"__meta_kubernetes_namespace": "prod", "__meta_kubernetes_pod_name": pod,
                          "__meta_kubernetes_pod_container_name": c["name"],
                          "__meta_kubernetes_pod_container_port_name": port["name"]}
                for k, v in template.get("annotations", {}).items():
                    labels["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
                for k, v in template["labels"].items():
                    labels["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = v
                if owner["kind"] == "StatefulSet":  # the label the StatefulSet controller adds
                    labels["__meta_kubernetes_pod_label_statefulset_kubernetes_io_pod_name"] = pod
                groups.append({"targets": [address], "labels": labels})
                if port["name"].endswith("metrics"):
                    component = c["name"].split("-")[0]
                    expected[address + c["name"]] = {"namespace": "prod", "pod": pod, "container": c["name"],
                                                     "component": component, "job": "ferry", "instance": address,
                                                     **({"replica": pod} if owner["kind"] == "StatefulSet" else {})}
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(groups))
    config = kubernetes_config_as_file_sd(tmp_path, targets)
    promtool("check", "config", str(config))
    found = json.loads(promtool("check", "service-discovery", "--timeout=5s", str(config), "ferry"))
    assert len(found) == len(groups)
    got = {}
    for t in found:
        if t["labels"]:
            public = {k: v for k, v in t["labels"].items() if not k.startswith("__")}
            got[public["instance"] + public["container"]] = public
    assert got == expected


# ---- the image recipe ----

def test_the_image_ships_what_the_manifests_run():
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?", dockerfile, re.M)
    assert len(stages) >= 3, "multi-stage: build, CUDA runtime base, image"
    assert stages[-1][0] == "cuda-runtime" and any(s[1] == "build" for s in stages)
    assert re.search(r"cuda-cudart-\$\{CUDA_PKG_VERSION\}", dockerfile), "the runtime base carries the CUDA runtime"
    built = set(re.findall(r"build/bin/(ferry-[a-z-]+)", dockerfile))
    for overlay in OVERLAYS:
        for _, spec, c in containers(overlay):
            assert binary_name(c) in built, f"the image lacks {binary_name(c)}"
            assert spec["securityContext"]["runAsUser"] == 10001
    assert "USER 10001:10001" in dockerfile


def test_the_image_installs_the_libraries_the_binaries_link():
    """Each shared library a service binary needs (ELF NEEDED) comes from a Debian package the
    image's last stage installs, or from the base system."""
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    last_stage = dockerfile[dockerfile.rindex("\nFROM "):]
    installed = set(re.findall(r"\b(lib[a-z0-9.+-]+|ocl-icd-libopencl1)\b", last_stage))
    base_system = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
    missing = {}
    for name in ("ferry-gateway", "ferry-scheduler", "ferry-worker", "ferry-launch"):
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                            subprocess.run(["readelf", "-d", str(BIN / name)], capture_output=True, text=True).stdout)
        ldd = dict(re.findall(r"^\s*(\S+) => (\S+)", subprocess.run(["ldd", str(BIN / name)], capture_output=True,
                                                                        text=True).stdout, re.M))
        for lib in needed:
            if lib.startswith("ld-linux"):
                continue  # the dynamic loader (libc6), which ldd lists without a path mapping
            if re.match(r"lib(asan|ubsan|tsan|lsan)\.so", lib):
                continue  # a sanitizer runtime: only in scripts/sanitize.sh builds, which no image ships
            real = Path(ldd[lib]).resolve()
            owner = subprocess.run(["dpkg", "-S", str(real)], capture_output=True, text=True).stdout.split(":")[0]
            if owner and owner not in installed | base_system:
                missing[lib] = owner
    assert not missing, f"add to the Dockerfile's last stage: {missing}"


# ---- overlays/tls: TLS on every hop with cert-manager's certificates ----

TLS_OVERLAY = "overlays/tls"
# The Certificate spec fields this overlay uses, all of cert-manager.io/v1 (its CRD's schema is not in
# the Kubernetes schemas kubernetes-validate reads).
CERTIFICATE_FIELDS = {"isCA", "commonName", "secretName", "duration", "renewBefore", "dnsNames", "ipAddresses",
                      "usages", "privateKey", "issuerRef"}


def test_the_tls_overlay_validates_and_its_certificates_chain_to_one_ca():
    kubernetes_validate = validator()
    cert_manager = []
    for obj in render(TLS_OVERLAY):
        if obj["apiVersion"] == "cert-manager.io/v1":
            cert_manager.append(obj)
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
    assert sorted(o["kind"] for o in cert_manager) == ["Certificate"] * 3 + ["Issuer"] * 2
    issuers = {o["metadata"]["name"]: o["spec"] for o in cert_manager if o["kind"] == "Issuer"}
    certificates = {o["metadata"]["name"]: o["spec"] for o in cert_manager if o["kind"] == "Certificate"}
    for name, spec in certificates.items():
        assert set(spec) <= CERTIFICATE_FIELDS, f"{name}: {set(spec) - CERTIFICATE_FIELDS}"
        assert spec["issuerRef"]["kind"] == "Issuer" and spec["issuerRef"]["name"] in issuers
    ca = [n for n, s in certificates.items() if s.get("isCA")]
    assert ca == ["ferry-ca"] and "selfSigned" in issuers[certificates["ferry-ca"]["issuerRef"]["name"]]
    # Every service certificate comes from the CA issuer, so every peer trusts one ca.crt.
    ca_issuer = next(n for n, s in issuers.items() if s.get("ca", {}).get("secretName") == certificates["ferry-ca"]["secretName"])
    assert all(s["issuerRef"]["name"] == ca_issuer for n, s in certificates.items() if n != "ferry-ca")


def test_every_service_of_the_tls_overlay_runs_tls_and_exec_probes_from_its_certificate():
    certificates = {o["spec"]["secretName"]: o["spec"] for o in objects(TLS_OVERLAY, "Certificate")}
    base_containers = {c["name"]: c for _, _, c in containers("base")}
    for _, pod, c in containers(TLS_OVERLAY):
        args = expanded_args(TLS_OVERLAY, c)
        options = help_options(binary_name(c))
        assert all(name in options for name, _ in flags(args)), c["name"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        files = []
        for name, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"), ("--tls-ca", "ca.crt")):
            directory, file = flag(args, name).rsplit("/", 1)
            assert file == key, f"{c['name']} {name}"
            secret = volumes[mounts[directory]]["secret"]["secretName"]
            spec = certificates[secret]
            # Server and client (mutual TLS inside); loopback for the probes and the scheduler's workers.
            assert {"server auth", "client auth"} <= set(spec["usages"]) and "127.0.0.1" in spec["ipAddresses"]
            files.append(f"{name}={directory}/{file}")
        port = flag(args, "--port")
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c[kind]
            assert "grpc" not in probe, f"{c['name']} {kind}: the kubelet's gRPC probe speaks no TLS"
            service = base_containers[c["name"]][kind]["grpc"].get("service", "")
            command = probe["exec"]["command"]
            assert command[:3] == ["/opt/ferry/bin/ferry-client", "--health", service], f"{c['name']} {kind}"
            assert command[3:5] == ["--target", f"127.0.0.1:{port}"]
            assert sorted(command[5:]) == sorted(files), f"{c['name']} {kind}: not the container's own certificate"
            client_help = subprocess.run([str(binary("ferry-client")), "--help"], capture_output=True, text=True).stdout
            names = ["--health", "--target"] + [name for name, _ in flags(command[5:])]
            assert all(re.search(rf"^\s+{name}\b", client_help, re.M) for name in names), names
    gateway = one(TLS_OVERLAY, "Deployment", "ferry-gateway")["spec"]["template"]["spec"]["containers"][0]
    server_name = flag(expanded_args(TLS_OVERLAY, gateway), "--tls-server-name")
    assert server_name in certificates["ferry-replica-tls"]["dnsNames"], "the gateway checks a name the replicas lack"
