"""Grammar compilation off the engine thread, cached per (kind, spec).

The engine thread only submits: a request waits in the scheduler while its grammar compiles
on this module's one background thread (the tokenizer's vocabulary is indexed there too,
once, at the first structured request), and a cache hit is ready at once. A spec that does
not compile, or takes longer than ``timeout_s``, fails its request alone with
``invalid_grammar``.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait

from gpu_worker.errors import InvalidRequestError
from gpu_worker.structured.spec import INVALID_GRAMMAR, StructuredSpec
from gpu_worker.structured.state import GrammarState

logger = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256
_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarCompiler:
    """Compiles :class:`StructuredSpec` for one tokenizer (a transformers tokenizer)."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...], *,
                 timeout_s: float = COMPILE_TIMEOUT_S, cache_size: int = CACHE_SIZE) -> None:
        self._hf, self.vocab_size, self._stop = hf_tokenizer, vocab_size, list(stop_token_ids)
        self.timeout_s, self.cache_size = timeout_s, cache_size
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._cache: OrderedDict[StructuredSpec, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler = None   # built on the pool's thread, at the first compilation
        self.ready_at: float | None = None   # when it was built: time limits count from then
        self.num_compiled = 0

    def submit(self, spec: StructuredSpec) -> PendingGrammar:
        """Start (or reuse) the compilation of ``spec``; never blocks."""
        with self._lock:
            future = self._cache.get(spec)
            if future is None:
                future = self._pool.submit(self._compile, spec)
                self._cache[spec] = future
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(spec)
        return PendingGrammar(future, self, time.monotonic())

    def compile_now(self, spec: StructuredSpec) -> GrammarState:
        """Compile and wait (tests, benchmarks); raises ``invalid_grammar``."""
        pending = self.submit(spec)
        while (state := pending.poll()) is None:   # poll() raises past the deadline
            wait([pending.future], timeout=0.05)
        return state

    def _compile(self, spec: StructuredSpec):
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self._hf, vocab_size=self.vocab_size,
                                                      stop_token_ids=self._stop)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            self.ready_at = time.monotonic()
        c, t0 = self._compiler, time.perf_counter()
        if spec.kind in ("json_object", "json_schema"):
            schema = _OBJECT_SCHEMA if spec.kind == "json_object" else spec.spec
            out = c.compile_json_schema(schema, any_whitespace=False)
        elif spec.kind == "regex":
            out = c.compile_regex(spec.spec)
        elif spec.kind == "choice":
            alts = " | ".join(json.dumps(s, ensure_ascii=False) for s in json.loads(spec.spec))
            out = c.compile_grammar(f"root ::= {alts}")
        else:
            out = c.compile_grammar(spec.spec)
        self.num_compiled += 1
        logger.debug("compiled a %s grammar in %.1f ms", spec.kind, (time.perf_counter() - t0) * 1e3)
        return out


class PendingGrammar:
    """A compilation a request waits for. Its time limit runs from the request's submission,
    or from when the compiler was built if that came later: the one-time tokenizer table
    (seconds for a 49k vocabulary on a loaded machine) is not a grammar's fault."""

    def __init__(self, future: Future, owner: GrammarCompiler, submitted: float) -> None:
        self.future, self.owner, self.submitted = future, owner, submitted
        self.timeout_s = owner.timeout_s

    @property
    def deadline(self) -> float:
        """When this compilation fails for time (infinity until the compiler exists)."""
        ready = self.owner.ready_at
        return float("inf") if ready is None else max(self.submitted, ready) + self.timeout_s

    def poll(self) -> GrammarState | None:
        """A fresh matcher once compiled, None while compiling; raises ``invalid_grammar``
        when compilation failed or ran past its time limit."""
        if not self.future.done():
            if time.monotonic() > self.deadline:
                raise InvalidRequestError(INVALID_GRAMMAR, f"the grammar took longer than {self.timeout_s:g} s "
                                          "to compile")
            return None
        exc = self.future.exception()
        if exc is not None:
            raise InvalidRequestError(INVALID_GRAMMAR, f"the grammar does not compile: {exc}")
        return GrammarState(self.future.result())
