"""The program's own names for unnamed tensors (`instrumentation/names.py`): which holder wins,
and one walk over the collector's objects per moment of the program, however many findings."""
from __future__ import annotations

import torch
from racecheck.instrumentation.footprints import StorageRegistry
from racecheck.instrumentation.names import HolderNames


class ForwardBatch:
    def __init__(self, seq_lens):
        self.seq_lens = seq_lens


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def _registered(*tensors):
    reg = StorageRegistry(lambda sid, nbytes, host: None)
    return reg, [reg.lookup(t)[0] for t in tensors]


def test_an_attribute_beats_a_variable_and_a_covering_view_beats_the_whole_buffer():
    buf = torch.zeros(16, dtype=torch.int32)
    batch = ForwardBatch(buf[4:8])
    pool = {"req_to_token": buf}
    reg, [sid] = _registered(buf)
    names = HolderNames(reg)
    assert names(sid, 16, 32) == "ForwardBatch.seq_lens"       # bytes 16..31: the view
    assert names(sid, 0, 64) == "buf"           # the whole buffer: this frame's variable
    del batch, pool


def test_a_dict_key_names_a_tensor_nothing_else_holds():
    held = {"new_seq_lens_buf": torch.ones(4)}
    reg, [sid] = _registered(held["new_seq_lens_buf"])
    assert HolderNames(reg)(sid) == "new_seq_lens_buf"


def test_one_walk_per_moment_of_the_program():
    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    reg, sids = _registered(a, b, c)
    clock = Clock()
    names = HolderNames(reg, moment=clock)
    names.prefetch(sids[:2])
    assert names.passes == 1
    # the same moment: storages already looked for cost nothing, a new one one walk
    assert (names(sids[0]), names(sids[1])) == ("a", "b")
    names.prefetch(sids[:2])
    assert names.passes == 1
    assert names(sids[2]) == "c" and names.passes == 2
    # the program ran: it may hold its tensors differently, so a new batch walks again
    clock.now = 1
    names.prefetch(sids[:1])
    assert names.passes == 3


def test_without_a_moment_every_batch_walks():
    a = torch.zeros(4)
    reg, [sid] = _registered(a)
    names = HolderNames(reg)
    names.prefetch([sid])
    names.prefetch([sid])
    assert names.passes == 2 and names(sid) == "a"
    assert names.passes == 2            # a name asked after its batch's walk costs none


def test_a_session_names_a_race_by_its_holder_once_per_flush():
    import racecheck
    with racecheck.session(device="sim") as rc:
        cuda = rc.device_module
        side = cuda.Stream()
        batch = ForwardBatch(torch.zeros(64))
        with cuda.stream(side):
            batch.seq_lens.add_(1)
        batch.seq_lens.mul_(2)
        other = torch.zeros(64)
        with cuda.stream(side):
            other.add_(1)
        other.mul_(2)
        cuda.synchronize()
        namer = rc.checker.namer
    tensors = sorted({f.tensor for f in rc.findings})
    assert tensors == ["ForwardBatch.seq_lens", "other"], rc.findings
    assert 1 <= namer.passes <= 2, namer.passes


class KVPool:
    def __init__(self, layers):
        self.k_buffer = [torch.zeros(8) for _ in range(layers)]


def test_a_tensor_in_a_list_is_named_by_the_attribute_that_holds_the_list():
    pool = KVPool(3)
    pool.__dict__                          # the attributes in a dict object, and inline below
    inline = KVPool(2)
    reg, [sid, other] = _registered(pool.k_buffer[2], inline.k_buffer[1])
    names = HolderNames(reg)
    assert names(sid) == "KVPool.k_buffer[2]"
    assert names(other) == "KVPool.k_buffer[1]"
    table = {"layers": (torch.ones(2),)}
    reg, [kid] = _registered(table["layers"][0])
    assert HolderNames(reg)(kid) == "layers[0]"
    del pool, inline, table


def test_an_attribute_still_beats_the_list_that_also_holds_the_tensor():
    buf = torch.zeros(4)
    batch = ForwardBatch(buf)
    batch.h = [buf]                        # a shorter name, but an element
    reg, [sid] = _registered(buf)
    assert HolderNames(reg)(sid) == "ForwardBatch.seq_lens"
    del batch
