"""One step for every decode path: running sequences advanced together by batched forwards.

``Scheduler`` owns the sequences of a model: a waiting queue, the ones being prefilled, and the running
batch, whose state holds one row per sequence at its own position. ``step()`` does, in order:

  1. admit waiting sequences while there is room (``max_batch``; for a paged cache, free blocks);
  2. prefill: one forward over the next chunk of every admitted prompt (a ragged batch). ``prefill_chunk``
     caps the tokens a prompt feeds per step, so one long prompt does not stall the others' streams;
     ``prefill_budget`` caps a step's prompt tokens in all, shared first come first served (every prompt
     being prefilled feeds at least one; no new prompt is admitted while the budget is spoken for), so a
     burst of new prompts does not either, at some cost in throughput (prefill spread over more steps). A
     prompt that is complete samples its first token and joins the running batch;
  3. decode: one forward over every running sequence's newest token, T = 1 (with a proposer, the token
     plus up to k drafts, T = k+1: speculative verification); each row samples its next token(s).

Faults stay with their owners: a fault that belongs to one sequence (non-finite logits, a sampling or stop
error) ends that sequence alone, ``finish_reason == "error"`` with ``error`` saying why, and the rest of the
batch goes on; a fault in a forward ends the sequences in that forward the same way and frees their rows and
blocks, so no sequence is left in any queue and the next step starts clean.

Prefill and decode are separate forwards because their shapes differ (hundreds of tokens in a few rows,
against one token in many rows); each is one batched call. Only ``Engine`` (engine.py) builds a scheduler: it
sizes the pool, decides paged or contiguous, and turns this step into the one API that ``generate``, speculative
decoding, the cost model's timing and the server drive.
"""
from __future__ import annotations

import math
import time
from collections import deque

import torch

from attnlab.engine.request import Event, Sequence
from attnlab.engine.sampling import greedy_rows, sample
from attnlab.models.block_pool import OutOfBlocks


class SequenceFault(Exception):
    """A fault that belongs to one sequence; its message is safe to show that sequence's client."""


def _non_finite():
    raise SequenceFault("the model produced non-finite logits for this sequence; it was ended")


class Scheduler:
    def __init__(self, model, *, max_len: int, max_batch: int, prefill_chunk: int | None = None,
                 prefill_budget: int | None = None, cache_dtype=None, pool=None, proposer=None,
                 keep_finished: bool = False, raise_faults: bool = True):
        """``pool``: a BlockPool shared by every sequence (paged KV cache with prefix caching), else each row has
        a contiguous state of ``max_len``. ``proposer``: drafts for speculative decoding. ``keep_finished``: a
        finished sequence keeps its state row (prefix reuse for states that cannot be shared by block).
        ``raise_faults``: a failed forward raises to the caller after its sequences are cleaned up (a library
        call); False turns it into their final events (a server)."""
        self.model = model
        self.max_len = max_len
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = prefill_budget
        self.proposer = proposer
        self.keep_finished = keep_finished
        self.raise_faults = raise_faults
        self.device = next(model.parameters()).device
        self.pool = pool
        self.cache_dtype = cache_dtype
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.prefill_state = self._new_state()
        self.state = self._new_state()
        self.preemptions = 0  # since creation (the server's metrics)
        self.step_errors = 0  # forwards that failed (their sequences ended with an error)
        self.seq_errors = 0  # sequences ended alone by a fault of their own (non-finite logits, sampling)
        self.last_error: str | None = None
        self.admit_failures: list[Event] = []  # final events of sequences that failed to be admitted this step

    def _new_state(self):
        if self.pool is not None:
            return self.model.new_state(0, pool=self.pool)
        return self.model.new_state(0, self.max_len, dtype=self.cache_dtype)

    # -- requests ----------------------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> Sequence:
        seq.submitted = time.perf_counter()
        seq.gen = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence, reason: str = "cancelled", error: str | None = None) -> bool:
        """Stop a sequence wherever it is; its state row (and blocks) are freed at once. A sequence that already
        finished keeps its finish reason, but is still taken out of any queue it is in. True if it was in one."""
        seq.end(reason, error)
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.prefilling:
            self._drop(self.prefilling, self.prefill_state, seq, keep=False)
        elif seq in self.running:
            self._drop(self.running, self.state, seq, keep=False)
        else:
            return False
        return True

    def fail(self, seqs, error: str) -> list[Event]:
        """End ``seqs`` with ``error``: out of every queue, their rows and blocks freed; one final event each."""
        events = []
        for seq in list(seqs):
            if self.cancel(seq, "error", error) or seq.finish_reason == "error":
                events.append(seq.event())
        return events

    def stats(self) -> dict:
        """What a caller may watch without reading the queues: sequences by stage, the pool, the error counts."""
        out = {"waiting": len(self.waiting), "prefilling": len(self.prefilling), "running": len(self.running),
               "preemptions": self.preemptions, "step_errors": self.step_errors, "sequence_errors": self.seq_errors,
               "last_error": self.last_error}
        if self.pool is not None:
            out.update(kv_blocks_total=self.pool.n_blocks, kv_blocks_used=self.pool.used_blocks,
                       kv_blocks_free=self.pool.free_blocks, kv_block_size=self.pool.block_size,
                       kv_bytes_per_block=self.pool.bytes_per_block)
        return out

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    # -- the step ----------------------------------------------------------------------------------------
    def step(self, decode: bool = True) -> list[Event]:
        """Admit, prefill, then decode every running sequence (a sequence whose prompt was just completed takes
        its second token in the same step). ``decode=False`` stops after the prefill: a caller that times the
        first token apart from the steps after it (measure.engine_timing)."""
        events: list[Event] = []
        with torch.inference_mode():
            self._admit()
            events, self.admit_failures = self.admit_failures, []
            if self.prefilling:
                events += self._guarded(self._prefill, self.prefilling, "prefill")
            if self.running and decode:
                events += self._guarded(self._decode, self.running, "decode")
        return events

    def _guarded(self, phase, group: list[Sequence], name: str) -> list[Event]:
        """Run a phase; if its forward raises, the sequences in it end with the error and nothing is left behind
        (their rows freed, the state's pending forward abandoned)."""
        try:
            return phase()
        except Exception as e:  # noqa: BLE001 - any fault in a forward is confined to the sequences in it
            too_long = isinstance(e, OutOfBlocks)  # one sequence larger than the whole pool: its own fault
            if not too_long:
                self.step_errors += 1
                self.last_error = f"{name} forward failed: {type(e).__name__}: {e}"
            # Freeing every row of the failed forward also drops the blocks it had begun to write.
            events = self.fail(group, str(e) if too_long else
                               f"the engine's {name} step failed ({type(e).__name__}); the request was ended")
            if self.raise_faults:
                raise
            return events

    def _admit(self) -> None:
        while self.waiting and len(self.prefilling) + len(self.running) < self.max_batch:
            if self.prefill_budget and self._pending_prefill() >= self.prefill_budget:
                break  # this step's prefill budget is spoken for: admit at a later step
            seq = self.waiting[0]
            rows = self.prefill_state.batch_size
            try:
                if not self._admit_one(seq):
                    break
            except Exception as e:  # noqa: BLE001 - a sequence that cannot be admitted ends alone
                if self.prefill_state.batch_size > rows:  # a row was begun for it: give its blocks back
                    self.prefill_state.release(self.prefill_state.batch_size - 1)
                self.waiting.popleft()
                if self.raise_faults:
                    seq.finish_reason, seq.error = "error", str(e)
                    raise
                self.seq_errors += 1
                seq.finish_reason, seq.error = "error", f"the request could not be admitted ({type(e).__name__})"
                self.admit_failures.append(seq.event())
                continue
            self.waiting.popleft()
            self.prefilling.append(seq)

    def _admit_one(self, seq: Sequence) -> bool:
        """Give seq a row in the prefill state (taking its cached prefix); False: no room yet, try a later step."""
        if seq.state is not None:  # a caller-supplied state holding the prompt's first tokens
            given, seq.state = seq.state, None
            seq.fed = seq.cached_tokens = int(given.pos[0])
            self.prefill_state.extend(given)  # (a paged state hands its rows over and is left empty)
        elif self.pool is not None:
            if self.prefilling or self.running:  # wait for blocks rather than fail (an idle pool tries anyway)
                # keep a block of headroom per running sequence, so that admitting does not starve decoding
                room = self.pool.free_blocks - self._reserved_blocks() - len(self.running)
                if room < self._blocks_for(seq.context):
                    return False
            row = self.prefill_state.add_sequence(seq.context, salt=seq.cache_salt)
            seq.fed = int(self.prefill_state.pos[row])
            if not seq.tokens:  # a resumed sequence's cache hit covers its own output too: not prompt tokens
                seq.cached_tokens = min(seq.fed, len(seq.prompt))
        else:
            self.prefill_state.add_sequence()
        return True

    def _pending_prefill(self) -> int:
        """Prompt tokens the sequences being prefilled would feed this step (each at most a chunk)."""
        chunk = self.prefill_chunk or 1 << 30
        return sum(min(len(s.context) - s.fed, chunk) for s in self.prefilling)

    def _blocks_for(self, context: list[int]) -> int:
        """Blocks a context needs to be prefilled and take its first decode step."""
        return -(-(len(context) + 1) // self.pool.block_size)

    def _reserved_blocks(self) -> int:
        """Blocks the sequences being prefilled still have to take."""
        return sum(max(0, self._blocks_for(s.context) - len(t))
                   for s, t in zip(self.prefilling, self.prefill_state.tables))

    def _prefill(self) -> list[Event]:
        chunk, budget = self.prefill_chunk or 1 << 30, self.prefill_budget or 1 << 30
        pieces = []
        for seq in self.prefilling:  # first come, first served; a row cannot be empty, so at least one token
            n = max(1, min(len(seq.context) - seq.fed, chunk, budget))
            pieces.append(seq.context[seq.fed:seq.fed + n])
            budget -= n
        lengths = torch.tensor([len(p) for p in pieces])
        T = int(lengths.max())
        tokens = torch.tensor([p + [0] * (T - len(p)) for p in pieces], device=self.device)  # (B, T) right-filled
        try:
            logits, _ = self.model(tokens, self.prefill_state, last_only=True, lengths=lengths)
        except OutOfBlocks:
            return self._preempt()
        events, done_rows = [], []
        for r, seq in enumerate(self.prefilling):
            seq.fed += len(pieces[r])
            if seq.fed == len(seq.context):
                if not seq.tokens:  # a resumed sequence already has its newest token: decode feeds it
                    events += self._own(seq, lambda: self._emit(seq, [logits[r, -1]], 1))
                done_rows.append(r)
        if done_rows:
            joined = [self.prefilling[r] for r in done_rows]
            if len(done_rows) == len(self.prefilling) and self.state.batch_size == 0:
                moved, self.prefill_state = self.prefill_state, self._new_state()  # no copy
                self.state = moved
            else:
                self.state.extend(self.prefill_state.take(done_rows))
            self.prefilling = [s for i, s in enumerate(self.prefilling) if i not in set(done_rows)]
            self.running += joined
            if self.proposer is not None:
                self.proposer.joined(joined)
            self._retire()
        return events

    def _decode(self) -> list[Event]:
        seqs = self.running
        drafts, dists = ([[] for _ in seqs], None) if self.proposer is None else self.proposer.propose(seqs)
        for i, seq in enumerate(seqs):  # never draft past the request's end
            room = seq.max_new_tokens - len(seq.tokens) - 1
            drafts[i] = drafts[i][:max(room, 0)]
        lengths = torch.tensor([1 + len(d) for d in drafts])
        T = int(lengths.max())
        tokens = torch.tensor([[s.tokens[-1]] + d + [0] * (T - 1 - len(d)) for s, d in zip(seqs, drafts)],
                              device=self.device)  # (B, T): the newest token, then the drafts
        try:
            logits, _ = self.model(tokens, self.state, lengths=None if T == 1 else lengths)
        except OutOfBlocks:  # make room by preempting the newest, then decode the rest in this same step
            self._preempt()
            return self._decode() if self.running else []
        events = []
        plain = {r for r, seq in enumerate(seqs) if not drafts[r] and seq.params.greedy
                 and seq.params.repetition_penalty == 1.0 and not seq.top_logprobs}
        if plain:  # greedy rows with nothing to verify: one argmax and one log-softmax for all of them
            order = sorted(plain)
            finite, ids, lps = greedy_rows(logits[order, 0])  # logits (b, V)
            for r, tok, lp, ok in zip(order, ids, lps, finite):
                events += self._own(seqs[r], (lambda r=r, tok=tok, lp=lp: self._append(seqs[r], [(tok, lp)]))
                                    if ok else _non_finite)
        for r, seq in enumerate(seqs):
            n = len(drafts[r])
            rows = logits[r, :n + 1]
            if n == 0:
                if r not in plain:
                    events += self._own(seq, lambda: self._emit(seq, [rows[0]], 1))
                continue

            def verified(seq=seq, r=r, n=n, rows=rows):
                accepted = self.proposer.verify(seq, drafts[r], None if dists is None else dists[r], rows)
                seq.rounds += 1
                seq.proposed += n
                seq.accepted += len(accepted) - 1
                return self._emit(seq, None, len(accepted), chosen=accepted, rows=rows)
            events += self._own(seq, verified)
        # Rows that rejected drafts forget them: the cache keeps the text but its newest token.
        if T > 1:
            self.state.rollback([len(s.text) - 1 for s in seqs])
        if self.proposer is not None:
            self.proposer.accepted(seqs)
        self._retire()
        return events

    def _own(self, seq: Sequence, work) -> list[Event]:
        """``work()`` for one sequence; a fault of its own (non-finite logits, a sampling or stop-matching error)
        marks it failed, and ``_retire`` then frees its row, while the batch goes on."""
        try:
            return work()
        except Exception as e:  # noqa: BLE001 - confined to this sequence
            self.seq_errors += 1
            seq.finish_reason = "error"
            seq.error = str(e) if isinstance(e, SequenceFault) else f"{type(e).__name__} while choosing a token"
            return [seq.event()]

    def _emit(self, seq: Sequence, logit_rows, n: int, chosen=None, rows=None) -> list[Event]:
        """Append n tokens to seq (sampled from logit_rows, or the verified `chosen` (token, row) pairs)."""
        for row in (logit_rows if chosen is None else [rows]):
            if not bool(torch.isfinite(row).all()):
                _non_finite()
        if chosen is None:
            ids, lps = self._sample(seq, torch.stack(logit_rows))
            chosen = [(int(ids[0]), 0)]
            logps = [float(lps[0])]
        else:
            sel = torch.tensor([[t] for t, _ in chosen], device=rows.device)
            picked = rows[[i for _, i in chosen]].float()
            logps = (picked.gather(1, sel) - torch.logsumexp(picked, -1, keepdim=True))[:, 0].tolist()
        tops = None
        if seq.top_logprobs:  # the most likely alternatives under the raw model, for each appended token
            src = torch.stack(logit_rows) if rows is None else rows[[i for _, i in chosen]]
            vals, idx = torch.log_softmax(src.float(), -1).topk(min(seq.top_logprobs, src.shape[-1]), -1)
            tops = [list(zip(i.tolist(), v.tolist())) for i, v in zip(idx, vals)]
        return self._append(seq, [(tok, lp) for (tok, _), lp in zip(chosen, logps)], tops)

    def _append(self, seq: Sequence, new: list[tuple[int, float]], tops: list | None = None) -> list[Event]:
        """Give seq its new (token, logprob) pairs until it stops; one event each."""
        now = time.perf_counter() - seq.submitted
        events = []
        for i, (tok, lp) in enumerate(new):
            if seq.done:
                break
            events.append(seq.append(tok, lp, now, tops[i] if tops is not None else None))
        return events

    def _sample(self, seq: Sequence, logits: torch.Tensor):
        seen = None
        if seq.params.repetition_penalty != 1.0:
            seen = torch.tensor([seq.text], device=logits.device)
        try:
            ids, lps = sample(logits, seq.params, seq.gen, seen)
        except RuntimeError:  # torch.multinomial refuses probabilities that are inf, NaN or all zero
            lps = torch.tensor([math.nan])
        if not bool(torch.isfinite(lps).all()):
            raise SequenceFault("the sampling settings made this sequence's token probabilities non-finite "
                                "(an extreme repetition_penalty or temperature?)")
        return ids, lps

    def _retire(self) -> None:
        for seq in [s for s in self.running if s.done]:
            self._drop(self.running, self.state, seq, keep=self.keep_finished and seq.error is None)

    def _drop(self, group: list[Sequence], state, seq: Sequence, keep: bool) -> None:
        row = group.index(seq)
        if self.proposer is not None and group is self.running:
            self.proposer.release(row)
        if keep:
            seq.state = state.take([row])
        else:
            state.release(row)
        group.pop(row)

    def _preempt(self) -> list[Event]:
        """Out of KV blocks: put the newest running (or prefilling) sequence back at the head of the queue; it
        is recomputed from its text when blocks free up (preemption by recompute). Nothing it produced is lost."""
        group, state = (self.running, self.state) if self.running else (self.prefilling, self.prefill_state)
        victim = group[-1]
        if len(self.running) + len(self.prefilling) <= 1:
            raise OutOfBlocks(f"one sequence of {len(victim.text)} tokens does not fit in the KV pool of "
                              f"{self.pool.n_blocks} blocks x {self.pool.block_size}; allocate more blocks")
        self._drop(group, state, victim, keep=False)
        victim.fed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        if self.proposer is not None:
            self.proposer.accepted(self.running)
        return []
