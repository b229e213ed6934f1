"""BlockManager: a model-based state machine (pages, ref counts, prefix cache, eviction) and unit tests."""
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from flashtree.engine.block_manager import NULL_PAGE, BlockManager, page_hash

# prompts from a tiny vocabulary, most of them a cut of one of a few stems plus a short tail (prefixes collide)
STEMS = [[0] * 12, [1, 2] * 6, [2, 0, 1] * 4]
TOKENS = st.one_of(st.lists(st.integers(0, 2), min_size=1, max_size=12), st.builds(
    lambda stem, n, tail: (stem[:n] + tail) or [0], st.sampled_from(STEMS), st.integers(0, 12),
    st.lists(st.integers(0, 2), max_size=3)))


def chain(tokens, P):
    """Reference names of the full pages of `tokens` (hash chain, computed independently of names())."""
    out, parent = [], b""
    for i in range(len(tokens) // P):
        parent = page_hash(parent, list(tokens[i * P:(i + 1) * P]))
        out.append(parent)
    return out


def snapshot(b):
    return (list(b.free_pages), list(b.lru), b.ref.tolist(), dict(b.name), dict(b.by_name), b.draft_ok.tolist(),
            [list(p) for p in b.pages], [list(h) for h in b.hashes], b.table.tolist(), b.free_slots)


has_slot, has_free = precondition(lambda self: self.toks), precondition(lambda self: self.b.free_slots)


class BlockMachine(RuleBasedStateMachine):
    """Drives a BlockManager like the engine does; models each slot's tokens and each page's contents."""

    @initialize(num_pages=st.integers(6, 12), P=st.integers(2, 4), num_slots=st.integers(2, 4),
                max_pages=st.integers(3, 6))
    def setup(self, num_pages, P, num_slots, max_pages):
        self.b, self.P = BlockManager(num_pages, P, num_slots, max_pages, prefix_caching=True), P
        self.toks = {}        # slot -> tokens whose rows are written
        self.committed = {}   # slot -> rows passed to commit
        self.kv = {}          # page -> token prefix (through its last written row) its KV rows hold
        self.draft = {}       # page -> token prefix its drafter rows were written for

    def _write(self, slot, start):
        """The slot computes rows [start, len(toks)): they land in its pages, which nobody else may hold."""
        b, t, P = self.b, self.toks[slot], self.P
        for i in range(start // P, -(-len(t) // P)):
            page = b.pages[slot][i]
            assert b.ref[page] == 1, f"slot {slot} writes into page {page} held by {b.ref[page]} slots"
            self.kv[page] = tuple(t[:min(len(t), (i + 1) * P)])
            self.draft.pop(page, None)  # its drafter rows are stale now

    def _check_match(self, tokens, need_draft):
        pages, names = self.b.match(tokens, need_draft)
        assert len(pages) == len(names) <= (len(tokens) - 1) // self.P
        assert names == chain(tokens, self.P)[:len(pages)]
        for i, page in enumerate(pages):
            assert page != NULL_PAGE and self.kv[page] == tuple(tokens[:(i + 1) * self.P])
            if need_draft:
                assert self.b.draft_ok[page] and self.draft.get(page) == self.kv[page]
        return pages, names

    def _slot(self, data):
        return data.draw(st.sampled_from(sorted(self.toks)))

    @has_free
    @rule()
    def allocate(self):
        slot = self.b.allocate()
        assert slot not in self.toks and not self.b.pages[slot]
        self.toks[slot], self.committed[slot] = [], 0

    @has_free
    @rule(tokens=TOKENS, need_draft=st.booleans())
    def prefill(self, tokens, need_draft):
        b, slot = self.b, self.b.allocate()
        pages, names = self._check_match(tokens, need_draft)
        hit = b.adopt(slot, pages, names)
        assert hit == len(pages) * self.P and b.pages[slot] == pages
        if not b.reserve(slot, len(tokens)):  # the scheduler gives the slot back
            return b.free(slot)
        self.toks[slot] = list(tokens)
        self._write(slot, hit)
        b.commit(slot, tokens, len(tokens))
        self.committed[slot] = len(tokens)

    @rule(tokens=TOKENS, need_draft=st.booleans())
    def probe_match(self, tokens, need_draft):
        before = snapshot(self.b)
        self._check_match(tokens, need_draft)
        assert snapshot(self.b) == before, "match() changed the state"

    @has_slot
    @rule(data=st.data())
    def free(self, data):
        slot = self._slot(data)
        self.b.free(slot)
        del self.toks[slot], self.committed[slot]

    @has_slot
    @rule(data=st.data(), rows=st.integers(0, 28))
    def reserve(self, data, rows):
        b, slot = self.b, self._slot(data)
        have, before, need = len(b.pages[slot]), snapshot(b), b.pages_for(rows) - len(b.pages[slot])
        fits = need <= 0 or (need <= b.available and b.pages_for(rows) <= b.max_pages_per_slot)
        assert b.reserve(slot, rows) == fits
        assert len(b.pages[slot]) == max(have, b.pages_for(rows)) if fits else snapshot(b) == before

    @has_slot
    @rule(data=st.data(), extra=st.integers(0, 8))
    def trim(self, data, extra):
        """Let go of speculative rows past the written tokens (extra > 0: what the engine does after a
        round), or roll written rows back: to a page boundary or inside the last unnamed page."""
        slot, P = self._slot(data), self.P
        t, have, lo = self.toks[slot], len(self.b.pages[slot]), self.committed[slot] // P * P
        rows = len(t) + extra if extra else data.draw(st.sampled_from(
            [r for r in range(len(t) + 1) if r % P == 0 or r >= lo]))
        self.b.trim(slot, rows)
        assert len(self.b.pages[slot]) == min(have, self.b.pages_for(rows))
        del t[rows:]
        self.committed[slot] = min(self.committed[slot], rows)

    @has_slot
    @rule(data=st.data(), new=st.lists(st.integers(0, 2), max_size=6), commit=st.booleans())
    def extend(self, data, new, commit):
        slot = self._slot(data)
        t, start = self.toks[slot], len(self.toks[slot])
        if not self.b.reserve(slot, start + len(new)):
            return
        t.extend(new)
        self._write(slot, start)
        if commit:
            assert self.b.unnamed(slot, len(t)) == (len(t) // self.P > len(self.b.hashes[slot]))
            self.b.commit(slot, t, len(t))
            self.committed[slot] = len(t)

    @has_slot
    @rule(data=st.data())
    def drafted(self, data):
        """The slot's drafter wrote its rows [0, rows)."""
        slot = self._slot(data)
        rows = data.draw(st.integers(0, len(self.toks[slot])))
        full = self.b.pages[slot][:rows // self.P]
        self.draft.update((page, self.kv[page]) for page in full)
        self.b.drafted(slot, rows)
        assert self.b.draft_ok[full[:len(self.b.hashes[slot])]].all()

    @invariant()
    @precondition(lambda self: hasattr(self, "b"))
    def consistent(self):
        b, P, N = self.b, self.P, self.b.num_pages
        free, lru = b.free_pages, list(b.lru)
        held = [p for p in range(N) if b.ref[p] >= 1]
        # each page but the null one is exactly one of: free, cached (LRU), held
        assert sorted(free + lru + held) == list(range(1, N)), "a page is lost or counted twice"
        assert all(b.ref[p] == 0 and p not in b.name and not b.draft_ok[p] for p in free)
        assert all(b.ref[p] == 0 and p in b.name for p in lru)
        assert b.available == len(free) + len(lru) and b.used + b.available == N - 1 and b.used == len(held)
        assert b.free_slots == b.num_slots - len(self.toks)
        count = np.zeros(N, dtype=np.int64)
        where = {}  # page -> (slot, index)
        for slot in range(b.num_slots):
            pages, t = b.pages[slot], self.toks.get(slot)
            if t is None:
                assert not pages and not b.hashes[slot] and not b.table[slot].any()
                continue
            assert len(set(pages)) == len(pages) and NULL_PAGE not in pages
            assert b.table[slot].tolist() == pages + [NULL_PAGE] * (b.max_pages_per_slot - len(pages))
            assert len(pages) >= b.pages_for(len(t))
            assert b.hashes[slot] == chain(t, P)[:len(b.hashes[slot])]
            assert len(b.hashes[slot]) == self.committed[slot] // P
            assert [b.name.get(p) for p in pages[:len(b.hashes[slot])]] == b.hashes[slot]
            for i, page in enumerate(pages):
                count[page] += 1
                if page in where:
                    s2, i2 = where[page]
                    assert i2 == i and page in b.name, f"page {page} shared by slots {s2}, {slot}"
                    assert t[:(i + 1) * P] == self.toks[s2][:(i + 1) * P] and len(t) >= (i + 1) * P
                where[page] = (slot, i)
        assert count.tolist() == b.ref.tolist()
        for page, h in b.name.items():
            assert len(self.kv[page]) % P == 0 and chain(self.kv[page], P)[-1] == h, f"page {page}: stale name"
        for h, page in b.by_name.items():
            assert b.name.get(page) == h
        for page in np.flatnonzero(b.draft_ok):
            assert page in b.name and self.draft.get(page) == self.kv[page]


BlockMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestBlockMachine = BlockMachine.TestCase


# ---------------------------------------------------------------- plain unit tests
def prefill(b, tokens, need_draft=False):
    """What the scheduler and engine do for a new prompt: match, adopt, reserve, commit."""
    slot = b.allocate()
    hit = b.adopt(slot, *b.match(tokens, need_draft))
    assert b.reserve(slot, len(tokens))
    b.commit(slot, tokens, len(tokens))
    return slot, hit


def test_lru_evicts_least_recently_released_page_first():
    b = BlockManager(4, 2, 3, 4)  # pages 1..3
    a, c, d = (prefill(b, [t, t])[0] for t in (1, 2, 3))
    assert b.free_pages == [] and b.match([1, 1, 0], False)[0] == b.pages[a]
    pa, pc, pd = b.pages[a][0], b.pages[c][0], b.pages[d][0]
    for slot in (c, a, d):  # released in this order: pc is the oldest
        b.free(slot)
    assert list(b.lru) == [pc, pa, pd] and b.available == 3
    s = b.allocate()
    assert b.reserve(s, 2) and b.pages[s] == [pc]
    assert b.match([2, 2, 0], False) == ([], []) and b.match([1, 1, 0], False)[0] == [pa]
    # adopting a cached page and releasing it again makes it the most recent
    s2 = b.allocate()
    b.adopt(s2, *b.match([1, 1, 0], False))
    b.free(s2)
    assert list(b.lru) == [pd, pa]
    assert b.reserve(s, 4) and b.pages[s] == [pc, pd] and b.match([3, 3, 0], False) == ([], [])


def test_prefix_hit_across_requests_reuses_only_full_pages():
    b = BlockManager(16, 4, 2, 8)
    first = list(range(1, 11))  # 2 full pages + a partial one
    a, hit = prefill(b, first)
    assert hit == 0 and len(b.pages[a]) == 3
    second = first + [7, 7, 7]  # same 10 tokens then a different suffix: the partial page must not match
    s, hit = prefill(b, second)
    assert hit == 8 and b.pages[s][:2] == b.pages[a][:2] and b.pages[s][2] != b.pages[a][2]
    assert b.ref[b.pages[a][0]] == 2 and b.ref[b.pages[a][2]] == 1
    other = [9] + first[1:]  # a different first token: nothing shared
    assert b.match(other, False) == ([], [])


def test_match_leaves_at_least_one_token_to_compute():
    b = BlockManager(8, 4, 2, 4)
    a, _ = prefill(b, list(range(8)))  # both pages named
    assert len(b.hashes[a]) == 2
    assert b.match(list(range(8)), False)[0] == b.pages[a][:1]
    assert b.match(list(range(9)), False)[0] == b.pages[a]
    assert b.match([0], False) == ([], [])


def test_need_draft_stops_at_page_without_drafter_rows():
    b = BlockManager(8, 4, 2, 4)
    toks = list(range(9))
    a, _ = prefill(b, toks)
    full = b.pages[a][:2]
    assert b.match(toks, False)[0] == full and b.match(toks, True) == ([], [])
    b.drafted(a, 7)  # only the first page's drafter rows are all written
    assert b.match(toks, True)[0] == full[:1]
    b.drafted(a, 8)
    assert b.match(toks, True)[0] == full
    b.free(a)  # cached pages keep their drafter rows
    assert b.match(toks, True)[0] == full and b.draft_ok[full].all() and list(b.lru) == full[::-1]


def test_duplicate_name_prefers_page_with_drafter_rows():
    b = BlockManager(8, 2, 3, 4)
    a, _ = prefill(b, [1, 1, 0])  # page 1 named, no drafter rows
    s, hit = prefill(b, [1, 1, 0], need_draft=True)  # cannot reuse page 1: computes its own copy
    pa, ps = b.pages[a][0], b.pages[s][0]
    assert hit == 0 and pa != ps and b.name[ps] == b.name[pa] and b.match([1, 1, 0], False)[0] == [pa]
    b.drafted(s, 2)  # the name moves to the copy whose drafter rows are written
    assert b.match([1, 1, 0], True)[0] == [ps] and b.match([1, 1, 0], False)[0] == [ps]
    prefill(b, [1, 1])  # a third copy (too short to match) must not take the name back
    assert b.match([1, 1, 0], True)[0] == [ps]
    b.free(s)
    assert b.match([1, 1, 0], True)[0] == [ps] and b.lru[ps] is None


def test_rows_maps_through_table_and_null_page_past_pages():
    b = BlockManager(10, 4, 3, 4)
    s0, s1 = b.allocate(), b.allocate()
    assert b.reserve(s0, 5) and b.reserve(s1, 3)
    rows = np.array([[0, 3, 4, 9], [1, 2, 5, 14]])
    (p0, p1), (q0,) = b.pages[s0], b.pages[s1]
    want = np.array([[p0 * 4, p0 * 4 + 3, p1 * 4, 1], [q0 * 4 + 1, q0 * 4 + 2, 1, 2]])
    np.testing.assert_array_equal(b.rows([s0, s1], rows), want)
    np.testing.assert_array_equal(b.rows(np.array([s1]), np.array([[2]])), [[q0 * 4 + 2]])


def test_reserve_beyond_max_pages_per_slot_fails_and_takes_nothing():
    b = BlockManager(20, 4, 2, 2)
    s = b.allocate()
    assert not b.reserve(s, 9) and b.pages[s] == [] and b.available == 19
    assert b.reserve(s, 8) and len(b.pages[s]) == 2 and not b.reserve(s, 9) and b.available == 17
    t = b.allocate()
    assert not b.reserve(t, 4 * 18) and b.pages[t] == []


def test_free_twice_raises():
    b = BlockManager(4, 2, 2, 2)
    b.free(b.allocate())
    for slot in (0, 5):
        with pytest.raises(ValueError):
            b.free(slot)


def test_without_prefix_caching_nothing_is_named_or_matched():
    b = BlockManager(8, 2, 2, 4, prefix_caching=False)
    a, hit = prefill(b, [1, 2, 3, 4, 5])
    b.drafted(a, 4)
    assert hit == 0 and not b.name and not b.by_name and not b.hashes[a] and not b.unnamed(a, 5)
    assert b.match([1, 2, 3, 4, 5], False) == ([], []) and not b.draft_ok.any()
    b.free(a)
    assert not b.lru and len(b.free_pages) == 7


def test_trim_into_a_named_page_is_refused():
    """A named page's rows are committed and may be shared: cutting inside one (and then
    rewriting its tail) would make its name lie, or write into another request's KV."""
    b = BlockManager(8, 4, 2, 4)
    a, _ = prefill(b, [0, 1, 2, 3, 4, 5, 6, 7, 8])  # pages 1, 2 named, 3 partial
    with pytest.raises(ValueError, match="cuts into named"):
        b.trim(a, 5)
    b.trim(a, 4)  # whole named pages may go (they stay cached under their names)
    assert len(b.hashes[a]) == 1 and b.match([0, 1, 2, 3, 4, 5, 6, 7, 8], False)[0] == [1, 2]

def test_reset_prefix_cache_frees_every_cached_page_only_when_no_slot_is_held():
    b = BlockManager(8, 4, 2, 4)
    a, _ = prefill(b, list(range(9)))  # 2 named pages + a partial one
    b.drafted(a, 9)
    assert not b.reset_prefix_cache() and b.match(list(range(9)), True)[0] == b.pages[a][:2]  # held: refused
    b.free(a)
    assert len(b.lru) == 2 and b.reset_prefix_cache()
    assert not b.lru and not b.name and not b.by_name and not b.draft_ok.any()
    assert sorted(b.free_pages) == list(range(1, 8)) and b.available == 7
    assert b.match(list(range(9)), False) == ([], [])


def test_settle_trims_names_full_pages_and_marks_drafter_rows():
    """After a round: pages past the next round's reservation go back, newly full pages are named
    (their tokens read only then), and drafter rows mark their full named pages."""
    b = BlockManager(12, 4, 2, 6)
    toks = list(range(1, 15))
    slot, _ = prefill(b, toks[:5])          # one page named, row 4 in the second
    assert b.reserve(slot, 5 + 12)          # the round's tree: pages to row 17
    reads = []

    def tokens():
        reads.append(1)
        return toks

    b.settle(slot, 6, 6 + 4, tokens, None)  # 6 rows committed, the next round reserves 4 more
    assert len(b.pages[slot]) == 3 and len(b.hashes[slot]) == 1 and reads == []  # no new full page: not read
    b.settle(slot, 9, 9 + 4, tokens, drafted=8)
    assert len(b.pages[slot]) == 3 and b.hashes[slot] == chain(toks[:8], 4) and reads == [1]  # trim adds none
    assert b.match(toks[:9], True)[0] == b.pages[slot][:2]  # both full pages reusable with drafter rows
    b.settle(slot, 9, 9 + 4, tokens, drafted=None)  # nothing new: nothing read, nothing changed
    assert reads == [1] and len(b.pages[slot]) == 3
