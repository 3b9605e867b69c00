"""The default mapping from compute.gpuType to node label values (data only; the operator's settings may
replace it, controller/render/gpu.py applies it). Documented in docs/how-to/gpu-scheduling.md."""

from __future__ import annotations

# The label NVIDIA GPU feature discovery (part of the GPU operator) sets on every GPU node.
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Short names -> nvidia.com/gpu.product values as GPU feature discovery writes them (the driver's product
# name, spaces as dashes). Keys are matched case-insensitively.
DEFAULT_GPU_PRODUCTS: dict[str, list[str]] = {
    "B200": ["NVIDIA-B200"],
    "H200": ["NVIDIA-H200", "NVIDIA-H200-NVL"],
    "H100": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"],
    "GH200": ["NVIDIA-GH200-480GB"],
    "A100": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-40GB"],
    "L40S": ["NVIDIA-L40S"],
    "L40": ["NVIDIA-L40"],
    "L4": ["NVIDIA-L4"],
    "A10G": ["NVIDIA-A10G"],
    "A10": ["NVIDIA-A10"],
    "T4": ["Tesla-T4"],
}
