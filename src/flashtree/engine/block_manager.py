"""Pages of the paged KV cache: who owns which, page tables, prefix hashes, ref counts, eviction.

The cache (`kv_cache.py`) is a pool of `num_pages` pages of `page_size` rows, shared by the
target's cache and the drafter's context cache (page p holds rows p*P .. p*P+P-1 of both). A
running sequence holds a *slot* (its row of the page table, at most `num_slots` at once) and a
list of pages: logical cache row r of the sequence lives at physical row
`pages[r // P] * P + r % P`. Page 0 is the null page: never handed out, it is where every
table entry past a sequence's pages points, so padded rows of a batch write there and masked
reads read there (always finite).

Prefix caching: a full page is named by a hash of its tokens and of every token before it (a
chain, so equal hashes mean equal prefixes). Pages named this way stay cached after their last
owner lets go (ref count 0) and are evicted least-recently-used only when a fresh page is needed.
A page's drafter rows are reusable only once its owner's drafter has written them (`draft_ok`),
so a request whose method reads the drafter's context stops its match at the first page without.

It moves no tensors and knows nothing of models, methods or sampling.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

NULL_PAGE = 0


class CacheFullError(RuntimeError):
    """No free slot (or page) is left."""


def page_hash(parent: bytes, tokens) -> bytes:
    """The name of a full page: its tokens and its prefix's name (a hash chain)."""
    return hashlib.blake2b(parent + np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, num_slots: int, max_pages_per_slot: int,
                 prefix_caching: bool = True):
        if num_pages < 2:
            raise ValueError(f"the cache needs at least 2 pages (one is the null page), got {num_pages}")
        self.num_pages, self.page_size, self.num_slots = num_pages, page_size, num_slots
        self.max_pages_per_slot = max_pages_per_slot
        self.prefix_caching = prefix_caching
        self.table = np.zeros((num_slots, max_pages_per_slot), dtype=np.int64)  # NULL_PAGE past a slot's pages
        self.pages: list[list[int]] = [[] for _ in range(num_slots)]
        self.hashes: list[list[bytes]] = [[] for _ in range(num_slots)]  # names of each slot's leading full pages
        self.ref = np.zeros(num_pages, dtype=np.int64)
        self.free_pages: list[int] = list(range(num_pages - 1, NULL_PAGE, -1))  # pop() hands out 1, 2, ...
        self.lru: OrderedDict[int, None] = OrderedDict()   # cached pages nobody holds, oldest first
        self.name: dict[int, bytes] = {}                    # page -> its hash (full, named pages)
        self.by_name: dict[bytes, int] = {}                 # hash -> the page reused for it
        self.draft_ok = np.zeros(num_pages, dtype=bool)     # its drafter rows are written too
        self.drafted_pages = [0] * num_slots               # each slot's leading pages already marked draft_ok
        self._free_slots = list(range(num_slots - 1, -1, -1))

    # ---------------------------------------------------------------- slots
    def allocate(self) -> int:
        if not self._free_slots:
            raise CacheFullError(f"all {self.num_slots} KV cache slots are in use")
        return self._free_slots.pop()

    def free(self, slot: int) -> None:
        """Give the slot back with all its pages (named ones stay cached for reuse)."""
        if slot in self._free_slots or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not allocated")
        self.trim(slot, 0)
        self.hashes[slot] = []
        self._free_slots.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    # ---------------------------------------------------------------- pages
    @property
    def available(self) -> int:
        """Pages a reservation can take: free ones plus cached ones nobody holds."""
        return len(self.free_pages) + len(self.lru)

    @property
    def pages_total(self) -> int:
        """Pages that can hold rows (the null page aside)."""
        return self.num_pages - 1

    @property
    def used(self) -> int:
        """Pages held by at least one slot."""
        return self.pages_total - self.available

    @property
    def capacity_tokens(self) -> int:
        return self.pages_total * self.page_size

    def pages_for(self, rows: int) -> int:
        return -(-rows // self.page_size)

    def reserve(self, slot: int, rows: int) -> bool:
        """Make the slot's pages cover rows [0, rows). False (and nothing taken) if they do not fit."""
        need = self.pages_for(rows) - len(self.pages[slot])
        if need <= 0:
            return True
        if need > self.available or self.pages_for(rows) > self.max_pages_per_slot:
            return False
        for _ in range(need):
            self._append(slot, self._fresh())
        return True

    def trim(self, slot: int, rows: int) -> None:
        """Let go of the slot's pages past those covering rows [0, rows). Rows of a named page
        are committed (and may be shared): a cut inside one is refused."""
        if rows % self.page_size and rows // self.page_size < len(self.hashes[slot]):
            raise ValueError(f"trim to row {rows} cuts into named (committed, maybe shared) page "
                             f"{rows // self.page_size} of slot {slot}")
        keep = self.pages_for(rows)
        pages = self.pages[slot]
        self.drafted_pages[slot] = min(self.drafted_pages[slot], keep)
        while len(pages) > keep:
            page = pages.pop()
            self.table[slot, len(pages)] = NULL_PAGE
            self._drop(page)
        del self.hashes[slot][keep:]

    def _fresh(self) -> int:
        if self.free_pages:
            return self.free_pages.pop()
        page, _ = self.lru.popitem(last=False)  # evict the least recently used cached page
        self._unname(page)
        return page

    def _append(self, slot: int, page: int) -> None:
        self.table[slot, len(self.pages[slot])] = page
        self.pages[slot].append(page)
        self.ref[page] += 1

    def _drop(self, page: int) -> None:
        self.ref[page] -= 1
        if self.ref[page]:
            return
        if page in self.name:
            self.lru[page] = None  # most recently used end
        else:
            self.draft_ok[page] = False
            self.free_pages.append(page)

    def _unname(self, page: int) -> None:
        h = self.name.pop(page, None)
        if h is not None and self.by_name.get(h) == page:
            del self.by_name[h]
        self.draft_ok[page] = False

    def rows(self, slots, rows: np.ndarray) -> np.ndarray:
        """Physical rows of logical rows [B, ...] of `slots` [B] (past a slot's pages: the null page)."""
        P = self.page_size
        return self.table[np.asarray(slots)[:, None], rows.reshape(len(slots), -1) // P].reshape(rows.shape) * P \
            + rows % P

    # ---------------------------------------------------------------- prefix cache
    def names(self, tokens, n_pages: int, parent: bytes = b"") -> list[bytes]:
        """The hash chain of the first n_pages full pages of `tokens`."""
        P, out = self.page_size, []
        for i in range(n_pages):
            parent = page_hash(parent, tokens[i * P:(i + 1) * P])
            out.append(parent)
        return out

    def match(self, tokens, need_draft: bool) -> tuple[list[int], list[bytes]]:
        """The cached pages that hold a prefix of `tokens`, leaving at least one token to compute
        (its logits are needed). need_draft: only pages whose drafter rows are written too."""
        if not self.prefix_caching:
            return [], []
        pages, names = [], []
        for h in self.names(tokens, (len(tokens) - 1) // self.page_size):
            page = self.by_name.get(h)
            if page is None or (need_draft and not self.draft_ok[page]):
                break
            pages.append(page), names.append(h)
        return pages, names

    def adopt(self, slot: int, pages: list[int], names: list[bytes]) -> int:
        """Put matched pages at the start of an empty slot. Returns the tokens they hold."""
        assert not self.pages[slot], "adopt into an empty slot"
        for page in pages:
            self.lru.pop(page, None)
            self._append(slot, page)
        self.hashes[slot] = list(names)
        hit = len(pages) * self.page_size
        return hit

    def unnamed(self, slot: int, rows: int) -> bool:
        """Whether the slot's first `rows` rows fill a page not named yet (`commit` has work)."""
        return self.prefix_caching and rows // self.page_size > len(self.hashes[slot])

    def commit(self, slot: int, tokens, rows: int) -> None:
        """The slot's first `rows` rows hold `tokens[:rows]`: name its newly full pages."""
        if not self.unnamed(slot, rows):
            return
        full, names = rows // self.page_size, self.hashes[slot]
        parent = names[-1] if names else b""
        P = self.page_size
        for i, h in enumerate(self.names(tokens[len(names) * P:full * P], full - len(names), parent), len(names)):
            page = self.pages[slot][i]
            names.append(h)
            if page not in self.name:
                self.name[page] = h
                self.by_name.setdefault(h, page)

    def settle(self, slot: int, rows: int, keep: int, tokens: Callable[[], list[int]],
               drafted: int | None) -> None:
        """After a round's commit the slot holds `rows` committed rows: its pages past row `keep`
        (what its next round reserves) go back, its newly full pages are named (`tokens()`, the
        tokens of those rows, is read only when there are some), and with `drafted` its drafter
        rows [0, drafted) are written."""
        self.trim(slot, keep)
        if self.unnamed(slot, rows):
            self.commit(slot, tokens(), rows)
        if drafted is not None:
            self.drafted(slot, drafted)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached page (they become free). Only while no slot is held: False, and
        nothing changed, otherwise."""
        if self.free_slots < self.num_slots:
            return False
        self.free_pages.extend(reversed(self.lru))
        self.lru.clear()
        self.name.clear()
        self.by_name.clear()
        self.draft_ok[:] = False
        return True

    def undrafted_rows(self, slot: int) -> tuple[int, int]:
        """(lo, hi): the slot's named rows [lo, hi) whose pages are not marked drafted yet —
        what a drafter write must cover before they are reusable by drafter-based requests."""
        if not self.prefix_caching:
            return 0, 0
        return self.drafted_pages[slot] * self.page_size, len(self.hashes[slot]) * self.page_size

    def drafted(self, slot: int, rows: int) -> None:
        """The slot's drafter rows [0, rows) are written: full named pages below are reusable by
        drafter-based requests (a name held by a page without them moves to this one)."""
        if not self.prefix_caching:
            return
        full = min(rows // self.page_size, len(self.hashes[slot]))
        start, self.drafted_pages[slot] = self.drafted_pages[slot], max(full, self.drafted_pages[slot])
        for i in range(start, full):  # pages below `start` were marked by an earlier call
            page = self.pages[slot][i]
            if self.draft_ok[page] or self.name.get(page) is None:
                continue
            self.draft_ok[page] = True
            h = self.name[page]
            held = self.by_name.get(h)
            if held is None or not self.draft_ok[held]:
                self.by_name[h] = page
