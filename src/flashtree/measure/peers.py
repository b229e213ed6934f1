"""The bench's peers: other engines decoding the bench's prompt ids on the same weights, one prompt
at a time (batch 1), each pass timed as our passes are (a `Pass`: seconds and completion tokens
over the prompt set; every prompt prefilled, `max_tokens` each, or up to EOS without ignore_eos).

- `HFPeer`: transformers `generate` on the target's own checkpoint, plain and with prompt lookup.
- `LlamaCppPeer`: llama.cpp through llama-cpp-python (the optional `peers` extra, built from
  source) on the GGUF file the model was converted from — the file itself (e.g. Q4_1) and the same
  weights rewritten unquantized (F32, BF16; written once into the cache) — each plain and with
  llama-cpp-python's prompt lookup (`LlamaPromptLookupDecoding`).
- `choose_peers`: which of them a bench runs, and why one that would apply is left out.

Nothing here runs our engine, summarises passes or prints (`benchmarking.py`, `commands/bench.py`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from ..errors import UserError
from ..sampling_params import SamplingParams
from .bench import Pass

ENGINES = ("hf", "llama.cpp")  # the names --peers takes
LLAMA_CPP_WEIGHTS = ("f32", "bf16", "f16", "file")  # "file": the GGUF as it is (e.g. Q4_1)
INSTALL_LLAMA_CPP = "pip install 'flashtree[peers]' (builds llama.cpp from source, ~5 min)"


@dataclass(slots=True, frozen=True)
class PeerRun:
    """One peer configuration: a row of the report's peers."""
    name: str                        # hf_generate, hf_prompt_lookup, llama.cpp q4_1, llama.cpp f32 lookup, ...
    engine: str                      # "transformers" or "llama.cpp"
    lookup_tokens: int | None = None  # prompt lookup: tokens drafted per round; None = plain decoding
    max_ngram: int | None = None     # prompt lookup: the longest n-gram matched (n = max..1)
    weights: str | None = None       # llama.cpp: the GGUF's weight type (f32, bf16, q4_1, ...)


class Peer(Protocol):
    runs: list[PeerRun]

    def run(self, run: PeerRun, prompt_ids: list[list[int]], params: list[SamplingParams]) -> Pass: ...


# ---------------------------------------------------------------------------- which peers
@dataclass(slots=True, frozen=True)
class PeerChoice:
    engines: tuple[str, ...]   # the peers to run, in ENGINES order
    skipped: tuple[str, ...]   # one line for each peer that applies but cannot run here, saying why
    gguf: Path | None = None   # llama.cpp: the GGUF file the model was converted from


def llama_cpp_missing() -> str | None:
    """Why llama-cpp-python cannot run here (not installed, or its library does not load), or None."""
    try:
        import llama_cpp  # noqa: F401  (loads the llama.cpp library it built)
    except ModuleNotFoundError as e:
        if e.name != "llama_cpp":
            return f"llama-cpp-python does not import ({e})"
        return "llama-cpp-python is not installed"
    except (ImportError, OSError, RuntimeError) as e:
        return f"llama-cpp-python does not import ({type(e).__name__}: {e})"
    return None


def choose_peers(requested: list[str] | None, model_dir: str | Path) -> PeerChoice:
    """requested: --peers' engines (None: every one that applies; []: none). llama.cpp applies to
    a model converted from a GGUF file (a .gguf path, or a name such as smollm2-135m-instruct);
    asked for by name, a peer that cannot run is an error, by default a line in `skipped`."""
    from ..models.gguf import gguf_source
    explicit = requested is not None
    names = list(dict.fromkeys(requested if explicit else ENGINES))
    bad = [n for n in names if n not in ENGINES]
    if bad:
        raise UserError(f"--peers: unknown peer(s) {', '.join(bad)}; choose from {', '.join(ENGINES)}")
    engines, skipped, source = [], [], None
    if "hf" in names:
        engines.append("hf")
    if "llama.cpp" in names:
        source = gguf_source(model_dir)
        if source is None:  # not converted from a GGUF file: the peer does not apply
            if explicit:
                raise UserError(f"--peers llama.cpp reads the GGUF file the model was converted from, and "
                                 f"{model_dir} has none: use --model smollm2-135m-instruct or --model FILE.gguf")
        elif (why := llama_cpp_missing()) is not None:
            if explicit:
                raise UserError(f"--peers llama.cpp: {why}; {INSTALL_LLAMA_CPP}")
            skipped.append(f"llama.cpp peer skipped: {why}; {INSTALL_LLAMA_CPP}")
            source = None
        else:
            engines.append("llama.cpp")
    return PeerChoice(tuple(engines), tuple(skipped), source)


# ---------------------------------------------------------------------------- transformers
class HFPeer:
    """transformers `generate` on the target's own checkpoint, one prompt at a time (batch 1);
    `hf_prompt_lookup` copies `lookup_tokens` and matches n-grams up to `max_ngram` (our `ngram`'s)."""

    def __init__(self, model_dir: str | Path, device: torch.device, dtype: torch.dtype, lookup_tokens: int,
                 max_ngram: int | None = None):
        from transformers import AutoModelForCausalLM
        try:
            self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        except Exception as e:  # any loader failure becomes one actionable line
            raise UserError(f"transformers cannot load {model_dir} as a peer ({type(e).__name__}: {e}); "
                             "run with --no-peers") from e
        self.device = device
        self.runs = [PeerRun("hf_generate", "transformers"),
                     PeerRun("hf_prompt_lookup", "transformers", lookup_tokens=lookup_tokens, max_ngram=max_ngram)]

    def run(self, run: PeerRun, prompt_ids: list[list[int]], params: list[SamplingParams]) -> Pass:
        tokens, t0 = 0, time.perf_counter()
        for ids, sp in zip(prompt_ids, params):
            x = torch.tensor([ids], device=self.device)
            kw = dict(max_new_tokens=sp.max_tokens, do_sample=not sp.greedy, pad_token_id=0,
                      attention_mask=torch.ones_like(x))
            if not sp.greedy:
                kw.update(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                          min_p=sp.min_p or None)
                torch.manual_seed(sp.seed if sp.seed is not None else 0)
            else:
                kw.update(temperature=None, top_k=None, top_p=None)
            if sp.ignore_eos:
                kw["min_new_tokens"] = sp.max_tokens
            if run.lookup_tokens:
                kw["prompt_lookup_num_tokens"] = run.lookup_tokens
                if run.max_ngram:  # as our ngram's max_ngram (both try n = max..1)
                    kw["max_matching_ngram_size"] = run.max_ngram
            with torch.inference_mode():
                out = self.model.generate(x, **kw)
            tokens += out.shape[1] - len(ids)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return Pass(seconds=time.perf_counter() - t0, tokens=tokens)


# ---------------------------------------------------------------------------- llama.cpp
@dataclass(slots=True, frozen=True)
class LlamaCppOptions:
    weights: tuple[str, ...] = ("f32", "bf16", "file")  # the files timed, each a name in LLAMA_CPP_WEIGHTS
    lookup_tokens: int = 2        # LlamaPromptLookupDecoding's num_pred_tokens (its README: 2 on CPU)
    max_ngram: int = 2            # ... and its max_ngram_size
    threads: int | None = None    # n_threads; None = torch's thread count

    def __post_init__(self):
        bad = [w for w in self.weights if w not in LLAMA_CPP_WEIGHTS]
        if bad or not self.weights:
            raise UserError(f"--llama-cpp-weights takes a comma list of {', '.join(LLAMA_CPP_WEIGHTS)} "
                             f"('file': the GGUF as it is), got {', '.join(bad) or 'none'}")
        if self.lookup_tokens < 1 or self.max_ngram < 1:
            raise UserError(f"llama.cpp prompt lookup needs tokens and n-gram size >= 1, got "
                             f"{self.lookup_tokens} and {self.max_ngram}")


UNQUANTIZED = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}  # --llama-cpp-weights -> requantize dtype


def llama_cpp_files(source: Path, weights: tuple[str, ...]) -> dict[str, Path]:
    """weight type -> the GGUF file llama.cpp reads: `source` itself for "file", else its weights
    rewritten unquantized (cached). One file per type: a source already F32 is not rewritten as F32."""
    from ..models.gguf import cached_requantization, weight_type
    files = {}
    for w in weights:
        path = source if w == "file" else cached_requantization(source, UNQUANTIZED[w])
        files.setdefault(weight_type(path), path)
    return files


PROBE = ("import sys; from llama_cpp import Llama; "
         "m = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), verbose=False); "
         "next(m.generate([1, 2, 3], temp=0.0))")


def llama_cpp_crash(path: Path, threads: int, timeout: float = 300.0) -> str | None:
    """Load `path` and decode one token in a child process: None when that works, else how it
    died. llama.cpp's AMX kernels die with SIGSEGV on some Xeons (ggml-org/llama.cpp#20824), and a
    crash in this process would end the whole bench."""
    import signal
    import subprocess
    import sys
    try:
        r = subprocess.run([sys.executable, "-c", PROBE, str(path), str(threads)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no token within {timeout:g} s"
    if r.returncode == 0:
        return None
    if r.returncode < 0:
        return f"killed by {signal.Signals(-r.returncode).name}"
    last = r.stderr.strip().splitlines()[-1:] or ["no message"]
    return f"exit status {r.returncode}: {last[0]}"


def crash_hint() -> str:
    """What to do about a crashing file: with AMX kernels in the build, rebuild without them."""
    import llama_cpp
    if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
        return ("this build has llama.cpp's AMX kernels, which crash on some CPUs: rebuild it without them, e.g. "
                "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
                "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_INT8=OFF' pip install --force-reinstall "
                "--no-cache-dir --no-deps llama-cpp-python; ")
    return ""


def check_decodes(path: Path, kind: str, threads: int) -> None:
    why = llama_cpp_crash(path, threads)
    if why is not None:
        raise UserError(f"llama.cpp cannot decode {path} ({why}); {crash_hint()}or drop {kind} from "
                         "--llama-cpp-weights, or run with --peers hf")


def load_llama(path: Path, n_ctx: int, threads: int, run: PeerRun):
    """A `llama_cpp.Llama` on `path` for `run`: plain, or with prompt lookup as its draft model."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    draft = None
    if run.lookup_tokens:
        draft = LlamaPromptLookupDecoding(max_ngram_size=run.max_ngram, num_pred_tokens=run.lookup_tokens)
    try:
        return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                     draft_model=draft, verbose=False)
    except Exception as e:  # a file this llama.cpp build cannot read: one actionable line
        raise UserError(f"llama.cpp cannot load {path} ({type(e).__name__}: {e}); drop it from "
                         "--llama-cpp-weights, or run with --peers hf") from e


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python, one prompt at a time (batch 1): for each GGUF file (first
    decoded once in a child process, `llama_cpp_crash`) a plain `Llama` and one with prompt lookup
    (its draft tokens need every position's logits, which would slow a plain context), loaded once;
    the bench's sampling parameters in llama.cpp's own sampler chain (greedy at T=0), the repeat
    penalty off, every prompt prefilled (no KV reuse between prompts)."""

    def __init__(self, source: Path, options: LlamaCppOptions, n_ctx: int, eos_ids: list[int]):
        threads = options.threads or torch.get_num_threads()
        self.eos_ids = frozenset(eos_ids)
        self.runs: list[PeerRun] = []
        self._models = {}  # PeerRun -> llama_cpp.Llama
        for kind, path in llama_cpp_files(source, options.weights).items():
            check_decodes(path, kind, threads)
            for lookup in (None, options.lookup_tokens):
                run = PeerRun(f"llama.cpp {kind}" + (" lookup" if lookup else ""), "llama.cpp", lookup_tokens=lookup,
                              max_ngram=options.max_ngram if lookup else None, weights=kind)
                self._models[run] = load_llama(path, n_ctx, threads, run)
                self.runs.append(run)

    def run(self, run: PeerRun, prompt_ids: list[list[int]], params: list[SamplingParams]) -> Pass:
        t0 = time.perf_counter()
        tokens = sum(len(self.complete(run, ids, sp)) for ids, sp in zip(prompt_ids, params))
        return Pass(seconds=time.perf_counter() - t0, tokens=tokens)

    def complete(self, run: PeerRun, ids: list[int], sp: SamplingParams) -> list[int]:
        """One prompt's completion ids under `run`: `max_tokens` of them, or up to and including
        EOS unless ignore_eos (counted as the HF peer counts them)."""
        model = self._models[run]
        model.reset()  # prefill the whole prompt: no KV reuse from the prompt before
        model.set_seed((sp.seed or 0) % 2**32)
        if sp.greedy:
            sampler = dict(temp=0.0, top_k=1, top_p=1.0, min_p=0.0)
        else:
            sampler = dict(temp=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p)
        out = []
        for tok in model.generate(ids, repeat_penalty=1.0, **sampler):
            out.append(tok)
            if len(out) >= sp.max_tokens or (tok in self.eos_ids and not sp.ignore_eos):
                break
        return out


# ---------------------------------------------------------------------------- building them
def load_peers(choice: PeerChoice, llm, prompt_ids: list[list[int]], max_tokens: int, hf_lookup_tokens: int,
               llama_cpp: LlamaCppOptions) -> list[Peer]:
    """The peers `choice` names, loaded on `llm`'s weights (its device and dtype for transformers)."""
    peers: list[Peer] = []
    if "hf" in choice.engines:
        # transformers in the weights' storage dtype (a blocks target computes in float32 beside it)
        peers.append(HFPeer(llm.model_path, llm.engine.device, llm.engine.kv_dtype, hf_lookup_tokens,
                            llm.engine.config.max_ngram))
    if "llama.cpp" in choice.engines:
        n_ctx = max(map(len, prompt_ids)) + max_tokens + llama_cpp.lookup_tokens + 16  # drafts past the end
        peers.append(LlamaCppPeer(choice.gguf, llama_cpp, n_ctx, llm.tokenizer.eos_token_ids))
    return peers
