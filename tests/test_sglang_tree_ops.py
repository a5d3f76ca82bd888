"""The torch stand-ins for sgl_kernel's EAGLE tree ops (scenarios/sglang/tree_ops.py), which
releases before 0.5.16 get, against sglang's own Triton kernels of the installed release (0.5.16
and later): the same draft trees, made by sglang's own `select_top_k_tokens` and
`organize_draft_results` from random draft distributions, give the same outputs."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

_CHILD = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from racecheck.scenarios.sglang import imports, tree_ops
imports.install()
from sglang.kernels.ops.speculative import spec_tree
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.spec_utils import select_top_k_tokens

def draft_tree(gen, bs, topk, steps, n):
    # what the draft worker's loop hands organize_draft_results
    scores, hidden = None, torch.zeros(bs, 4)
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        probs = torch.rand(bs * (1 if i == 0 else topk), 32, generator=gen).softmax(-1)
        topk_p, topk_index = probs.topk(topk, dim=-1)
        _ids, hidden, scores, tree_info = select_top_k_tokens(i, topk_p, topk_index, hidden,
                                                              scores, topk)
        score_list.append(tree_info[0]); token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        hidden = hidden.reshape(-1, 4)[: bs * topk]
    return organize_draft_results(score_list, token_list, parents_list, n)

def buffers(bs, n, seq_lens, mode):
    if mode == 0:
        mask = torch.full((int(seq_lens.sum()) * n + n * n * bs,), True)
    else:
        mask = torch.full((n * bs * n,), True)
    retrive = torch.full((3, bs, n), -1, dtype=torch.long)
    return [mask, torch.empty(bs * n, dtype=torch.long), *retrive.clone()]

gen = torch.Generator().manual_seed(0)
bad, cases, accepted = [], 0, 0
for bs in (1, 3):
    for topk, steps, n in ((1, 3, 4), (2, 3, 4), (2, 4, 6), (4, 3, 8), (4, 1, 4), (3, 5, 12)):
        for mode in (0, 1):
            for trial in range(2):
                cases += 1
                parent_list, sel, draft = draft_tree(gen, bs, topk, steps, n)
                seq_lens = torch.randint(1, 20, (bs,), generator=gen)
                ours, theirs = buffers(bs, n, seq_lens, mode), buffers(bs, n, seq_lens, mode)
                tree_ops.build_tree_kernel_efficient(parent_list, sel, seq_lens, *ours, topk,
                                                     steps, n, mode)
                spec_tree.sgl_build_tree_kernel_triton(parent_list, sel, seq_lens, *theirs,
                                                       topk, steps, n,
                                                       spec_tree.TreeMaskMode(mode))
                names = ("tree_mask", "positions", "retrive_index", "retrive_next_token",
                         "retrive_next_sibling")
                for name, a, b in zip(names, ours, theirs):
                    if not torch.equal(a, b):
                        bad.append(f"build bs={bs} topk={topk} steps={steps} n={n} "
                                   f"mode={mode}: {name}")
                if mode:
                    continue
                # greedy verify on that tree: targets that follow some child, or not
                _mask, _pos, index, next_token, next_sibling = ours
                cand = torch.cat([torch.zeros(bs, 1, dtype=torch.long), draft], 1)
                target = torch.randint(0, 32, (bs, n), generator=gen)
                for b in range(bs):
                    for s in range(n):
                        child = int(next_token[b, s])
                        while child != -1 and torch.rand(1, generator=gen) < 0.4:
                            child = int(next_sibling[b, child])
                        if child != -1 and torch.rand(1, generator=gen) < 0.8:
                            target[b, s] = cand[b, child]
                outs = []
                for fn, prefix in ((tree_ops.verify_tree_greedy, "retrive"),
                                   (spec_tree.verify_tree_greedy_triton, "retrieve")):
                    predicts = torch.full((bs * n,), -7, dtype=torch.int32)
                    accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
                    accept_num = torch.full((bs,), -3, dtype=torch.int32)
                    fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                       candidates=cand, target_predict=target,
                       **{f"{prefix}_index": index, f"{prefix}_next_token": next_token,
                          f"{prefix}_next_sibling": next_sibling})
                    outs.append((predicts, accept_index, accept_num))
                accepted += int(outs[1][2].sum())
                for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), *outs):
                    if not torch.equal(a, b):
                        bad.append(f"verify bs={bs} topk={topk} steps={steps} n={n}: {name}")
print(json.dumps({"cases": cases, "bad": bad, "accepted": accepted}))
"""


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None
                    or importlib.util.find_spec("triton") is None
                    or importlib.util.find_spec("sglang.kernels") is None,
                    reason="needs sglang 0.5.16 or later (its Triton tree kernels) and triton")
def test_tree_stand_ins_match_sglangs_triton_kernels():
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cases"] == 48 and out["accepted"] > 0     # trees that accept drafts
    assert out["bad"] == [], out["bad"][:10]


def test_tree_stand_ins_are_declared_kernels():
    from racecheck.scenarios.sglang import tree_ops
    build = tree_ops.build_tree_kernel_efficient.racecheck_kernel
    assert set(build.writes) == {"tree_mask", "positions", "retrive_index",
                                 "retrive_next_token", "retrive_next_sibling"}
    verify = tree_ops.verify_tree_greedy.racecheck_kernel
    assert set(verify.writes) == {"predicts", "accept_index", "accept_token_num"}
    assert "target_predict" in verify.reads and "candidates" in verify.reads


def test_tree_stand_ins_run_as_one_declared_launch_on_sim():
    """Under a session, on routed "cuda" tensors: one kernel on the current stream, the same
    outputs as outside a session."""
    import torch

    import racecheck
    from racecheck.scenarios.sglang import tree_ops

    def tree(device):
        bs, n = 2, 4
        parent_list = torch.tensor([[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]], device=device)
        sel = torch.tensor([[0, 1, 4], [1, 5, 6]], device=device)
        seq_lens = torch.tensor([3, 5], device=device)
        mask = torch.full((int(8) * n + n * n * bs,), True, device=device)
        retrive = torch.full((3, bs, n), -1, dtype=torch.long, device=device)
        positions = torch.empty(bs * n, dtype=torch.long, device=device)
        tree_ops.build_tree_kernel_efficient(parent_list, sel, seq_lens, mask, positions,
                                             *retrive, 2, 3, n, 0)
        return [t.cpu() for t in (mask, positions, *retrive)]
    expected = tree("cpu")
    with racecheck.session(device="sim", route_cuda=True) as rc:
        got = tree("cuda")
        torch.cuda.synchronize()
    for a, b in zip(expected, got):
        assert torch.equal(a, b)
    assert not rc.findings
    assert expected[1].tolist() == [3, 4, 4, 5, 5, 6, 7, 6]     # depths + seq_lens
