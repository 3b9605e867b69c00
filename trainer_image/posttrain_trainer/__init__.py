"""posttrain trainer: SFT and GSPO under torchrun (see docs/concepts/trainer.md)."""

import logging

# transformers imports bitsandbytes whenever it is installed; on CPUs with AVX512-BF16 its CPU backend warns
# on every import that the optional `kernels` package (a faster QLoRA matmul) is missing. It falls back to
# its own kernel, so the warning is noise in every trainer log.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
