"""The configuration model: every key a cluster and a run take, each checked on its own and against the others."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from miles_ray.core.config.values import (CPU_QUANTITY, ENV_NAME, NO_PASSWORD, QUANTITY, SECRET_KEY, SECRET_OBJECT,
                                          cpu_millis, parse_password_secret, parse_redis_address)
from miles_ray.core.errors import ConfigError
from miles_ray.core.memory import parse_size
from miles_ray.core.names import check_cluster_name, check_namespace
from miles_ray.core.secrets import HINT, secret_name, secret_value

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None


class MilesRayConfig(BaseModel):
    """Everything miles-ray needs to build a cluster and submit a run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # identity and where
    name: str = Field("miles", description="cluster name (DNS-1035 label, <= 53 characters)")
    namespace: str = Field("default", description="Kubernetes namespace")
    kube_context: str | None = Field(None, description="kubeconfig context (default: current)")
    kubeconfig: str | None = Field(None, description="kubeconfig path (default: $KUBECONFIG or ~/.kube/config)")
    ray_address: str | None = Field(None, description="Ray dashboard / Jobs API URL of an existing head (http://HOST:8265)")
    polyaxon_host: str | None = Field(None, description="Polyaxon API URL (default: $POLYAXON_HOST)")
    polyaxon_host_in_cluster: str | None = Field(
        None, description="the Polyaxon API as pods reach it (default: polyaxon_host): where a run's supervisor "
                          "pod reports the run's Polyaxon run")
    polyaxon_owner: str = Field("default", description="Polyaxon organization")
    polyaxon_project: str = Field("miles", description="Polyaxon project for operations")
    polyaxon_preset: str | None = Field(None, description="Polyaxon scheduling preset applied to the operation")
    queue: str | None = Field(None, description="queue that admits the whole cluster at once: a Kueue LocalQueue "
                              "(label kueue.x-k8s.io/queue-name), or with scheduler: volcano a Volcano queue")
    scheduler: Literal["default", "volcano"] = Field(
        "default", description="pod scheduler: default, or volcano (KubeRay's ray.io/scheduler-name: volcano gang)")

    # image and Ray
    image: str | None = Field(None, description="Miles image, pinned: repo[:tag]@sha256:<64 hex>")
    allow_unpinned: bool = Field(False, description="accept a tag-only image (warns)")
    ray_version: str | None = Field(None, description="Ray version inside the image (rayVersion)")
    ray_auth: Literal["token", "none"] = Field(
        "token", description="Ray token authentication: token (every Ray process of the cluster requires the "
        "cluster's token; miles-ray sends it) or none (anyone who reaches the head can run code there: warns)")
    ray_auth_secret: str | None = Field(
        None, description="Kubernetes Secret holding the Ray token under the key auth_token (default: the one "
        "named after the cluster, which KubeRay creates for --via kuberay; the Polyaxon path needs it to exist)")
    gcs_ft: str | None = Field(
        None, description="GCS fault tolerance: redis://HOST:PORT of a Redis reachable from the cluster's pods; the "
        "head's loss then does not take the workers (and jobs whose driver runs on a worker) with it (KubeRay's "
        "gcsFaultToleranceOptions, KubeRay >= 1.3; --via kuberay only: Polyaxon 2.18's raycluster cannot carry it)")
    gcs_ft_password_secret: str | None = Field(
        None, description="gcs_ft: the Kubernetes Secret holding the Redis password, NAME[:KEY] (key default "
        "'password'), read by the pods by reference; 'none' for a Redis without a password (explicitly)")

    # recipe and split
    recipe: str = Field("Qwen3-4B", description="recipe name (miles-ray recipes)")
    recipe_file: str | None = Field(None, description="YAML file with extra recipes")
    nodes: int = Field(1, ge=1, le=4096, description="GPU worker nodes")
    gpus_per_node: int = Field(8, ge=1, le=64, description="GPUs per worker node")
    layout: Literal["colocated", "disaggregated"] | None = Field(None, description="default: the recipe's")
    rollout_nodes: int | None = Field(None, ge=0, le=4096, description="disaggregated: nodes for rollout")
    rollout_gpus: int | None = Field(None, ge=1, le=1 << 20, description="disaggregated: rollout GPUs")

    # pods
    cpus_per_node: int = Field(64, ge=1, le=4096, description="CPUs per GPU worker pod (also Ray num-cpus)")
    cpu_request_per_node: str | None = Field(
        None, description="Kubernetes CPU request of each GPU worker pod, e.g. 32 or 500m (default: "
        "cpus_per_node); the CPU limit and Ray's num-cpus stay cpus_per_node")
    memory_per_node: str = Field("512Gi", description="memory per GPU worker pod, including /dev/shm")
    gpu_memory: str | None = Field(
        None, description="memory of one GPU, e.g. 80GiB: plan/submit check that the job fits it (default: the "
        "nodes' nvidia.com/gpu.memory or gpu.product labels on Kubernetes, else unknown and not checked)")
    head_cpus: int = Field(8, ge=1, le=4096, description="CPUs of the head pod (Ray num-cpus stays 0)")
    head_memory: str = Field("64Gi", description="memory of the head pod")
    worker_group: str = Field("gpu", description="KubeRay worker group name")
    pod_security: Literal["baseline", "restricted"] = Field(
        "baseline", description="Pod Security Standard the Ray pods meet: baseline (the image's own user, root in "
        "the Miles image) or restricted (run_as_user, no privilege escalation, no capabilities, seccomp "
        "RuntimeDefault; the image must work as that user)")
    run_as_user: int = Field(1000, ge=1, le=2**31 - 1, description="restricted: the non-root uid of the Ray containers")
    node_selector: dict[str, str] = Field(default_factory=dict, description="node selector for GPU workers")
    tolerations: list[Toleration] = Field(
        default_factory=lambda: [Toleration(**GPU_TOLERATION)], description="tolerations for GPU workers"
    )

    # storage
    connection: str = Field("miles-data", description="Polyaxon connection with the shared volume")
    volume_claim: str | None = Field(None, description="PVC for the KubeRay path (default: the connection name)")
    mount_path: str = Field("/mnt/miles", description="where the shared volume is mounted everywhere")
    models_dir: str = Field("models", description="model dir, relative to mount_path")
    datasets_dir: str = Field("datasets", description="dataset dir, relative to mount_path")
    runs_dir: str = Field("runs", description="per-run output dirs, relative to mount_path")

    # Miles inside the image
    miles_root: str = Field("/root/miles", description="Miles checkout inside the image")
    megatron_path: str = Field("/root/Megatron-LM", description="Megatron-LM inside the image")
    nccl_nvls_enable: Literal["0", "1"] = Field("0", description="NCCL_NVLS_ENABLE (0 for multi-node Blackwell)")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for head, workers and job")
    secret_env: dict[str, str] = Field(
        default_factory=dict,
        description="credentials from Kubernetes Secrets: {ENV_NAME: secret-name/key} (never a value)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_cluster_name(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        try:
            return check_namespace(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None

    @field_validator("worker_group", "connection", "volume_claim", "queue")
    @classmethod
    def _dns(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 63 or not re.fullmatch(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", v)):
            raise ValueError(f"{v!r} must be a DNS-1123 label (lower-case letters, digits, '-')")
        return v

    @field_validator("memory_per_node", "head_memory")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not QUANTITY.fullmatch(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity such as 512Gi")
        return v

    @field_validator("gpu_memory")
    @classmethod
    def _gpu_memory(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_size(v, what="gpu_memory")
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("cpu_request_per_node")
    @classmethod
    def _cpu_quantity(cls, v: str | None) -> str | None:
        if v is not None and (not CPU_QUANTITY.fullmatch(v) or cpu_millis(v) == 0):
            raise ValueError(f"{v!r} is not a CPU quantity such as 32, 0.5 or 500m")
        return v

    @field_validator("mount_path", "miles_root", "megatron_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        p = PurePosixPath(v)
        if not p.is_absolute() or ".." in p.parts or "\x00" in v:
            raise ValueError(f"{v!r} must be an absolute path without '..'")
        return str(p)

    @field_validator("models_dir", "datasets_dir", "runs_dir")
    @classmethod
    def _rel(cls, v: str) -> str:
        p = PurePosixPath(v)
        if not v or p.is_absolute() or ".." in p.parts or "\x00" in v:
            raise ValueError(f"{v!r} must be a relative path inside mount_path (no leading '/', no '..')")
        return str(p)

    @field_validator("ray_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"^https?://[A-Za-z0-9._\-\[\]:]+(/.*)?$", v):
            raise ValueError(f"{v!r} is not a dashboard URL such as http://my-cluster-head-svc.ns.svc:8265")
        return v

    @field_validator("ray_version")
    @classmethod
    def _ray_version(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$", v):
            raise ValueError(f"{v!r} is not a Ray version such as 2.60.0")
        return v

    @field_validator("ray_auth_secret")
    @classmethod
    def _ray_auth_secret(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 253 or not SECRET_OBJECT.fullmatch(v)):
            raise ValueError(f"{v!r} is not a Kubernetes Secret name (a DNS-1123 name such as miles-ray-token)")
        return v

    @field_validator("gcs_ft")
    @classmethod
    def _gcs_ft(cls, v: str | None) -> str | None:
        if v is not None:
            host, port = parse_redis_address(v)
            return f"redis://{host}:{port}"
        return v

    @field_validator("gcs_ft_password_secret")
    @classmethod
    def _gcs_ft_password_secret(cls, v: str | None) -> str | None:
        if v is not None:
            parse_password_secret(v)
        return v

    @model_validator(mode="after")
    def _gcs_ft_complete(self) -> "MilesRayConfig":
        if self.gcs_ft and self.gcs_ft_password_secret is None:
            raise ValueError("gcs_ft needs the Redis password's Secret: --gcs-ft-password-secret NAME[:KEY] (or "
                             f"'{NO_PASSWORD}' for a Redis without a password, explicitly)")
        if self.gcs_ft_password_secret is not None and not self.gcs_ft:
            raise ValueError("gcs_ft_password_secret is set without gcs_ft (--gcs-ft redis://HOST:PORT)")
        return self

    @property
    def gcs_ft_host_port(self) -> tuple[str, int] | None:
        """(HOST, PORT) of the GCS fault-tolerance Redis, or None without it."""
        return parse_redis_address(self.gcs_ft) if self.gcs_ft else None

    @property
    def gcs_ft_password(self) -> tuple[str, str] | None:
        """(Secret, key) of the Redis password, or None (no GCS fault tolerance, or a Redis without a password)."""
        return parse_password_secret(self.gcs_ft_password_secret) if self.gcs_ft_password_secret else None

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, value in v.items():
            if not ENV_NAME.fullmatch(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
            what = "a credential" if secret_name(k) else secret_value(str(value))
            if what:  # never echo the value itself
                raise ValueError(f"{k}=... looks like {what}; env is written in plain text into specs ({HINT})")
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, ref in v.items():
            if not ENV_NAME.fullmatch(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
            secret, sep, key = str(ref).partition("/")
            if (not sep or len(secret) > 253 or not SECRET_OBJECT.fullmatch(secret) or not key or len(key) > 253
                    or not SECRET_KEY.fullmatch(key)):
                # the reference is a name, but a malformed one may be a pasted value: do not echo it
                raise ValueError(f"{k} must reference a Kubernetes Secret as 'secret-name/key' "
                                 "(a DNS-1123 name, '/', a key of letters, digits, '-', '_' or '.')")
        return v

    @model_validator(mode="after")
    def _env_disjoint(self) -> "MilesRayConfig":
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"{', '.join(both)} set in both env and secret_env")
        return self

    @model_validator(mode="after")
    def _workers_have_cpus(self) -> "MilesRayConfig":
        if self.cpus_per_node < self.gpus_per_node + 1:
            raise ValueError(
                f"cpus_per_node {self.cpus_per_node} < gpus_per_node {self.gpus_per_node} + 1: Miles puts one "
                "{GPU:1, CPU:1} bundle per GPU and needs a spare CPU for its RolloutManager"
            )
        if self.cpu_request_per_node is not None and cpu_millis(self.cpu_request_per_node) > self.cpus_per_node * 1000:
            raise ValueError(
                f"cpu_request_per_node {self.cpu_request_per_node} > cpus_per_node {self.cpus_per_node}: Kubernetes "
                "refuses a CPU request above the limit; lower the request or raise cpus_per_node")
        return self

    @property
    def worker_cpu_request(self) -> float:
        """CPUs the scheduler must find free for one GPU worker pod (its CPU request)."""
        if self.cpu_request_per_node is not None:
            return cpu_millis(self.cpu_request_per_node) / 1000
        return float(self.cpus_per_node)

    # derived paths
    @property
    def claim(self) -> str:
        return self.volume_claim or self.connection

    def path(self, sub: str) -> str:
        return str(PurePosixPath(self.mount_path) / sub)

    @property
    def model_dir(self) -> str:
        return self.path(self.models_dir)

    @property
    def data_dir(self) -> str:
        return self.path(self.datasets_dir)

    def output_dir(self, run_id: str) -> str:
        return str(PurePosixPath(self.mount_path) / self.runs_dir / run_id)
