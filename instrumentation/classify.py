"""Which tensor arguments of an op are read, written, or only used for metadata.

Decided once per op overload from its schema's alias annotations and cached:
`Tensor(a!)` arguments and fresh outputs are writes; view arguments/outputs (`Tensor(a)`) and
the `self` of `*_like` / `new_*` factories are metadata only; everything else is read.
"""
from __future__ import annotations

import torch

READ, WRITE, META, READ_WRITE = 0, 1, 2, 3

# In-place ops that overwrite their `self` without reading it (everything else in place, like
# `add_`, reads the old value too: a race against an earlier unordered write is then RC001).
PURE_WRITES = {
    "fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "index_put_", "_index_put_impl_", "index_copy_",
    "index_fill_", "scatter_", "masked_fill_", "masked_scatter_", "set_", "resize_",
    "fill_diagonal_", "_copy_from", "_copy_from_and_resize",
    # the list forms (sglang's graph input registry fills its slots with one grouped copy)
    "_foreach_copy_", "_foreach_zero_",
}

# Ops whose footprint on `self` (or the written argument) depends on index values.
# value: (dim argument name or None for advanced indexing, index argument name, role of self)
INDEX_OPS = {
    # reads of only the indexed elements of `self`
    "index": (None, "indices", READ),
    "_unsafe_index": (None, "indices", READ),
    "index_select": ("dim", "index", READ),
    "gather": ("dim", "index", READ),
    # in-place writes of only the indexed elements of `self` (out-of-place variants copy all of it)
    "index_put_": (None, "indices", WRITE),
    "_index_put_impl_": (None, "indices", WRITE),
    "scatter_": ("dim", "index", WRITE),
    "scatter_add_": ("dim", "index", READ_WRITE),
    "scatter_reduce_": ("dim", "index", READ_WRITE),
    "index_copy_": ("dim", "index", WRITE),
    "index_add_": ("dim", "index", READ_WRITE),
    "index_fill_": ("dim", "index", WRITE),
}

# Ops that read one tensor argument's values as indices into another: (index argument, indexed
# argument). The index read is marked with the indexed storage (an index role, for RC006).
INDEX_ROLES = {name: (spec[1], "self") for name, spec in INDEX_OPS.items()}
INDEX_ROLES.update({
    "embedding": ("indices", "weight"),
    "take": ("index", "self"),
    "index_add": ("index", "self"),
    "index_copy": ("index", "self"),
    "scatter": ("index", "self"),
    "scatter_add": ("index", "self"),
})

# Ops that are not device work at all (metadata queries, lifetime bookkeeping).
NO_ACCESS = {
    "is_pinned", "_pin_memory", "pin_memory", "record_stream", "detach", "lift_fresh",
    "_to_copy_noop", "size", "stride", "storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_nested_tensor_size",
    "alias", "equal_noop",
}

# In-place changes of a tensor's metadata (shape, strides, storage): no data access, but the
# tensor's cached footprint is stale afterwards.
METADATA_INPLACE = {
    "t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_",
    "detach_", "resize_", "resize_as_", "set_", "_resize_output_", "resize_as_sparse_",
}

# Output shape depends on tensor values: the host must wait for the stream (as CUDA does).
DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
                  "unique_consecutive", "nonzero_static_sync", "repeat_interleave"}


def _is_tensor_type(t) -> bool:
    s = str(t)
    return s.startswith("Tensor") or s.startswith("Optional[Tensor]") or s in (
        "List[Tensor]", "List[Optional[Tensor]]")


class OpClass:
    """Per-overload classification, computed once."""

    __slots__ = ("name", "args", "out_roles", "index", "index_role", "no_access", "is_view",
                 "is_copy", "is_scalar_read", "data_dependent", "factory_meta_self",
                 "metadata_inplace", "has_pin_memory", "has_device", "plain_args", "arg_names")

    def __init__(self, func):
        schema = func._schema
        self.name = name = schema.name.split("::")[-1]
        self.factory_meta_self = name.startswith("new_") or name.endswith("_like")
        args = []
        plain = True
        for i, a in enumerate(schema.arguments):
            if not _is_tensor_type(a.type):
                continue
            if a.kwarg_only or str(a.type).startswith("List"):
                plain = False
            ai = a.alias_info
            if ai is not None and ai.is_write:
                # `out=` arguments and pure overwrites only write; other in-place ops read first
                role = WRITE if (a.kwarg_only or a.name == "out" or name in PURE_WRITES
                                 or not name.endswith("_")) else READ_WRITE
            elif ai is not None:
                role = META
            elif self.factory_meta_self and i == 0:
                role = META
            else:
                role = READ
            args.append((i, a.name, a.kwarg_only, role))
        self.args = tuple(args)
        outs = []
        for r in schema.returns:
            ai = r.alias_info
            outs.append(META if ai is not None else WRITE)
        self.out_roles = tuple(outs)
        self.is_view = bool(outs) and all(o == META for o in outs) and not any(
            role in (WRITE, READ_WRITE) for _, _, _, role in args)
        self.index = INDEX_OPS.get(name)
        role = INDEX_ROLES.get(name)
        self.index_role = role if role is not None and {role[0], role[1]} <= {
            a.name for a in schema.arguments} else None
        self.no_access = name in NO_ACCESS
        self.metadata_inplace = name in METADATA_INPLACE
        self.has_pin_memory = any(a.name == "pin_memory" for a in schema.arguments)
        self.has_device = any(a.name == "device" for a in schema.arguments)
        self.is_copy = name == "copy_"
        self.is_scalar_read = name == "_local_scalar_dense"
        self.data_dependent = name in DATA_DEPENDENT
        # Positional single-tensor arguments, none metadata-only, not an index op: the
        # interceptor's fast plan unpacks these as (position, role) without the generic loop.
        self.plain_args = tuple((i, role) for i, _, _, role in args) if (
            plain and self.index is None and self.index_role is None
            and all(role != META for *_, role in args)) else None
        self.arg_names = frozenset(a[1] for a in args)


_cache: dict = {}


def classify(func) -> OpClass:
    oc = _cache.get(func)
    if oc is None:
        oc = _cache[func] = OpClass(func)
    return oc


def iter_out_tensors(oc: OpClass, out):
    if isinstance(out, torch.Tensor):
        if oc.out_roles and oc.out_roles[0] == WRITE:
            yield out
        return
    if isinstance(out, (list, tuple)):
        roles = oc.out_roles
        for k, x in enumerate(out):
            role = roles[k] if k < len(roles) else (roles[-1] if roles else WRITE)
            if role == WRITE:
                if isinstance(x, torch.Tensor):
                    yield x
                elif isinstance(x, (list, tuple)):
                    for y in x:
                        if isinstance(y, torch.Tensor):
                            yield y
