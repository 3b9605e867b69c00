"""posttrain: declarative GitOps job controller for LLM post-training."""

__version__ = "0.1.0"
