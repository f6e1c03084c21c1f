"""PagedKVCache's read-only accessors and id checks (a base class, to keep allocator.py short)."""

from __future__ import annotations

import numpy as np

from ..errors import HexcoreInvalidArgumentError, Status, raise_for_status
from . import _blocks as core
from ._validation import as_index, describe_seq_error, verify_state


class CacheAccessors:
    """Queries on a PagedKVCache's state; the state itself is set up by PagedKVCache."""

    def block_table(self, seq_id: int) -> np.ndarray:
        """A copy of ``seq_id``'s sealed block ids, in logical order (int32)."""
        return self._tables[self._live(seq_id), : self.seq_len(seq_id) // self.block_size].copy()

    def seq_len(self, seq_id: int) -> int:
        """Length of ``seq_id`` in tokens (sealed blocks plus tail)."""
        return int(self._seqs[core.LEN, self._live(seq_id)])

    def prefetched_block(self, seq_id: int) -> int:
        """Block reserved for ``seq_id``'s next seal, -1 if none."""
        return int(self._seqs[core.PREFETCHED, self._live(seq_id)])

    def is_live(self, seq_id: int) -> bool:
        """True if ``seq_id`` is a live sequence."""
        try:
            return bool(core._is_live(self._seqs, as_index("seq_id", seq_id)))
        except HexcoreInvalidArgumentError:
            return False

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free stack."""
        return int(self._counters[core.NUM_FREE])

    @property
    def num_active_blocks(self) -> int:
        """Blocks referenced by at least one block table."""
        return int(self._counters[core.NUM_LIVE])

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks parked in a sequence's prefetched slot."""
        return int(self._counters[core.NUM_RESERVED])

    @property
    def num_sequences(self) -> int:
        """Live sequences."""
        return self.max_seqs - int(self._counters[core.NUM_FREE_SEQS])

    def check_invariants(self) -> None:
        """Raise AssertionError if the state is inconsistent (for tests; O(state size))."""
        verify_state(self._blocks, self._seqs, self._tables, self._counters, self.block_size)

    # -- id checks shared by the mutating calls ----------------------------------------
    def _live(self, seq_id) -> int:
        seq_id = as_index("seq_id", seq_id)
        if not core._is_live(self._seqs, seq_id):
            self._fail(Status.INVALID_SEQUENCE, "use", seq_id)
        return seq_id

    def _slot(self, name, seq_id) -> int:
        seq_id = as_index(name, seq_id)
        if seq_id < 0:  # -1 means "any slot" to the njit core
            self._fail(Status.INVALID_SEQUENCE, "add", seq_id)
        return seq_id

    def _fail(self, status, action, seq_id, new_len=None):
        raise_for_status(status, describe_seq_error(self, int(status), action, seq_id, new_len))
