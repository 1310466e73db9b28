#!/usr/bin/env python3
"""A model of the handshake of the heads-in-M block in pairs (kernels/mla_wgmma.cu, wgmma_hm_decode
with kPair), run under random schedules.

Two blocks, X and Y, each with its two warpgroups as one actor apiece, walk T tiles through two
FP16 tile copies a block. Each block's warpgroup 1 writes its half of every tile into both blocks'
copies; the peer's half goes by st.async, its bytes counted at the peer's tile_full as they land,
which the model takes as the write and then an arrival there. The model follows the kernel's order
of named barriers (kHmBarRead, kHmBarP, kHmBarPFree, kHmBarPv), mbarriers (tile_full, tile_empty) and reads (S, and each warpgroup's P·V), and checks:
- no deadlock;
- a copy is read for tile t only while it holds both halves of tile t;
- a copy is overwritten only once every read of the tile it held has ended.

As in the kernel, warpgroup 0 waits on tile_full for tile 0 alone, and warpgroup 1 for every later
tile before its kHmBarP (which warpgroup 0 meets before that tile's S). The model then checks that
it can fail: without the tile_empty wait a copy is overwritten under a read, and without warpgroup
1's tile_full wait a half-written tile is read. Exit 0 when the kernel's protocol passes and both
mutants fail. About five seconds.
"""
import random
import sys


class NamedBarrier:  # barrier.sync / barrier.arrive of both warpgroups (256 threads)
    def __init__(self):
        self.count, self.generation = 0, 0

    def arrive(self):
        self.count += 1
        if self.count == 2:
            self.count, self.generation = 0, self.generation + 1


class MBarrier:  # `count` arrivals complete a phase (one per warpgroup actor)
    def __init__(self, count):
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.completed, self.pending = self.completed + 1, self.count

    def passed(self, parity):  # mbarrier.try_wait.parity: the phase of that parity has completed
        return self.completed % 2 != parity


def run(tiles, seed, wait_empty=True, wg1_waits_full=True):
    """One random schedule; returns the first violation, or None."""
    rnd = random.Random(seed)
    blocks = {
        name: {
            "bar": {k: NamedBarrier() for k in ("Read", "P", "PFree", "Pv")},
            "full": [MBarrier(2), MBarrier(2)],  # both blocks' warpgroup 1
            "empty": [MBarrier(1), MBarrier(1)],  # the peer's warpgroup 1
            "copy": [{"tile": None, "halves": set(), "readers": set()} for _ in range(2)],
        }
        for name in "XY"
    }
    errors = []

    def write_half(block, b, tile, writer):
        copy = blocks[block]["copy"][b]
        if copy["tile"] != tile:
            if copy["readers"]:
                errors.append(f"{writer} overwrites {block}'s copy {b} (tile {copy['tile']}) under {copy['readers']}")
            copy["tile"], copy["halves"] = tile, set()
        copy["halves"].add(writer[0])

    def begin_read(block, b, tile, reader):
        copy = blocks[block]["copy"][b]
        if copy["tile"] != tile or copy["halves"] != {"X", "Y"}:
            errors.append(f"{block}.{reader} reads copy {b} for tile {tile}: it holds {copy['tile']}, "
                          f"halves {sorted(copy['halves'])}")
        copy["readers"].add((reader, tile))

    def end_read(block, b, tile, reader):
        blocks[block]["copy"][b]["readers"].discard((reader, tile))

    def sync(block, name):
        barrier = blocks[block]["bar"][name]
        generation = barrier.generation
        barrier.arrive()
        while barrier.generation == generation:
            yield

    def wait(mbarrier, parity):
        while not mbarrier.passed(parity):
            yield

    def warpgroup1(me, peer):
        mine, theirs = blocks[me], blocks[peer]
        if tiles > 0:  # after the cluster's barrier: tile 0's half into both copies
            write_half(me, 0, 0, me + ".wg1")
            yield
            write_half(peer, 0, 0, me + ".wg1")
            yield
            theirs["full"][0].arrive()
            mine["full"][0].arrive()
            yield
        for i in range(tiles):
            more = i + 1 < tiles
            if i > 0:
                yield from sync(me, "Read")
            if more:
                b = (i + 1) % 2
                if i > 0:
                    theirs["empty"][b].arrive()
                    yield
                    if wait_empty:
                        yield from wait(mine["empty"][b], ((i - 1) // 2) % 2)
                write_half(me, b, i + 1, me + ".wg1")
                yield
                write_half(peer, b, i + 1, me + ".wg1")
                yield
                theirs["full"][b].arrive()
                mine["full"][b].arrive()
                yield
                if wg1_waits_full:
                    yield from wait(mine["full"][b], ((i + 1) // 2) % 2)
            yield from sync(me, "P")
            begin_read(me, i % 2, i, "wg1 P·V")
            yield
            if more:
                mine["bar"]["Pv"].arrive()
            yield
            end_read(me, i % 2, i, "wg1 P·V")
            yield
            if more:
                mine["bar"]["PFree"].arrive()
            yield

    def warpgroup0(me):
        mine = blocks[me]
        if tiles > 0:
            yield from wait(mine["full"][0], 0)
            begin_read(me, 0, 0, "wg0 S")
        yield
        for i in range(tiles):
            more = i + 1 < tiles
            end_read(me, i % 2, i, "wg0 S")  # S(i) waited for before the softmax
            yield
            if i > 0:
                yield from sync(me, "PFree")
            yield from sync(me, "P")
            begin_read(me, i % 2, i, "wg0 P·V")
            yield
            if more:
                yield from sync(me, "Pv")
                begin_read(me, (i + 1) % 2, i + 1, "wg0 S")
                yield
                end_read(me, i % 2, i, "wg0 P·V")  # wgmma_wait<1>
                yield
                mine["bar"]["Read"].arrive()
            else:
                end_read(me, i % 2, i, "wg0 P·V")
            yield

    alive = [warpgroup1("X", "Y"), warpgroup1("Y", "X"), warpgroup0("X"), warpgroup0("Y")]
    for _ in range(100_000):
        if not alive:
            return None
        actor = rnd.choice(alive)
        try:
            next(actor)
        except StopIteration:
            alive.remove(actor)
        if errors:
            return errors[0]
    return "no progress in 100,000 steps: a deadlock"


def first_violation(**protocol):
    for tiles in range(9):
        for seed in range(3000):
            why = run(tiles, seed, **protocol)
            if why is not None:
                return f"{tiles} tiles, schedule {seed}: {why}"
    return None


def main():
    ok = True
    why = first_violation()
    print(f"the kernel's protocol: {why or 'no violation in 27,000 schedules of 0-8 tiles'}")
    ok &= why is None
    for name, protocol in (("without the tile_empty wait", {"wait_empty": False}),
                           ("without warpgroup 1's tile_full wait", {"wg1_waits_full": False})):
        why = first_violation(**protocol)
        print(f"{name}: {why or 'NO VIOLATION FOUND (the model cannot fail?)'}")
        ok &= why is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
