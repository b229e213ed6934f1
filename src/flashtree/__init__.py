"""flashtree: lossless speculative decoding (DFlash chains, DDTree trees) and an OpenAI-compatible server."""
from . import cpu

cpu.prepare()  # OpenMP's wait policy and torch's dispatch path, before anything loads torch
from .engine.sequence import TokenLogprob  # noqa: E402
from .llm import LLM, RequestOutput  # noqa: E402
from .sampling_params import SamplingParams, StructuredOutput  # noqa: E402

__all__ = ["LLM", "SamplingParams", "StructuredOutput", "RequestOutput", "TokenLogprob"]
__version__ = "0.1.0"
