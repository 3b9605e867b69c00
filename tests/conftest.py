"""Shared fixtures live in tests/fixtures/<concern>.py, one owner each, loaded here."""

pytest_plugins = [
    "fixtures.models",
    "fixtures.taskapp",
    "fixtures.s3",
    "fixtures.vllm",
    "fixtures.cluster",
    "fixtures.hostile_taskapp",
    "fixtures.operator_env",
    "fixtures.signals",
    "fixtures.argocd",
]
