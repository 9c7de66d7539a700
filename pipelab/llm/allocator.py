"""A replay of PyTorch's CUDA caching allocator with expandable segments: reserved from allocated.

``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` (what torchtitan and most training logs
report as a run's memory) counts the pages the allocator has mapped, which exceed the bytes tensors
hold by what fragmentation and per-stream caching strand. This module replays an ordered trace of
allocations and frees (:class:`pipelab.llm.measure.StorageMeter` records one) through the allocator's
rules with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, as ``c10/cuda/CUDACachingAllocator.cpp``
states them (its Note [Expandable Segments], ``round_size``, ``get_free_block``, ``should_split``,
``try_allocate_expandable_block``, ``free_block``):

- a request is rounded up to a multiple of 512 bytes;
- requests of at most 1 MiB come from the small pool, larger ones from the large pool; each stream has
  its own pools, and memory freed on one stream is never reused by another;
- each pool is one segment of virtual addresses that grows at its end by whole pages (2 MiB small,
  20 MiB large) and is never shrunk unless an allocation would fail (not modelled: the replay reports
  the peak it would need, which a device smaller than that would meet with frees and retries);
- a request takes the smallest free block that holds it, a block inside the segment before the free
  block at its end (the one that can grow); it is split, the rest staying free, when 512 bytes or more
  remain; only when no block holds it does the segment map pages, extending its free end block;
- a freed block merges with free neighbours.

Invariants: per pool, blocks tile ``[0, mapped)`` in address order; reserved bytes are the sum of the
pools' ``mapped``; allocated bytes are the rounded sizes of live blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

MIN_BLOCK = 512                  # kMinBlockSize: every request rounds to a multiple of this
SMALL_SIZE = 1 << 20             # kSmallSize: the largest request served by the small pool
SMALL_PAGE = 2 << 20             # kSmallBuffer: the small pool's page
LARGE_PAGE = 20 << 20            # kLargeBuffer: the large pool's page

#: one trace event: ``("alloc", key, bytes, stream)`` or ``("free", key, bytes, stream)``
Event = tuple[str, Hashable, int, str]


def round_size(nbytes: int) -> int:
    """The allocator's size for a request of ``nbytes`` (a multiple of 512, at least 512)."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


@dataclass
class _Block:
    start: int
    size: int
    used: bool = False


@dataclass
class Segment:
    """One expandable segment: the blocks tiling its mapped addresses, and its page size."""

    page: int
    blocks: list[_Block] = field(default_factory=list)
    mapped: int = 0

    def malloc(self, size: int) -> int:
        """Place a request of ``size`` (already rounded); returns its start address."""
        best = None
        tail = self.blocks[-1] if self.blocks and not self.blocks[-1].used else None
        for b in self.blocks:
            if not b.used and b is not tail and b.size >= size and (best is None or b.size < best.size):
                best = b
        if best is None:
            if tail is None:
                tail = _Block(self.mapped, 0)
                self.blocks.append(tail)
            if tail.size < size:
                grow = -(-(size - tail.size) // self.page) * self.page
                tail.size += grow
                self.mapped += grow
            best = tail
        i = self.blocks.index(best)
        if best.size - size >= MIN_BLOCK:
            self.blocks.insert(i + 1, _Block(best.start + size, best.size - size))
            best.size = size
        best.used = True
        return best.start

    def free(self, start: int) -> None:
        """Release the block at ``start``, merging it with free neighbours."""
        i = next(j for j, b in enumerate(self.blocks) if b.start == start and b.used)
        self.blocks[i].used = False
        if i + 1 < len(self.blocks) and not self.blocks[i + 1].used:
            self.blocks[i].size += self.blocks.pop(i + 1).size
        if i > 0 and not self.blocks[i - 1].used:
            self.blocks[i - 1].size += self.blocks.pop(i).size


@dataclass(frozen=True)
class Replay:
    """Peaks of a replayed trace, in bytes, and each pool's mapped bytes at the end."""

    peak_reserved: int
    peak_allocated: int
    pools: dict[tuple[str, str], int]

    @property
    def reserve_share(self) -> float:
        """How much the reserved peak exceeds the allocated one, as a share of the latter."""
        return self.peak_reserved / self.peak_allocated - 1 if self.peak_allocated else 0.0


def replay(events: Iterable[Event]) -> Replay:
    """Replay ``events`` in order through the expandable-segments allocator; its peaks.

    Raises:
        ValueError: for a free of a key never allocated (or freed twice), naming it.
    """
    segments: dict[tuple[str, str], Segment] = {}
    where: dict[Hashable, tuple[tuple[str, str], int, int]] = {}
    reserved = allocated = peak_reserved = peak_allocated = 0
    for kind, key, nbytes, stream in events:
        if kind == "alloc":
            size = round_size(nbytes)
            pool = (stream, "small" if size <= SMALL_SIZE else "large")
            seg = segments.setdefault(pool, Segment(SMALL_PAGE if size <= SMALL_SIZE else LARGE_PAGE))
            before = seg.mapped
            where[key] = (pool, seg.malloc(size), size)
            reserved += seg.mapped - before
            allocated += size
            peak_reserved, peak_allocated = max(peak_reserved, reserved), max(peak_allocated, allocated)
        elif kind == "free":
            if key not in where:
                raise ValueError(f"replay: free of {key!r}, which is not allocated")
            pool, start, size = where.pop(key)
            segments[pool].free(start)
            allocated -= size
        else:
            raise ValueError(f"replay: event kind {kind!r} is not 'alloc' or 'free'")
    return Replay(peak_reserved, peak_allocated, {p: s.mapped for p, s in segments.items()})
