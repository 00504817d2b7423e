"""The commented starter configuration ``miles-ray init`` writes."""

STARTER = """\
# miles-ray configuration. Precedence: command-line flags > MILES_RAY_* env vars > this file > defaults.
# Every key is optional; unknown keys are an error. 'miles-ray plan' and 'miles-ray render' read it.

# Cluster name: a DNS-1035 label of at most 53 characters (KubeRay derives pod/service names from it).
name: miles
namespace: default
# kube_context: my-gpu-cluster
# kubeconfig: ~/.kube/config
# Ray dashboard / Jobs API of an existing head, for 'submit' (default: the cluster made by 'up').
# ray_address: http://miles-head-svc.default.svc:8265

# Polyaxon (the default 'up' path creates a raycluster operation in this project).
polyaxon_owner: default
polyaxon_project: miles
# polyaxon_host: http://polyaxon.example:8000
# The Polyaxon API as pods reach it (default: polyaxon_host), e.g. its in-cluster Service when the URL above is
# an ingress or a port-forward only this machine reaches: runs' supervisors report to their Polyaxon runs there.
# polyaxon_host_in_cluster: http://polyaxon-polyaxon-api.polyaxon.svc.cluster.local:80
# polyaxon_preset: gpu-h100

# Gang admission: a Kueue LocalQueue (or, with scheduler: volcano, a Volcano queue) admits the whole cluster.
# queue: team-a
# scheduler: volcano

# The Miles image, pinned by digest: head, every worker and the submitter run exactly this build.
# image: radixark/miles:latest@sha256:<64 hex>
# Ray version installed in that image (docker run IMAGE python -c 'import ray; print(ray.__version__)').
# ray_version: "2.60.0"
# Ray token authentication (default token: KubeRay >= 1.6 keeps the token in a Secret named after the cluster,
# key auth_token; miles-ray reads it to talk to the head). 'none' lets anyone who reaches the head run code.
# ray_auth: token
# ray_auth_secret: my-ray-token   # an existing Secret (key auth_token) instead of the one KubeRay creates
# GCS fault tolerance (--via kuberay): the head's loss does not restart the workers; a Redis the pods reach and
# the Secret holding its password (NAME[:KEY], key default 'password'; 'none' for a Redis without a password).
# gcs_ft: redis://redis.ray-infra.svc.cluster.local:6379
# gcs_ft_password_secret: redis-password

# Recipe and split ('miles-ray recipes' lists them; 'miles-ray plan' checks the split).
recipe: Qwen3-4B
nodes: 1
gpus_per_node: 8
# layout: disaggregated     # default: the recipe's own layout
# rollout_nodes: 1          # disaggregated: whole nodes given to SGLang rollout

# GPU worker pods. cpus_per_node must be >= gpus_per_node + 1. Memory includes /dev/shm.
cpus_per_node: 64
# cpu_request_per_node: 500m  # Kubernetes CPU request if lower than cpus_per_node (limit and Ray keep 64)
memory_per_node: 512Gi
# gpu_memory: 80GiB  # one GPU's memory: plan/submit check the job fits (default: node labels, else unchecked)
head_cpus: 8
head_memory: 64Gi
# node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
# pod_security: restricted  # non-root run_as_user (default 1000), no privilege escalation, no capabilities,
#                           # seccomp RuntimeDefault; default baseline (the Miles image runs as root)
tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}

# Shared storage, mounted at the same path on head and every worker.
connection: miles-data      # Polyaxon connection (Polyaxon path)
# volume_claim: miles-data  # PVC (KubeRay path; default: the connection name)
mount_path: /mnt/miles
models_dir: models
datasets_dir: datasets
runs_dir: runs

# Miles inside the image.
miles_root: /root/miles
megatron_path: /root/Megatron-LM
nccl_nvls_enable: "0"
# env: {RAY_DEDUP_LOGS: "0"}
# Credentials come from Kubernetes Secrets, never as values: ENV_NAME: secret-name/key
# secret_env: {HF_TOKEN: hf-token/token, WANDB_API_KEY: wandb/api-key}
"""
