"""Every place the harness touches sglang below its public constructors, with the releases each
holds for.

The front door builds sglang as its own launcher does (`ServerArgs`, `PortArgs`,
`run_scheduler_process`) and runs sglang's own event loop; what it still reaches inside sglang
is listed here and nowhere else, so an upstream rename fails with one line naming the missing
name and the supported range, and the next person knows what to look at. Each `Touch` says why
the harness needs it. `optional` touches are platform flags and names that only some releases
have: a release without them takes the branch it has.
"""
from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass

from racecheck.core.errors import UsageError

# The first release the front door runs: 0.5.8.post1-0.5.15.post1 run as shipped (eagle-v2
# graphs on and off, sglang-overlap: docs/SGLANG_RELEASES.md), as 0.5.16-0.5.23 do. Before 0.5.15
# sglang builds and verifies EAGLE's draft tree only with sgl_kernel's CUDA ops: the flavours
# bind racecheck's torch stand-ins there (tree_ops.py; NATIVE_TREE_BUILD, NATIVE_GREEDY_VERIFY
# below). Older: 0.5.4.post3 runs eagle-v2 with graphs off (the torchao shim), the rest of it and
# 0.5.5-0.5.7 were not tried, so they stay below the gate.
OLDEST = "0.5.8"
NEWEST = "0.5.23"
SUPPORTED = f"{OLDEST} to {NEWEST} and source checkouts of that line"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_key(version: str | None) -> tuple:
    """(0, 5, 13, 1) for "0.5.13.post1"; () when unknown (a checkout without metadata)."""
    if not version:
        return ()
    parts = []
    for piece in version.replace(".post", ".").replace("rc", ".").replace("+", ".").split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


class EngineMismatch(UsageError):
    """The installed sglang lacks something the front door drives (a refactor moved it)."""


def mismatch(what: str) -> EngineMismatch:
    return EngineMismatch(f"sglang {installed_version() or '(no version)'}: {what} (the "
                          f"sglang scenarios support sglang {SUPPORTED}; see docs/SGLANG.md)")


@dataclass(frozen=True)
class Touch:
    """`module:attr.path` inside sglang, and why the harness needs it."""

    target: str
    why: str
    optional: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attr(self) -> str:
        return self.target.partition(":")[2]

    def owner_and_name(self):
        """(object holding the last name, last name), or raise the one-line mismatch."""
        try:
            obj = importlib.import_module(self.module)
        except ImportError as exc:
            raise mismatch(f"cannot import {self.module} ({exc})") from None
        parts = self.attr.split(".")
        for i, part in enumerate(parts[:-1]):
            if not hasattr(obj, part):
                raise mismatch(f"{self.module} has no {'.'.join(parts[:i + 1])!r}")
            obj = getattr(obj, part)
        return obj, parts[-1]

    def exists(self) -> bool:
        try:
            owner, name = self.owner_and_name()
        except EngineMismatch:
            return False
        return hasattr(owner, name)

    def get(self):
        owner, name = self.owner_and_name()
        if not hasattr(owner, name):
            raise mismatch(f"{self.module} has no {self.attr!r}")
        return getattr(owner, name)


SCHEDULER = "sglang.srt.managers.scheduler"

# The process entry and the two seams of the request path.
ENTRY = Touch(f"{SCHEDULER}:run_scheduler_process",
              "sglang's per-rank process entry: publish the configuration, build Scheduler, run "
              "its event loop")
FEED = Touch(f"{SCHEDULER}:Scheduler.process_input_requests",
             "where the event loop hands the requests it received to the scheduler, in every "
             "release: the feeder adds the schedule's arrivals there (the inbox is a ZMQ socket "
             "no tokenizer writes to) and ends the loop once every request finished")
GRACEFUL_EXIT = Touch(f"{SCHEDULER}:Scheduler.gracefully_exit",
                      "the loop's own exit flag (a ShutdownReq sets it; an instance attribute, "
                      "looked up on the scheduler: a release without it is stopped by an "
                      "exception the loop does not catch)", optional=True)
PARENT = Touch(f"{SCHEDULER}:psutil",
               "run_scheduler_process signals its parent process (SIGQUIT) when the scheduler "
               "raises: in this process the parent is the user's shell")
REQUEST = Touch("sglang.srt.managers.io_struct:TokenizedGenerateReqInput",
                "what the tokenizer sends the scheduler")
SAMPLING = Touch("sglang.srt.sampling.sampling_params:SamplingParams", "a request's sampling")
RECV = Touch("sglang.srt.managers.io_struct:sock_recv",
             "decodes the scheduler's output messages (pickled before it)", optional=True)
RUN_BATCH = Touch(f"{SCHEDULER}:Scheduler.run_batch",
                  "forward_delay_us holds the forward stream back before each batch launches")
PUBLISH = Touch("sglang.srt.managers.overlap_utils:FutureMap.publish",
                "publish_delay_us holds the forward stream right after the forward records "
                "publish_ready (0.5.13 on: #25879/#26380)", optional=True)

SPEC_V2_SWITCH = Touch("sglang.srt.environ:envs.SGLANG_ENABLE_SPEC_V2",
                       "before 0.5.14: EAGLEWorkerV2 (spec v2, the overlap plan streams) is "
                       "behind sglang's own switch, off by default up to 0.5.10 and on in "
                       "0.5.11-0.5.13: an EAGLE run sets it (a configuration sglang ships); "
                       "0.5.14 on, spec v2 is always on and the name is gone", optional=True)

# Naming: streams by the attribute sglang keeps them in (cosmetic: a missing one stays unnamed).
STREAMS = (
    ("schedule_stream", ("schedule_stream",)),
    ("forward_stream", ("forward_stream",)),
    ("copy_stream", ("copy_stream",)),
    ("plan_stream(target)", ("draft_worker.plan_stream", "model_worker.plan_stream")),
    ("plan_stream(draft)", ("draft_worker.draft_worker.plan_stream",
                            "model_worker.draft_worker.plan_stream")),
)

# Naming: tensors several sglang objects hold, under their owner's name (cosmetic: a tensor a
# release does not have keeps the holder-derived name racecheck gives it).
TENSORS = (
    ("ReqToTokenPool.req_to_token", "req_to_token_pool.req_to_token"),
)

# The KV oracle (oracles.py), read after the loop ended: the target model's KV pool through the
# scheduler's allocator (`token_to_kv_pool_allocator.get_kvcache()`, every release), and the
# pool's per-layer key and value buffers (MHATokenToKVPool; a release or model without them
# reports no KV field).
KV_POOL = ("token_to_kv_pool_allocator", "get_kvcache")
KV_BUFFERS = ("k_buffer", "v_buffer")

# sglang-hicache's KV oracle (oracles.kv_tiers), read after the loop ended: the radix tree
# (`tree_cache.root_node`, its nodes' `children` and `key`), each node's device slots and host
# indices (`value`, `host_value`; from 0.5.22 on the tree's nodes keep them per cache component,
# `component_data[ComponentType.FULL]`), and the host pool of the cache controller
# (`cache_controller.mem_pool_host`; from 0.5.22 a group whose anchor entry holds the KV pool),
# whose `kv_buffer` is laid out by its `layout`.
TREE_ROOT = ("tree_cache", "root_node")
HOST_POOL = ("tree_cache", "cache_controller", "mem_pool_host")
HOST_POOL_IN_GROUP = ("anchor_entry", "host_pool")
NODE_FULL_COMPONENT = "component_data"
HOST_KV_BUFFER = "kv_buffer"
# Nodes whose copy is still in flight as sglang sees it (not acknowledged): the tree's maps of
# ongoing transfers (their values hold the nodes), and from 0.5.22 also marks on the node itself.
TREE_PENDING_MAPS = ("ongoing_write_through", "ongoing_load_back", "ongoing_backup")
NODE_PENDING_MARKS = ("write_through_pending_id", "load_back_pending_id")

# sglang-hicache (hicache.py): the host KV pool module whose kvcacheio calls the stand-ins
# replace: mem_cache/pool_host/mha.py from 0.5.16, mem_cache/memory_pool_host.py before (the
# first that exists; a release with neither is refused in one line).
HICACHE_HOST_POOLS = (
    Touch("sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost",
          "sglang-hicache: the host KV pool (0.5.16 on)", optional=True),
    Touch("sglang.srt.mem_cache.memory_pool_host:MHATokenToKVPoolHost",
          "sglang-hicache: the host KV pool (before 0.5.16)", optional=True),
)

# CUDA-graph inputs: sglang's own padding declarations (0.5.13 and later).
REGISTRY = "sglang.srt.model_executor.cuda_graph_buffer_registry"
REGISTER_SLOT = Touch(f"{REGISTRY}:CudaGraphBufferRegistry.register_slot",
                      "names each graph input buffer after its slot and reads the slot's "
                      "PaddingPolicy (what sglang declares about its padded rows)", optional=True)
RESET_PADDING = Touch(f"{REGISTRY}:GraphSlot.reset_padding",
                      "each slot's padding write is a synchronization site "
                      "(`fill_from:padding(<slot>)#0`) that mutation analysis can drop",
                      optional=True)
PADDING_POLICY = Touch(f"{REGISTRY}:PaddingPolicy", "the padding policies", optional=True)
INDEX_SEMANTIC = Touch("sglang.srt.model_executor.input_buffers:INDEX_SEMANTIC_BUFFERS",
                       "inputs whose values index memory: stale padding there is never "
                       "tolerated", optional=True)

# Platform flags sglang computes once at import (`_is_cuda = is_cuda()`): a flavour sets the
# ones the installed release has (module -> flags), for the speculative decode path.
PLATFORM_FLAGS = {
    "cuda": {
        "sglang.srt.speculative.eagle_worker_v2": ("_is_cuda",),
        "sglang.srt.speculative.eagle_utils": ("_is_cuda",),
        "sglang.srt.speculative.spec_utils": ("_is_cuda",),
        "sglang.srt.managers.overlap_utils": ("_is_cuda",),
        "sglang.kernels.ops.speculative.cache_locs": ("_is_cuda",),
        "sglang.srt.mem_cache.allocation": ("_is_cuda",),
        # the same before 0.5.16 moved them: verify's cache locations in eagle_info_v2
        # (before 0.5.14), then triton_ops/cache_locs (0.5.13-0.5.15); allocation in
        # mem_cache/common (0.5.15)
        "sglang.srt.speculative.eagle_info_v2": ("_is_cuda",),
        "sglang.srt.speculative.triton_ops.cache_locs": ("_is_cuda",),
        "sglang.srt.mem_cache.common": ("_is_cuda",),
    },
    "hip": {
        "sglang.srt.speculative.eagle_worker_v2": ("_is_hip",),
        "sglang.srt.speculative.eagle_utils": ("_is_hip",),
        "sglang.srt.speculative.spec_utils": ("_is_hip",),
        "sglang.srt.managers.overlap_utils": ("_is_hip",),
        "sglang.srt.managers.scheduler": ("_is_hip",),
        "sglang.srt.model_executor.forward_batch_info": ("_is_hip",),
        "sglang.kernels.ops.speculative.cache_locs": ("_is_hip",),
        "sglang.srt.mem_cache.allocation": ("_is_hip",),
        "sglang.srt.speculative.eagle_info_v2": ("_is_hip",),
        "sglang.srt.speculative.triton_ops.cache_locs": ("_is_hip",),
        "sglang.srt.mem_cache.common": ("_is_hip",),
    },
    "npu": {
        "sglang.srt.speculative.eagle_worker_common": ("_is_npu",),
        # Kernel choice only: where sglang calls an Ascend op (`torch.ops.npu.cache_loc_update`
        # for the verify's cache locations), its Triton kernel with the same inputs and outputs
        # runs. Without it, a release that computes them here (before 0.5.22, which prepares them
        # with the draft) falls through every platform branch and verifies with no cache
        # locations. In these modules `_is_cuda` picks that kernel and nothing else (read in
        # 0.5.8.post1, 0.5.12.post1, 0.5.13.post1, 0.5.15.post1, 0.5.21 and 0.5.23).
        "sglang.kernels.ops.speculative.cache_locs": ("_is_cuda",),
        "sglang.srt.speculative.triton_ops.cache_locs": ("_is_cuda",),
        "sglang.srt.speculative.eagle_info_v2": ("_is_cuda",),
    },
}
# Platform probes called at run time, per flavour. On a GPU the process group's device is the
# GPU (`GroupCoordinator.device`, through `is_cuda_alike()`), so graph capture's private stream
# is a device stream; on a CPU runner it would be a CPU stream that no device work can be on.
_CUDA_ALIKE = {"sglang.srt.distributed.parallel_state": ("is_cuda_alike",)}
PLATFORM_CALLS = {
    "cuda": dict(_CUDA_ALIKE),
    "hip": {"sglang.srt.model_executor.forward_batch_info": ("is_hip",), **_CUDA_ALIKE},
    "npu": {"sglang.srt.speculative.eagle_worker_common": ("is_npu",),
            "sglang.srt.model_executor.input_buffers": ("is_npu",)},
}
# Flags the flavour sets only with graphs off. On npu, 0.5.12 to 0.5.15 gate the verify's mrope
# recompute after the plan-stream join (#23423) on eagle_worker_v2's own `_is_npu`; the same flag
# picks the Ascend graph runners there and in every later release (NPUGraphRunner, the draft-extend
# capture), which need Ascend's graph API, so with graphs on the flavour leaves it unset.
PLATFORM_FLAGS_EAGER = {
    "npu": {"sglang.srt.speculative.eagle_worker_v2": ("_is_npu",)},
}
# A probe a function imports when it runs (`from sglang.srt.utils.common import is_npu` inside
# it), where no module binds a flag the flavour could set: on npu it answers True while that
# function runs, and only where the function's own code imports it.
NPU_CALL_TIME_PROBES = (
    Touch("sglang.srt.speculative.base_spec_worker:EagleDraftWorkerBase.prepare_for_draft_extend",
          "0.5.14-0.5.15: Ascend defers the draft extend's attention metadata to the forward "
          "stream (not marked ready without graphs), asking is_npu() through an import inside "
          "the function; from 0.5.16 eagle_worker_common binds _is_npu", optional=True),
)
CALL_TIME_PROBE_MODULE = "sglang.srt.utils.common"
# sglang's tree build and greedy verify exist as CUDA C++ and as Triton kernels (taken on XPU):
# every flavour takes the Triton ones here (same inputs, same outputs).
TRITON_TREE = (Touch("sglang.kernels.ops.speculative.spec_tree:_is_xpu",
                     "tree build in Triton (0.5.23)", optional=True),
               Touch("sglang.srt.speculative.eagle_utils:_is_xpu",
                     "tree build in Triton (before 0.5.23)", optional=True))
# Releases before sglang shipped those Triton kernels (0.5.8-0.5.14; 0.5.15 has them in
# eagle_utils) call sgl_kernel's CUDA ops only: the flavours put racecheck's torch stand-ins
# (tree_ops.py, declared kernels) under the names sglang calls, for those releases only.
NATIVE_TREE_BUILD = Touch("sglang.srt.speculative.eagle_utils:build_tree_kernel_efficient",
                          "0.5.8-0.5.14: calls sgl_kernel's build_tree_kernel_efficient through "
                          "the module name sgl_build_tree_kernel_efficient (bound at import on "
                          "CUDA/HIP only): tree_ops' stand-in is bound there", optional=True)
NATIVE_GREEDY_VERIFY = Touch("sglang.srt.speculative.eagle_utils:verify_tree_greedy_func",
                             "0.5.8-0.5.14: imports sgl_kernel's verify_tree_greedy when it is "
                             "called on CUDA/HIP: tree_ops' stand-in is that name",
                             optional=True)
# On the npu flavour those releases' greedy verify takes its CUDA branch (the stand-in above)
# where Ascend calls sgl_kernel_npu's op: `_is_cuda` there picks that op and sgl_kernel's tree
# build and nothing else (read in 0.5.8.post1, 0.5.12.post1, 0.5.13.post1).
NPU_GREEDY_VERIFY_BRANCH = Touch("sglang.srt.speculative.eagle_utils:_is_cuda",
                                 "0.5.8-0.5.14 on the npu flavour: the greedy verify's CUDA branch, "
                                 "with the stand-in, for Ascend's own op", optional=True)
VERIFY_GREEDY_TRITON = Touch("sglang.srt.speculative.eagle_utils:verify_tree_greedy_triton",
                             "greedy verify in Triton, for releases whose CUDA branch calls the "
                             "C++ op", optional=True)
CAPABILITIES = Touch("sglang.srt.platforms:current_platform.capabilities",
                     "a CUDA-like platform's capabilities (Triton, graph capture)",
                     optional=True)
CAPABILITIES_TYPE = Touch("sglang.srt.platforms.interface:PlatformCapabilities",
                          "the capabilities record", optional=True)

ALL = [v for v in list(globals().values()) if isinstance(v, Touch)] + list(TRITON_TREE) + \
    list(NPU_CALL_TIME_PROBES)


def check_release() -> None:
    """One line (exit 2) for an sglang that is missing or older than OLDEST; a source checkout
    without a version is taken as the newest."""
    version = installed_version()
    if version is None:
        raise UsageError("the sglang scenarios need sglang installed: see docs/SGLANG.md")
    if release_key(version) < release_key(OLDEST):
        raise mismatch(f"older than {OLDEST}, the first release the front door runs")


def missing() -> list:
    """The required touches the installed sglang lacks (empty when it is supported)."""
    return [t.target for t in ALL if not t.optional and not t.exists()]
