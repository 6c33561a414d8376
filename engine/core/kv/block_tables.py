"""Every request's block table as a row of one int32 matrix (vLLM's persistent BlockTable).

`Request.block_table` (a Python list) stays the truth the scheduler reads; KVManager,
the only code that changes a table, mirrors each change into the request's row here.
A step then takes its rows with one numpy indexing op instead of converting hundreds
of Python lists (the largest host cost of building a wide step's batch). Columns past
a row's length are zero, as the ragged-to-dense conversion padded them.
"""
from __future__ import annotations

import numpy as np


class BlockTables:
    def __init__(self, rows: int = 64, width: int = 64):
        self.matrix = np.zeros((rows, width), dtype=np.int32)
        self._free_rows = list(range(rows - 1, -1, -1))
        self.lengths = np.zeros(rows, dtype=np.int64)

    def sync(self, req, start: int = 0) -> None:
        """Mirror req.block_table[start:] into its row (a row is taken on first use)."""
        table = req.block_table
        if req.table_row < 0:
            req.table_row = self._take_row()
            start = 0
        if len(table) > self.matrix.shape[1]:
            self._grow(cols=max(len(table), 2 * self.matrix.shape[1]))
        row, n = req.table_row, len(table)
        if n - start == 1:          # a decode's next block: a scalar store, not a slice
            self.matrix[row, start] = table[start]
        else:
            self.matrix[row, start:n] = table[start:]
        self.lengths[row] = n

    def release(self, req) -> None:
        row = req.table_row
        if row >= 0:
            self.matrix[row, :self.lengths[row]] = 0
            self.lengths[row] = 0
            self._free_rows.append(row)
            req.table_row = -1

    def gather(self, reqs: list) -> np.ndarray:
        """[len(reqs), widest] int32: the requests' tables, zero padded."""
        return self.gather_rows(np.fromiter((r.table_row for r in reqs), dtype=np.int64,
                                            count=len(reqs)))

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """gather() by table rows (Request.table_row) already collected."""
        width = int(self.lengths[rows].max()) if len(rows) else 0
        return self.matrix[rows, :max(width, 1)]

    def row(self, req) -> np.ndarray:
        return self.matrix[req.table_row, :self.lengths[req.table_row]]

    def check(self, reqs: list) -> None:
        """Assert every row equals its request's list (check_invariants)."""
        for r in reqs:
            if r.block_table:
                assert r.table_row >= 0 and self.row(r).tolist() == r.block_table, \
                    f"block table row of {r.request_id} out of step"

    def _take_row(self) -> int:
        if not self._free_rows:
            self._grow(rows=2 * self.matrix.shape[0])
        return self._free_rows.pop()

    def _grow(self, rows: int | None = None, cols: int | None = None) -> None:
        old = self.matrix
        n, w = rows or old.shape[0], cols or old.shape[1]
        self.matrix = np.zeros((n, w), dtype=np.int32)
        self.matrix[:old.shape[0], :old.shape[1]] = old
        if n > old.shape[0]:
            self.lengths = np.concatenate((self.lengths, np.zeros(n - old.shape[0], np.int64)))
            self._free_rows = list(range(n - 1, old.shape[0] - 1, -1)) + self._free_rows
