"""A tiny deterministic target/draft "model" with real values.

Integer hashes over token ids, positions (1-D or mrope), KV cache contents reached through
`req_to_token`, `seq_lens`, the tree mask and a per-request recurrent state (a hybrid model's
mamba state, indexed by `req_pool_indices`). Every input the engine reads changes some output,
so a stale or early read can turn into a wrong token, a different accept length or a different
draft state. All arithmetic is int64 modulo a small prime: identical on every device.

How the pieces agree (so speculative decoding accepts often and the oracle has something to see):
* the state after a token is the prompt's attention digest plus `ssm_input(token, pos)` of every
  token since; verify computes it per tree node and commits the last accepted node's state;
* the target predicts `next = (base(token, pos) + state + shift(attn)) % VOCAB`, where `shift` is
  1..3 for one attention value in five and 0 otherwise;
* the draft proposes `base(parent, pos) + draft_state + k` for its k-th candidate, tracking the
  state itself from the committed state it gets through the target's hidden states after a
  verify, or recomputes from the prompt's input embeddings after a prefill: a lost or wrong
  `mm_input_embeds` gives a wrong draft state, hence different accept lengths.
Verification is lossless: `output_ids` depend only on the target, `accept_lens` also on the draft.
"""
from __future__ import annotations

import torch

MOD = 1_000_003
VOCAB = 64
IMG_TOKEN = VOCAB - 1
IMG_LEN = 3
PROMPT_MAX_LEN = 8


def token_embedding(input_ids, positions):
    return torch.add(input_ids * 7919, positions, alpha=104729).add_(1).remainder_(MOD)


def rope_term(positions, mrope_positions=None):
    if mrope_positions is not None:
        t, h, w = mrope_positions[0], mrope_positions[1], mrope_positions[2]
        return torch.add(t * 5, h, alpha=7).add_(w, alpha=11)
    return positions * 23


def kv_value(embeds, rope):
    return torch.add(rope, embeds, alpha=3).add_(1).remainder_(MOD)


def draft_base(tokens, positions):
    """The draft's guess before `% VOCAB` (callers add their terms, then reduce)."""
    return torch.add(tokens * 31, positions, alpha=17).add_(5)


def target_next(base, state, attn):
    """One attention value in five shifts the prediction by 1..3: the draft's candidate k guesses shift k."""
    shift = (attn % 5 == 0) * (attn // 5 % 3 + 1)
    return (base + state + shift) % VOCAB


def ssm_input(tokens, positions):
    """What one token adds to the recurrent (mamba) state: the state is a running sum of these."""
    return torch.add(tokens * 13, positions).remainder_(MOD)


def draft_kv_value(tokens, positions):
    return torch.add(tokens * 131, positions, alpha=7).add_(3)


def encoder_features(image_ids, token_index):
    """The vision encoder's output for image token `token_index` of image `image_ids`."""
    return (image_ids * 7777 + token_index * 333 + 9) % MOD


# -- host-side request content (the tokenizer / processor) -----------------------------------------

def _h(*xs) -> int:
    v = 0x9E3779B1
    for x in xs:
        v = (v ^ (int(x) + 0x7F4A7C15 + (v << 6) + (v >> 2))) & 0xFFFFFFFF
    return v


def make_prompt(seed: int, rid: int, multimodal: bool):
    """(input_ids, image_id or None, image_start) for request `rid`: deterministic from the seed."""
    length = PROMPT_MAX_LEN - 4 + _h(seed, rid, 1) % 5
    ids = [_h(seed, rid, 2, j) % (VOCAB - 1) for j in range(length)]
    if multimodal and rid % 2 == 0:
        start = 1
        ids = ids[:start] + [IMG_TOKEN] * IMG_LEN + ids[start:]
        return ids, 1 + _h(seed, rid, 3) % 997, start
    return ids, None, None


def prompt_mrope_positions(length: int, image_start, image_len: int = IMG_LEN):
    """Three rows of mrope positions for a prompt and the request's mrope_position_delta.

    Text before the image counts 0, 1, ...; image tokens sit on a (t, h, w) grid two patches wide;
    text after the image continues from the grid's largest position + 1.
    """
    if image_start is None:
        rows = [list(range(length)) for _ in range(3)]
        return rows, 0
    t, h, w = [], [], []
    for j in range(image_start):
        t.append(j), h.append(j), w.append(j)
    base = image_start
    for k in range(image_len):
        t.append(base), h.append(base + k // 2), w.append(base + k % 2)
    nxt = max(t[-1], h[-1], w[-1]) + 1
    for j in range(image_start + image_len, length):
        p = nxt + (j - image_start - image_len)
        t.append(p), h.append(p), w.append(p)
    delta = (t[-1] + 1) - length
    return [t, h, w], delta


class SpecTree:
    """The draft tree's static layout ("comb"): level order, topk nodes per depth, node (d, 0) extends.

    Node 0 is the root (the bonus token); node 1 + (d-1)*topk + k is candidate k at depth d. Only
    the first `num_draft_tokens` nodes are verified.
    """

    def __init__(self, topk: int, steps: int, num_draft_tokens: int):
        self.topk, self.steps, self.ndt = topk, steps, num_draft_tokens
        n = num_draft_tokens
        depth, parent, cand = [0], [0], [0]
        for i in range(1, n):
            d, k = 1 + (i - 1) // topk, (i - 1) % topk
            depth.append(d)
            cand.append(k)
            parent.append(0 if d == 1 else 1 + (d - 2) * topk)
        self.depth, self.parent, self.cand = depth, parent, cand
        self.chain = [i for i in range(1, n) if cand[i] == 0]          # node (d, 0), d = 1..
        self.width = min(n, steps + 1)                                  # longest accepted path
        mask = [[0] * n for _ in range(n)]
        for i in range(n):
            a = i
            while True:
                mask[i][a] = 1
                if a == 0:
                    break
                a = parent[a]
        self.mask = mask
        # side[d][k-1]: node index of candidate k >= 1 at depth d + 1 (or -1 past num_draft_tokens)
        self.side = [[(1 + d * topk + k) if 1 + d * topk + k < n else -1 for k in range(1, topk)]
                     for d in range(steps)]

    def tensors(self, device):
        """Device-resident constants used by build_tree and eagle_sample."""
        t = {
            "depth": torch.tensor(self.depth, dtype=torch.int64, device=device),
            "parent": torch.tensor(self.parent, dtype=torch.int64, device=device),
            "chain": torch.tensor(self.chain or [0], dtype=torch.int64, device=device),
            "mask": torch.tensor(self.mask, dtype=torch.bool, device=device),
            "path_cols": torch.arange(self.width, dtype=torch.int64, device=device),
            "chain_path": torch.tensor([0] + self.chain + [0] * (self.width - 1 - len(self.chain)),
                                       dtype=torch.int64, device=device)[: self.width],
            "cand": torch.arange(self.topk, dtype=torch.int64, device=device),
        }
        if self.topk > 1:
            t["side"] = torch.tensor(self.side + [[-1] * (self.topk - 1)], dtype=torch.int64,
                                     device=device)
        return t


def index_put_last_wins(dst, index, values, spare: int = 0):
    """`dst[index] = values`, where of repeated indices the last row wins on every device.

    A padded graph row that points at a live request's slot writes that slot too. The CPU keeps
    the last write of a repeated index; a GPU kernel keeps an unspecified one. Sending every
    earlier duplicate to the `spare` row (the reserved slot) makes all devices agree with the CPU.
    """
    later = (index.unsqueeze(0) == index.unsqueeze(1)).triu(1).any(1)
    dst.index_put_((torch.where(later, spare, index),), values)
