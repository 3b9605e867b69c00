"""Pure: which nodes a job's GPU pods may land on, from compute.gpuType.

`gpu_type` ("H100", "A100", ...) names a GPU model; nodes say which model they carry through a label. The
default label is the one NVIDIA GPU feature discovery sets, `nvidia.com/gpu.product`, whose values are the
product names the driver reports with spaces replaced by dashes ("NVIDIA-H100-80GB-HBM3"). One short name
maps to every product value of that model (the SXM, PCIe and NVL variants differ), and a pod that asks for
GPUs gets a required node affinity `<label> In [values]`. The mapping and the label are the operator's
settings (gpu_node_label, gpu_products); docs/how-to/gpu-scheduling.md lists the defaults. A gpu_type
that is not in the mapping is taken as a label value itself, so a cluster may name its exact product.
Pods without GPUs (CPU runs, gpu_type "CPU", task apps) get no affinity."""

from __future__ import annotations

import re
from typing import Any

from posttrain.controller.gpu_types import GFD_PRODUCT_LABEL
from posttrain.controller.spec_errors import SpecError

# A Kubernetes label value: at most 63 characters, alphanumerics with -_. inside.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


def gpu_products(gpu_type: str, mapping: dict[str, list[str]]) -> list[str]:
    """The label values of `gpu_type`: the mapping's entry (case-insensitive), else the name itself."""
    wanted = gpu_type.strip()
    for name, values in mapping.items():
        if name.strip().lower() == wanted.lower():
            return list(values)
    if not _LABEL_VALUE.match(wanted):
        raise SpecError(
            "compute.gpuType",
            f"{gpu_type!r} is neither a known GPU type nor a valid node label value",
            f"one of {', '.join(sorted(mapping))}, or a node's {GFD_PRODUCT_LABEL} value",
        )
    return [wanted]


def gpu_affinity(gpu_type: str | None, gpus: int, label: str, mapping: dict[str, list[str]]) -> dict[str, Any]:
    """The pod spec's `affinity` for a pod asking for `gpus` GPUs of `gpu_type` ({} when it asks for none,
    or when the operator's label setting is empty: selection switched off)."""
    if gpus <= 0 or not gpu_type or not label:
        return {}
    term = {"matchExpressions": [{"key": label, "operator": "In", "values": gpu_products(gpu_type, mapping)}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
