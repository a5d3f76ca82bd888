"""Torch stand-ins for sgl_kernel's EAGLE tree ops, for releases without sglang's Triton versions.

sglang builds EAGLE's draft tree (`build_tree_kernel_efficient`) and verifies it greedily
(`verify_tree_greedy`) with CUDA C++ ops from sgl_kernel. From 0.5.16 it also ships both as
Triton kernels (`sglang.kernels.ops.speculative.spec_tree`, taken on XPU), which the flavours
run on every platform (`surface.TRITON_TREE`, `surface.VERIFY_GREEDY_TRITON`). Releases before
that have only the CUDA ops; a CPU runner has no sgl_kernel, so `platform.flavour` puts these
in their place (`surface.NATIVE_TREE_BUILD`, `surface.NATIVE_GREEDY_VERIFY`), for those releases
only.

Each op is written here from its semantics, as sglang's Python callers use it (the buffers they
allocate, what they read back) and as sglang's own Triton kernels of 0.5.16 and later compute it;
tests/test_sglang_tree_ops.py checks both against those Triton kernels on the same inputs. Each
is one declared kernel (`racecheck.kernel`): a launch on the current stream that reads and writes
the named argument tensors whole, as the CUDA op does. The arithmetic is vectorized over the batch
on the tensors' own device (Python loops only over the tree's static sizes), so nothing waits on
the host: on a GPU the stand-in makes no synchronization the CUDA op does not make.

Argument names are sgl_kernel's (`retrive_*`, its spelling); sglang passes the tree build's
arguments by position and the verify's by name.
"""
from __future__ import annotations

import racecheck

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2      # sglang's TreeMaskMode values


def _arange(like, n: int):
    """0..n-1 (long) where `like` lives. Tensors are made from the arguments (`new_*`, `out=`),
    never from a device name: on sim the stand-in runs on the tensors' host memory."""
    import torch
    return torch.arange(n, out=like.new_empty(n, dtype=torch.long))


def _parent_slots(parent_list, selected_index, topk: int, num_tokens: int):
    """(B, N) long: the tree slot of each token's parent (slot 0 is the verified token, slot i
    the i-th selected draft token), -1 where it has none (the root, or a parent that was not
    selected).

    Draft token i (slot i >= 1) is entry `selected_index[b, i-1]` of the flattened top-k
    candidates; `// topk` names the candidate row it was expanded from: row 0 is the root,
    row r > 0 the candidate `parent_list[b, r]`, whose own slot is one past its (first)
    position in `selected_index`."""
    import torch
    bsz = selected_index.shape[0]
    sel = selected_index.long()
    out = sel.new_full((bsz, num_tokens), -1)
    if num_tokens <= 1:
        return out
    rows = sel[:, : num_tokens - 1] // topk                                 # (B, N-1)
    parents = parent_list.reshape(bsz, -1).long() if parent_list.numel() else None
    if parents is None:
        slot = torch.where(rows == 0, 0, -1)
    else:
        token = parents.gather(1, rows.clamp(0, parents.shape[1] - 1))     # (B, N-1)
        same = token.unsqueeze(2) == sel[:, : num_tokens - 1].unsqueeze(1)  # (B, N-1, N-1)
        found = same.any(2)
        first = same.int().argmax(2)                                      # first match
        slot = torch.where(rows == 0, 0, torch.where(found, first + 1, -1))
    out[:, 1:] = slot
    return out


@racecheck.kernel(reads=["parent_list", "selected_index", "verified_seq_len",
                         "retrive_next_token"],
                  writes=["tree_mask", "positions", "retrive_index", "retrive_next_token",
                          "retrive_next_sibling"])
def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask,
                                positions, retrive_index, retrive_next_token,
                                retrive_next_sibling, topk, depth, draft_token_num,
                                tree_mask_mode=FULL_MASK):
    """sgl_kernel's `build_tree_kernel_efficient`, in torch.

    In: `parent_list` (B, P) and `selected_index` (B, N-1) from `organize_draft_results`,
    `verified_seq_len` (B,) the committed lengths. Out, in place (the caller fills the retrive
    buffers with -1 and the mask's prefix columns with True first):
    - `retrive_index[b, i] = b*N + i`;
    - `retrive_next_token[b, s]`: the first child of slot s, `retrive_next_sibling[b, i]`: the
      next child of the same parent (children in slot order);
    - `positions[b*N + i]`: the committed length plus slot i's depth (the root's is 0);
    - the tree part of each token's mask row: the root and every slot on its path to the root
      (at most `depth` of them) True, the other tree slots False. FULL_MASK rows are
      `seq_len + N` wide and laid out batch after batch (a batch's rows start at
      `N*N*b + N*sum(seq_len[:b])`), the tree part after the `seq_len` prefix columns;
      QLEN_ONLY rows are the N tree columns alone, `N*N*b + N*i`."""
    import torch
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        # sglang asks for the bit-packed mask only for attention backends the front door does
        # not run (its Triton backend takes FULL_MASK or QLEN_ONLY)
        raise ValueError(f"racecheck's tree-build stand-in builds tree mask modes {FULL_MASK} "
                         f"and {QLEN_ONLY}, not {mode} (QLEN_ONLY_BITPACKING)")
    n = int(draft_token_num)
    bsz = verified_seq_len.shape[0]
    seq_len = verified_seq_len.long()
    parent = _parent_slots(parent_list, selected_index, int(topk), n)        # (B, N)
    batch = _arange(seq_len, bsz)
    slots = _arange(seq_len, n)

    retrive_index.copy_((batch.unsqueeze(1) * n + slots).to(retrive_index.dtype))

    # children linked in reverse slot order: each parent ends at its smallest child, and each
    # child points at the next larger sibling
    next_token = retrive_next_token.long().clone()
    next_sibling = retrive_next_sibling.long().clone()
    for i in range(n - 1, 0, -1):
        p = parent[:, i]
        linked = p >= 0
        at = p.clamp(min=0).unsqueeze(1)
        before = next_token.gather(1, at).squeeze(1)
        next_token.scatter_(1, at, torch.where(linked, i, before).unsqueeze(1))
        next_sibling[:, i] = torch.where(linked & (before != -1), before, next_sibling[:, i])
    retrive_next_token.copy_(next_token.to(retrive_next_token.dtype))
    retrive_next_sibling.copy_(next_sibling.to(retrive_next_sibling.dtype))

    # each token's path to the root, at most `depth` slots, and its depth
    rows = seq_len.new_zeros((bsz, n, n), dtype=torch.bool)
    rows[:, :, 0] = True
    level = seq_len.new_zeros((bsz, n))
    for x in range(1, n):
        slot = seq_len.new_full((bsz,), x)
        walking = seq_len.new_ones(bsz, dtype=torch.bool)
        for _ in range(int(depth)):
            rows[batch, x, slot] |= walking
            level[:, x] += walking.long()
            up = parent.gather(1, slot.unsqueeze(1)).squeeze(1)
            walking = walking & (up > 0)
            slot = torch.where(walking, up, slot)
    positions.view(bsz, n).copy_((seq_len.unsqueeze(1) + level).to(positions.dtype))

    if mode == FULL_MASK:
        start = n * n * batch + n * (torch.cumsum(seq_len, 0) - seq_len)   # (B,)
        width = seq_len + n
        index = (start.view(bsz, 1, 1) + width.view(bsz, 1, 1) * slots.view(1, n, 1)
                 + seq_len.view(bsz, 1, 1) + slots.view(1, 1, n))
    else:
        index = (n * n * batch.view(bsz, 1, 1) + n * slots.view(1, n, 1) + slots.view(1, 1, n))
    tree_mask.view(-1).index_put_((index.reshape(-1),), rows.reshape(-1).to(tree_mask.dtype))


@racecheck.kernel(reads=["candidates", "retrive_index", "retrive_next_token",
                         "retrive_next_sibling", "target_predict"],
                  writes=["predicts", "accept_index", "accept_token_num"])
def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict):
    """sgl_kernel's `verify_tree_greedy`, in torch.

    Walks each request's draft tree from the root: at each level, the first child (following
    `retrive_next_token`, then `retrive_next_sibling`) whose candidate token equals the
    target's prediction at the last accepted token is accepted. Out, in place:
    `accept_index[b, k]` the flat index (`retrive_index`) of the k-th accepted token (k = 0 the
    root), `accept_token_num[b]` how many draft tokens were accepted, and `predicts` at every
    accepted token's flat index the target's prediction there (the next token after it)."""
    import torch
    bsz, n = candidates.shape[0], candidates.shape[1]
    steps = accept_index.shape[1]
    index = retrive_index.reshape(bsz, n).long()
    next_token = retrive_next_token.reshape(bsz, n).long()
    next_sibling = retrive_next_sibling.reshape(bsz, n).long()
    cand = candidates.reshape(bsz, n).long()
    target = target_predict.reshape(-1).long()
    flat_predicts = predicts.view(-1)

    last = index[:, 0].clone()
    accepted = index.new_zeros(bsz)
    accept_index[:, 0] = last.to(accept_index.dtype)
    cur = index.new_zeros(bsz)
    going = index.new_ones(bsz, dtype=torch.bool)
    for _ in range(1, steps):
        cur = torch.where(going, next_token.gather(1, cur.clamp(min=0).unsqueeze(1)).squeeze(1),
                          cur)
        want = target[last]
        matched = index.new_zeros(bsz, dtype=torch.bool)
        for _ in range(n):
            live = going & ~matched & (cur != -1)
            at = cur.clamp(min=0).unsqueeze(1)
            hit = live & (cand.gather(1, at).squeeze(1) == want)
            flat = index.gather(1, at).squeeze(1)
            flat_predicts.index_put_((last,), torch.where(
                hit, want, flat_predicts[last].long()).to(predicts.dtype))
            col = (accepted + 1).clamp(max=steps - 1).unsqueeze(1)
            accept_index.scatter_(1, col, torch.where(
                hit, flat, accept_index.gather(1, col).squeeze(1).long()).unsqueeze(1)
                .to(accept_index.dtype))
            accepted = accepted + hit.long()
            last = torch.where(hit, flat, last)
            matched = matched | hit
            cur = torch.where(live & ~hit,
                              next_sibling.gather(1, at).squeeze(1), cur)
        going = going & matched
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
    flat_predicts.index_put_((last,), target[last].to(predicts.dtype))

