"""The dtype names a user may write (`dtype=`, `--dtype`, FLASHTREE_DTYPE) and the torch dtypes
they mean. Which dtype "auto" picks is the loader's rule, not this table's."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64}
