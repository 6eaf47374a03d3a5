"""The ONNX Runtime engine at batch 1 over a decoder exported by
:mod:`robot_latency.models.onnx_export`, timed to the token like the llama.cpp engine:

    tokenize (llama.cpp's tokenizer, vocabulary only: prompts tokenize exactly as in the
    llama.cpp engine) ─► keep the KV of the longest prefix shared with the previous call
    ─► prefill in chunks of ``chunk_tokens`` (deadline/abort check between chunks: ONNX Runtime
    cannot be interrupted inside a run) ─► greedy pick (optionally masked by the planner's action
    grammar) ─► token stamped ─► run it ─► ...

Providers are asked for explicitly, in order; those this onnxruntime build does not offer, or
that cannot initialise on this machine (a GPU provider without a CUDA device or its libraries:
:mod:`robot_latency.engines.providers`), are left out (logged, with the reason in :meth:`info`),
and the one that ran (``session.get_providers()[0]``) goes into :meth:`info`.

The model: an ``.onnx`` file; a GGUF (F32/F16), or "" for the bundled planner, is exported once
into the model cache and that export is loaded (:func:`resolve_onnx_model`).

With ``io_binding`` the KV cache stays in the provider's memory as ``OrtValue`` objects from one
run to the next (outputs bound to the device, fed back as inputs); only the logits come back to
the host. Without it every run copies the cache in and out through numpy.

Grammar: ONNX Runtime has no GBNF engine, so the planner's action grammar
(:func:`robot_latency.profiles.actions.actions_gbnf`) is applied as a logit mask computed by a small
state machine over the step shapes. It works on the bytes of each token's piece, as llama.cpp's
grammar sampler does, so a token that spells part of an action token (a byte token ``<``) is
allowed exactly when llama.cpp would allow it; ``<end>`` (any end-of-generation token) is allowed
only at a step boundary. Any other grammar text gives an error trace.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.action_mask import GRAMMAR_MASK, ActionGrammarMask, normalize_gbnf
from robot_latency.engines.base import (
    AbortSignal,
    ClosesOnExit,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    register_engine,
)
from robot_latency.engines.generate import (
    decode,
    generation,
    prefill,
    shared_prefix_len,
    tokenized,
)
from robot_latency.engines.onnx_config import (  # noqa: F401  (re-exported)
    DEFAULT_PROVIDERS,
    OnnxConfig,
    resolve_onnx_model,
    resolve_tokenizer_gguf,
)
from robot_latency.engines.providers import choose_providers
from robot_latency.profiles.actions import actions_gbnf

log = logging.getLogger(__name__)

#: Providers whose memory is the GPU's (IO binding keeps the KV there).
_GPU_PROVIDERS = {"TensorrtExecutionProvider": "cuda", "CUDAExecutionProvider": "cuda"}


class OnnxEngine(ClosesOnExit):
    """A batch-1 ONNX Runtime engine with per-token timing, prefix reuse, chunked prefill and
    grammar-masked greedy decoding (see the module docstring)."""

    name = "onnx"

    def __init__(self, config: OnnxConfig, *, clock: Clock = DEFAULT_CLOCK) -> None:
        import llama_cpp
        import onnxruntime as ort

        self._ort = ort
        self.config = config
        self.clock = clock
        self.closed = False
        path = resolve_onnx_model(config.model_path)
        self.model_path = path
        if not path.is_file():
            raise EngineError(f"onnx: no model file at {path}")
        self.providers_requested = list(config.providers)
        choice = choose_providers(config.providers)
        chosen = list(choice.usable)
        self.providers_skipped = list(choice.dropped)
        self.providers_dropped = dict(choice.dropped)
        for name, why in choice.dropped.items():
            log.info("onnx: provider %s skipped: %s", name, why)
        if not chosen:
            raise EngineError(f"onnx: none of the providers {list(config.providers)} can start "
                              f"here: {choice.dropped} (available in this build: "
                              f"{sorted(ort.get_available_providers())})")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = config.intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=chosen)
        except Exception as err:  # onnxruntime raises its own pybind types for bad files
            raise EngineError(f"onnx: could not load {path}: {err}") from err
        self.providers_session = list(self.session.get_providers())
        self.provider = self.providers_session[0]
        failed = [p for p in chosen if p not in self.providers_session]
        if failed:
            # ORT falls back silently-ish when a provider's libraries are missing (no GPU).
            log.warning("onnx: providers %s are in this build but did not initialise; "
                        "running on %s", failed, self.provider)
        self.providers_failed = failed
        self._device = _GPU_PROVIDERS.get(self.provider, "cpu")
        self._read_graph(path)
        tok_path = resolve_tokenizer_gguf(path, config.tokenizer_gguf)
        self.tokenizer_path = tok_path
        if not tok_path.is_file():
            raise EngineError(f"onnx: no tokenizer GGUF at {tok_path}")
        try:
            self.llm = llama_cpp.Llama(str(tok_path), vocab_only=True, verbose=False)
        except (ValueError, RuntimeError, OSError) as err:
            raise EngineError(f"onnx: could not load the tokenizer {tok_path}: {err}") from err
        if self.llm.n_vocab() != self.vocab_size:
            self.llm.close()
            raise EngineError(f"onnx: tokenizer {tok_path} has {self.llm.n_vocab()} tokens, "
                              f"model {path} has {self.vocab_size} logits")
        self._pieces, self._eog = self._vocab_pieces()
        # Every end-of-generation token ends a generation (the EOS ``<end>``, and ``</s>``
        # which llama.cpp's vocabulary also marks so), as in the llama.cpp engine; the grammar
        # mask allows every one of them where llama.cpp's grammar does.
        self._eos = int(self.llm.token_eos())
        self._mask: ActionGrammarMask | None = None
        self._known_grammar = normalize_gbnf(actions_gbnf())
        self._cache_tokens: list[int] = []
        self._kv: list[Any] = []
        self._reset_cache()

    # --- model facts -----------------------------------------------------------------------
    def _read_graph(self, path: Path) -> None:
        inputs = {i.name: i for i in self.session.get_inputs()}
        outputs = {o.name: o for o in self.session.get_outputs()}
        if "input_ids" not in inputs or "logits" not in outputs or "past_key_0" not in inputs:
            raise EngineError(f"onnx: {path} is not a KV-cache decoder (inputs {list(inputs)}, "
                              f"outputs {list(outputs)})")
        self.n_layers = sum(1 for n in inputs if n.startswith("past_key_"))
        self._past = [f"past_{kind}_{i}" for i in range(self.n_layers)
                      for kind in ("key", "value")]
        self._present = [f"present_{kind}_{i}" for i in range(self.n_layers)
                         for kind in ("key", "value")]
        missing = [n for n in self._past if n not in inputs] + \
            [n for n in self._present if n not in outputs]
        if missing:
            raise EngineError(f"onnx: {path} lacks KV cache I/O {missing[:4]}")
        kv_shape = inputs["past_key_0"].shape  # [1, KV, past_seq, D]
        self.n_kv_heads, self.head_dim = int(kv_shape[1]), int(kv_shape[3])
        self.vocab_size = int(outputs["logits"].shape[-1])
        meta = self.session.get_modelmeta().custom_metadata_map
        self.weights = meta.get("weights", "unknown")
        self.source_gguf = meta.get("source_gguf", "")

    def _vocab_pieces(self) -> tuple[list[bytes], set[int]]:
        """Return each token's piece (special tokens rendered, as llama.cpp's grammar sees
        them) and the end-of-generation ids."""
        import llama_cpp

        vocab = self.llm._model.vocab
        buf = ctypes.create_string_buffer(256)
        pieces, eog = [], set()
        for i in range(self.vocab_size):
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
            pieces.append(buf.raw[:n] if n > 0 else b"")
            if llama_cpp.llama_vocab_is_eog(vocab, i):
                eog.add(i)
        return pieces, eog

    def _grammar_mask(self, grammar: str | None) -> ActionGrammarMask | None:
        if grammar is None:
            return None
        if normalize_gbnf(grammar) != self._known_grammar:
            raise EngineError(f"onnx: grammar not supported: this engine applies only the "
                              f"planner's action grammar (actions_gbnf()) as a logit mask "
                              f"({GRAMMAR_MASK}); got {grammar[:60]!r}...")
        if self._mask is None:
            self._mask = ActionGrammarMask(self._pieces, self._eog)
        return self._mask

    # --- KV cache and one run ----------------------------------------------------------------
    def _empty_kv(self) -> Any:
        arr = np.zeros((1, self.n_kv_heads, 0, self.head_dim), np.float32)
        if self.config.io_binding:
            return self._ort.OrtValue.ortvalue_from_numpy(arr, self._device, 0)
        return arr

    def _reset_cache(self) -> None:
        self._cache_tokens = []
        self._kv = [self._empty_kv() for _ in self._past]

    def _trim_cache(self, keep: int) -> None:
        """Keep the KV of the first ``keep`` cached tokens."""
        if keep == len(self._cache_tokens):
            return
        if keep == 0:
            self._reset_cache()
            return
        trimmed = []
        for value in self._kv:
            arr = value.numpy() if self.config.io_binding else value
            arr = np.ascontiguousarray(arr[:, :, :keep, :])  # (1, KV, keep, D)
            trimmed.append(self._ort.OrtValue.ortvalue_from_numpy(arr, self._device, 0)
                           if self.config.io_binding else arr)
        self._kv = trimmed
        self._cache_tokens = self._cache_tokens[:keep]

    def _run(self, tokens: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` after the cache; return the last position's logits (V,)."""
        ids = np.array([tokens], dtype=np.int64)  # (1, T)
        if self.config.io_binding:
            binding = self.session.io_binding()
            binding.bind_cpu_input("input_ids", ids)
            for name, value in zip(self._past, self._kv, strict=True):
                binding.bind_ortvalue_input(name, value)
            binding.bind_output("logits", "cpu")
            for name in self._present:
                binding.bind_output(name, self._device, 0)
            self.session.run_with_iobinding(binding)
            outs = binding.get_outputs()
            logits = outs[0].numpy()
            self._kv = list(outs[1:])
        else:
            feeds = dict(zip(self._past, self._kv, strict=True))
            feeds["input_ids"] = ids
            outs = self.session.run(["logits", *self._present], feeds)
            logits = outs[0]
            self._kv = outs[1:]
        self._cache_tokens.extend(tokens)
        return logits[0, -1]  # (1, 1 or T, V) -> (V,)

    def _reuse_prefix(self, tokens: list[int]) -> int:
        keep = shared_prefix_len(self._cache_tokens, tokens) if self.config.prefix_cache else 0
        self._trim_cache(keep)
        return keep

    # --- the protocol ------------------------------------------------------------------------
    def generate(self, request: GenerationRequest, *,
                 abort: AbortSignal | None = None) -> GenerationTrace:
        """Generate for ``request`` (see the module docstring); never raises for run-time
        failures: the trace carries ``stop_reason="error"``."""
        return generation("onnx", self.clock, log,
                          lambda trace: self._generate(request, abort, trace), self._reset_cache)

    def _generate(self, request: GenerationRequest, abort: AbortSignal | None,
                  trace: GenerationTrace) -> None:
        clock, cfg = self.clock, self.config
        tokens = list(self.llm.tokenize(request.full_prompt.encode("utf-8"), add_bos=True,
                                        special=True))
        tokenized(trace, clock, tokens, request, cfg.n_ctx, f"n_ctx={cfg.n_ctx}")
        steps = _OnnxSteps(self, request, self._grammar_mask(request.grammar))
        keep = self._reuse_prefix(tokens)
        trace.prefix_cache_tokens = keep
        if prefill(request, abort, trace, clock, tokens, keep, cfg.chunk_tokens,
                   steps.run) is not None:
            return
        assert steps.logits is not None  # keep <= len(tokens) - 1: at least one chunk ran
        decode(request, abort, trace, clock, steps)
        if steps.mask is not None:
            trace.phases_extra_ns["grammar"] = steps.mask_ns

    @staticmethod
    def _pick(logits: np.ndarray, request: GenerationRequest,
              rng: np.random.Generator | None) -> int:
        """Greedy (first maximum, as llama.cpp's greedy sampler) or softmax sampling."""
        if rng is None:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / request.temperature
        p = np.exp(z - z.max())
        return int(rng.choice(len(p), p=p / p.sum()))

    def info(self) -> dict[str, Any]:
        """Return the configuration, the model file and the provider that ran."""
        import onnxruntime as ort

        return {"engine": self.name, **asdict(self.config),
                "providers": list(self.config.providers),
                "model_path": str(self.model_path),
                "model_bytes": os.path.getsize(self.model_path),
                "weights": self.weights, "source_gguf": self.source_gguf,
                "tokenizer_gguf_resolved": str(self.tokenizer_path),
                "provider": self.provider, "providers_session": self.providers_session,
                "providers_skipped": self.providers_skipped,
                "providers_dropped": self.providers_dropped,
                "providers_failed": self.providers_failed,
                "kv_device": self._device, "n_layers": self.n_layers,
                "onnxruntime": ort.__version__, "grammar": GRAMMAR_MASK}

    def close(self) -> None:
        """Free the session and the tokenizer (idempotent)."""
        if not self.closed:
            self.closed = True
            self._kv = []
            self.session = None  # type: ignore[assignment]
            self.llm.close()


class _OnnxSteps:
    """The ONNX engine's part of the shared loop (:mod:`robot_latency.engines.generate`): the
    logits of the last run, the grammar mask's state, the pick."""

    def __init__(self, engine: OnnxEngine, request: GenerationRequest,
                 mask: ActionGrammarMask | None) -> None:
        self.engine, self.request, self.mask = engine, request, mask
        self.rng = np.random.default_rng(request.seed) if request.temperature > 0 else None
        self.state = mask.start() if mask is not None else None
        self.logits: np.ndarray | None = None  # (V,) of the last position run
        self.mask_ns = 0

    def run(self, tokens: list[int]) -> bool:
        self.logits = self.engine._run(tokens)
        return True  # ONNX Runtime cannot be stopped inside a run

    def sample(self, started_ns: int) -> int:
        logits, pick = self.logits, self.engine._pick
        assert logits is not None
        if self.state is None:
            return pick(logits, self.request, self.rng)
        assert self.mask is not None
        allowed = self.mask.allowed(self.state)
        if allowed.size == 0:
            raise EngineError("grammar allows no token here")
        self.mask_ns += self.engine.clock() - started_ns
        return int(allowed[pick(logits[allowed], self.request, self.rng)])

    def is_end(self, token: int) -> bool:
        # Any end-of-generation token ends it, not only the EOS: the grammar mask allows every
        # one of them at a step boundary, as llama.cpp's grammar does.
        return token in self.engine._eog

    def piece(self, token: int) -> bytes:
        if self.state is not None:
            assert self.mask is not None
            self.state = self.mask.advance(self.state, self.engine._pieces[token])
            if self.state is None:
                raise EngineError(f"grammar rejected token {token}")
        return self.engine.llm.detokenize([token], special=False)

    def feed(self, token: int) -> bool:
        return self.run([token])


@register_engine("onnx")
def make_onnx_engine(*, clock: Clock = DEFAULT_CLOCK, **options: Any) -> OnnxEngine:
    """Create an :class:`OnnxEngine` from keyword options (fields of :class:`OnnxConfig`)."""
    try:
        config = OnnxConfig(**options)
    except TypeError as err:
        raise EngineError(f"onnx: {err}") from err
    return OnnxEngine(config, clock=clock)
