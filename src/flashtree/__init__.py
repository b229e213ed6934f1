"""flashtree: lossless speculative decoding (DFlash chains, DDTree trees) and an OpenAI-compatible server."""
from .llm import LLM, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput"]
__version__ = "0.1.0"
