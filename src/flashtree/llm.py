"""`LLM`: the Python entry point — load a target (+ drafter), tokenise, run the engine to completion.

Owns loading and text; the decoding itself is `engine/engine.py`.
"""
from __future__ import annotations

import gc
import logging
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import cpu
from .engine import compile_helper
from .engine.engine import Engine
from .engine.engine_config import PRECOMPILE, EngineConfig, default
from .engine.sequence import RequestMetrics, Sequence, TokenLogprob
from .errors import UserError
from .grammar import Grammars
from .models.loader import load_drafter, load_target
from .models.quant import describe as describe_quant
from .models.registry import BUNDLED_DRAFTER, BUNDLED_TARGET, resolve  # noqa: F401 (re-exported)
from .sampling_params import SamplingParams
from .speculative.proposer import METHODS, default_method, needs_drafter
from .tokenizer import Tokenizer

log = logging.getLogger("flashtree")


def _progress(total: int, use_tqdm: bool):
    """A tqdm bar on an interactive stderr, else None (logs and pipes stay clean)."""
    if not use_tqdm or total == 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc="Processed prompts", unit="prompt", file=sys.stderr)


@dataclass(slots=True)
class RequestOutput:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    logprobs: list[TokenLogprob] | None = None  # one per token id when SamplingParams.logprobs is set
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (the first: None)


def freeze_heap(owner) -> None:
    """Move every object alive now (weights, tokenizer, compiled graphs) out of the cyclic garbage
    collector's sight until `owner` goes: a full collection scans the whole heap, and with a model
    loaded one took 16 ms in the middle of a stream's round (tiny pair; 44-119 ms on a heap that
    still held the load's temporaries). Unfrozen when the owner is collected, so a dropped LLM's
    engine (a reference cycle with its proposers) is collected again."""
    gc.collect()
    gc.freeze()
    weakref.finalize(owner, gc.unfreeze)
    cpu.return_free_heap()


class LLM:
    # the engine's options default to EngineConfig's (`default`); None for the n-gram sizes: the
    # method's own
    def __init__(self, model: str | Path | None = None, draft: str | Path | None = None,
                 method: str | None = None, budget: int | str | None = None, topk: int | None = None,
                 block_size: int | None = None, device: str = "auto", dtype: str = "auto",
                 max_batch_size: int = default("max_batch_size"), max_model_len: int | None = None,
                 max_queue: int = default("max_queue"), max_ngram: int | None = None,
                 min_ngram: int | None = None, draft_len: int | None = None,
                 compile: bool | str = default("compile"),
                 enable_prefix_caching: bool = default("enable_prefix_caching"), page_size: int = default("page_size"),
                 kv_cache_tokens: int | None = None, max_num_batched_tokens: int | None = None,
                 prefill_stall: float | None = default("prefill_stall"), tensor_parallel_size: int = 1,
                 precompile: str = "single", threads: int | None = None, quant: str | None = "auto",
                 grammar_drafts: bool = default("grammar_drafts")):
        if precompile not in PRECOMPILE:
            raise UserError(f"precompile must be one of {', '.join(map(repr, PRECOMPILE))}, got {precompile!r}")
        self.precompile = precompile
        found = resolve(model, draft)  # a name, an HF directory or a .gguf (converted once, cached)
        model, draft = found.target, found.drafter
        self.model_name = found.name
        self.method = method = method or default_method(draft is not None)
        config = EngineConfig(method=method, budget=budget, topk=topk, block_size=block_size,
                              max_batch_size=max_batch_size, max_model_len=max_model_len,
                              max_queue=max_queue, compile=compile, enable_prefix_caching=enable_prefix_caching,
                              page_size=page_size, kv_cache_tokens=kv_cache_tokens,
                              max_num_batched_tokens=max_num_batched_tokens, prefill_stall=prefill_stall,
                              threads=threads, grammar_drafts=grammar_drafts, **{k: v for k, v in (("max_ngram", max_ngram), (
                                  "min_ngram", min_ngram), ("draft_len", draft_len)) if v is not None})
        if method in METHODS and needs_drafter(method) and draft is None:
            free = " or ".join(f"method='{m}'" for m in METHODS if not needs_drafter(m))
            whose = f"model '{found.name}' has no trained drafter yet" if found.name else "no drafter was given"
            raise UserError(f"method '{method}' needs a drafter and {whose}: pass draft=DIR (a DFlash "
                            f"checkpoint) or use {free}")
        self.model_path, self.draft_path = Path(model), Path(draft) if draft else None
        self._ranks = self._tensor_parallel(tensor_parallel_size, config, dtype, device)
        try:
            self._load(config, dtype, device, quant)
        except BaseException:
            self.close()  # a half-built LLM leaves no rank waiting for it
            raise

    def _load(self, config: EngineConfig, dtype, device, quant) -> None:
        """Weights, tokenizer and engine; with tensor parallelism, form the group with the other ranks."""
        tp = None
        if self._ranks is not None:
            from .models.parallel import TPGroup
            tp = TPGroup(0, self._ranks.world)
        self.target = load_target(self.model_path, dtype=dtype, device=device, tp=tp, quant=quant).fuse()
        self.quant = describe_quant(self.target)  # None: float weights
        self.drafter = load_drafter(self.draft_path, self.target).fuse() if self.draft_path else None
        self.tokenizer = Tokenizer(self.model_path)
        self.engine = Engine(self.target, self.drafter, config, self.tokenizer.eos_token_ids,
                             decode=self.tokenizer.decode, grammars=Grammars.from_tokenizer(
                                 self.tokenizer.tk, self.target.config.vocab_size, self.tokenizer.eos_token_ids))
        eng = self.engine
        drafter_quant = describe_quant(self.drafter) if self.drafter is not None else None
        log.info("loaded %s%s: %s%s%s on %s, instruction path %s, %d threads (%s), KV cache %d tokens",
                 self.model_name or self.model_path,
                 (f" + drafter {self.draft_path.name}{f' ({drafter_quant})' if drafter_quant else ''}"
                  if self.draft_path else ""),
                 str(eng.dtype).removeprefix("torch."), f", weights {self.quant}" if self.quant else "",
                 f", KV cache and drafter {str(eng.kv_dtype).removeprefix('torch.')}" if eng.kv_dtype != eng.dtype else "",
                 eng.device,
                 cpu.isa() if eng.device.type == "cpu" else "-",
                 eng.threads.most, cpu.thread_policy(), eng.blocks.capacity_tokens)
        if self._ranks is not None:
            self.engine.runner.attach(self._ranks.join(self.engine.device))
        helper = background = None
        if self._ranks is None:  # about half of the graphs compile in a helper process meanwhile
            rebuild = compile_helper.Rebuild(
                str(self.model_path), str(self.draft_path) if self.draft_path else None,
                str(self.engine.dtype).removeprefix("torch."), config, self.engine.threads.most,
                quant if self.quant else None, str(self.engine.kv_dtype).removeprefix("torch."))
            helper = compile_helper.start(rebuild)
            if self.precompile == "background":
                background = compile_helper.start(rebuild, nice=compile_helper.BACKGROUND_NICE)
        batched = self.precompile == "all" or (self.precompile == "background" and background is None)
        self.engine.warmup(progress=True, batched=batched, helper=helper, background=background)
        freeze_heap(self)

    def _tensor_parallel(self, size, config: EngineConfig, dtype, device):
        """tensor_parallel_size > 1: this process is rank 0; the other ranks are spawned here (or,
        under torchrun, started by it). Checked before any weights load. Returns the `Ranks` (None
        for size 1), closed with this LLM, or when nothing references it any more."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UserError(f"tensor_parallel_size must be an integer >= 1, got {size!r}")
        if size == 1:
            return None
        from .config import ModelConfig
        from .distributed import tp as dtp
        from .models.parallel import check_shardable
        check_shardable(ModelConfig.from_dir(self.model_path), size)
        if config.compile is True:
            raise UserError("tensor_parallel_size > 1 runs eager (compiled all-reduces are not supported yet): "
                            "drop compile=True / --compile")
        config.compile = False
        config.threads = config.threads or max(1, cpu.threads() // size)  # each rank its share of the cores
        ranks = dtp.Ranks(size, self.model_path, dtype, device)
        weakref.finalize(self, ranks.close)  # also at interpreter exit
        return ranks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt page (vLLM's `LLM.reset_prefix_cache`): True when done, False
        while requests are running."""
        return self.engine.reset_prefix_cache()

    def close(self) -> None:
        """Stop the other tensor-parallel ranks and leave their process group, so another
        tensor-parallel LLM can start in this process, and a helper still compiling graphs in the
        background (batches then compile theirs at first use). Idempotent; without either a no-op
        (the LLM keeps working); `with LLM(...) as llm:` closes on leaving."""
        if self._ranks is not None:
            self._ranks.close()
        engine = getattr(self, "engine", None)  # (a load that failed before its engine)
        if engine is not None:
            engine.runner.stop_deferred()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._ranks is not None and self._ranks.closed:
            raise UserError("this LLM is closed (its tensor-parallel ranks have stopped): create a new LLM")

    # ------------------------------------------------------------------ helpers
    def _ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise TypeError("a prompt must be a string or a list of token ids")

    def text_of(self, seq: Sequence) -> str:
        ids = seq.output_ids
        if seq.finish_reason == "stop" and ids and ids[-1] in seq.stop_ids:
            ids = ids[:-1]  # the stop token itself is not part of the text
        text = self.tokenizer.decode(ids)
        return text[:seq.text_end] if seq.text_end is not None else text

    def _output(self, prompt, seq: Sequence) -> RequestOutput:
        return RequestOutput(prompt=prompt, text=self.text_of(seq), token_ids=list(seq.output_ids),
                             finish_reason=seq.finish_reason, metrics=seq.metrics,
                             logprobs=None if seq.logprobs is None else list(seq.logprobs),
                             prompt_logprobs=None if seq.prompt_logprobs is None else list(seq.prompt_logprobs))

    # ------------------------------------------------------------------ API
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, *, method: str | None = None, budget: int | str | None = None,
                 block_size: int | None = None, topk: int | None = None, **options) -> list[RequestOutput]:
        """Run any number of prompts (str | list[str] | list[list[int]]) to completion, in order.
        `options`: method-specific settings (ngram: max_ngram, min_ngram, draft_len).

        Prompts enter the engine as batch slots free up, so the server's queue cap never applies;
        `use_tqdm` shows a progress bar when stderr is a terminal.
        """
        self._check_open()
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise UserError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
            plist = params
        else:
            plist = [params or SamplingParams()] * len(prompts)
        ids = [self._ids(p) for p in prompts]  # bad prompt types fail before any decoding
        seqs: list[Sequence] = []
        active: list[Sequence] = []  # added and not finished: at most a queue room plus a batch
        # keep just enough waiting to fill the batch at the next admission (never above the engine's cap)
        room = max(1, min(self.engine.config.max_queue, self.engine.config.max_batch_size))
        bar = _progress(len(prompts), use_tqdm)
        try:
            while len(seqs) < len(prompts) or active:
                while len(seqs) < len(prompts) and len(self.engine.waiting) < room:
                    i = len(seqs)
                    try:
                        seq = self.engine.add_request(ids[i], plist[i], method=method, budget=budget,
                                                      block_size=block_size, topk=topk, **options)
                    except Exception as e:
                        e.add_note(f"(prompt {i} of {len(prompts)})")
                        raise
                    seqs.append(seq)
                    active.append(seq)
                self.engine.step()
                n_active = len(active)
                active = [s for s in active if not s.finished]
                if bar is not None:
                    bar.update(n_active - len(active))
        except BaseException:
            for s in active:  # leave the engine clean (Ctrl-C, a bad prompt midway)
                self.engine.abort(s)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [self._output(p, s) for p, s in zip(prompts, seqs)]

    def chat(self, messages_or_list, params=None, **kw) -> list[RequestOutput]:
        """OpenAI-style messages (one conversation or a list of them). Special-token strings in
        message contents are text, as in the server; the template's own special tokens are special."""
        convs = messages_or_list
        if isinstance(convs, list) and convs and isinstance(convs[0], dict):
            convs = [convs]
        return self.generate([self.tokenizer.encode_chat(c) for c in convs], params, **kw)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None, **kw) -> Iterator[str]:
        """Yield text as it is committed (never a broken UTF-8 character); `.last` holds the seq."""
        self._check_open()
        seq = self.engine.add_request(self._ids(prompt), params or SamplingParams(), **kw)
        self.last = seq
        sent = ""
        try:
            while not seq.finished:
                self.engine.step()
                text = self.text_of(seq)
                if text.endswith("\ufffd") and not seq.finished:
                    continue
                if len(text) > len(sent):
                    yield text[len(sent):]
                    sent = text
        finally:  # a consumer that stops early (Ctrl-C, break) leaves no request behind
            if not seq.finished:
                self.engine.abort(seq)
