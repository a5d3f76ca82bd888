"""The import-time shims that make sglang importable on a CPU (scenarios/sglang/imports.py): what
a stood-in name does, whom the torchvision stand-in answers, which releases get which shim, and,
where sglang is installed, that the modules the front door drives import after `install()`."""
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from racecheck.scenarios.sglang import imports

FRONT_DOOR = ("sglang.srt.managers.scheduler", "sglang.srt.model_executor.model_runner",
              "sglang.srt.speculative.eagle_worker_v2",
              "sglang.srt.layers.attention.triton_backend", "sglang.srt.models.llama",
              "sglang.srt.models.llama_eagle", "sglang.srt.managers.tp_worker")


@pytest.fixture
def finder():
    """A finder of its own on sys.meta_path (the process-wide one is left alone); the modules it
    made are dropped afterwards."""
    f = imports._Finder()
    before = set(sys.modules)
    sys.meta_path.insert(0, f)
    try:
        yield f
    finally:
        sys.meta_path.remove(f)
        for name in set(sys.modules) - before:
            if name.partition(".")[0] in ("racecheck_native_x", "vllm", "torchvision", "torchao"):
                del sys.modules[name]


def _import_from(module_name: str, statement: str) -> dict:
    """Run an import statement as code of module `module_name` (whom the finder asks about)."""
    namespace = {"__name__": module_name}
    exec(compile(statement, f"<{module_name}>", "exec"), namespace)
    return namespace


def test_a_stood_in_native_name_raises_only_when_called(finder):
    finder.native = ("racecheck_native_x",)
    ns = _import_from("sglang.srt.layers.fake",
                      "from racecheck_native_x.ops.sub import kernel, scalar_types")
    assert ns["scalar_types"].uint4b8 is not None          # import-time tables chain
    with pytest.raises(imports.NotInstalled, match=r"racecheck_native_x\.ops\.sub\.kernel"):
        ns["kernel"](1, 2)
    with pytest.raises(imports.NotInstalled, match="not installed"):
        ns["scalar_types"].uint4b8()


def test_torchao_answers_only_sglangs_own_imports(finder):
    if importlib.util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed here")
    finder.torchao = True
    with pytest.raises(ModuleNotFoundError):               # transformers' own imports: absent
        _import_from("transformers.fake", "import torchao")
    ns = _import_from("sglang.srt.layers.fake",
                      "from torchao.quantization import quantize_\n"
                      "from torchao.quantization.observer import PerRow")
    with pytest.raises(imports.NotInstalled, match="torchao"):
        ns["quantize_"]()


def test_vllm_stands_in_only_for_custom_ops(finder):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    finder.vllm = True
    ns = _import_from("sglang.srt.layers.fake", "from vllm._custom_ops import rotary_embedding")
    with pytest.raises(imports.NotInstalled):
        ns["rotary_embedding"]()
    with pytest.raises(ModuleNotFoundError):              # suppress_other_loggers' guard holds
        _import_from("sglang.srt.utils.fake", "from vllm.logger import logger")
    with pytest.raises(ImportError):
        _import_from("sglang.srt.utils.fake", "from vllm import LLM")


def test_torchvision_answers_only_sglangs_own_imports(finder):
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    finder.torchvision = True
    with pytest.raises(ModuleNotFoundError):               # anyone else: not installed
        _import_from("transformers.fake", "import torchvision")
    # a probe is not an import, even from sglang
    probe = _import_from("sglang.srt.utils.fake",
                         "import importlib.util\nspec = importlib.util.find_spec('torchvision')")
    assert probe["spec"] is None
    ns = _import_from("sglang.srt.utils.fake", "from torchvision.io import decode_jpeg")
    with pytest.raises(imports.NotInstalled, match="torchvision"):
        ns["decode_jpeg"](b"")


def test_shims_are_keyed_to_release_ranges():
    names = lambda version: {s.name for s in imports.needed(version)}   # noqa: E731
    assert "transformers.AutoImageProcessor" not in names("0.5.9")
    assert "transformers.AutoImageProcessor" in names("0.5.10.post1")
    assert "torchao" in names("0.5.8.post1") and "torchao" not in names("0.5.9")
    newest = names(imports.SUPPORTED[1])
    assert names("0.5.24.dev3") == newest                  # a newer checkout: open-ended shims
    assert {"sgl_kernel", "flash_mla", "vllm", "torchvision"} <= newest
    assert names("0.4.0") == set()                         # before the supported range
    from packaging.version import Version
    for shim in imports.SHIMS:
        assert shim.why and Version(shim.first) >= Version(imports.SUPPORTED[0])


_CHILD = r"""
import importlib, inspect, json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
from racecheck.scenarios.sglang import imports
applied = [s.name for s in imports.install()]
for name in sys.argv[1:]:
    importlib.import_module(name)
from sglang.srt.managers.scheduler import Scheduler, run_scheduler_process
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from transformers.utils import import_utils
print(json.dumps({
    "applied": applied,
    "event_loop_overlap": hasattr(Scheduler, "event_loop_overlap"),
    "transformers_sees_torchvision": bool(import_utils.is_torchvision_available()),
    "signature": str(inspect.signature(run_scheduler_process)),
}))
"""


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None
                    or importlib.util.find_spec("triton") is None,
                    reason="needs sglang and triton (scripts/setup.sh)")
def test_the_front_door_modules_import_after_install():
    """In a fresh interpreter: install() before sglang is imported, as the harness does."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, *FRONT_DOOR], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["event_loop_overlap"]
    assert not out["transformers_sees_torchvision"]
    assert "server_args" in out["signature"] and "port_args" in out["signature"]


def test_vllm_layers_hand_back_sglangs_own_classes(finder):
    """0.5.4-0.5.7 import vllm's activation classes on a CPU right after defining their own."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    finder.vllm = True
    finder.vllm_modules = ("vllm", "vllm._custom_ops", *imports._VLLM_PACKAGES,
                           *imports._VLLM_LAYERS)
    owner = type(sys)("sglang.srt.layers.activation")
    exec("class SiluAndMul: pass", vars(owner))
    sys.modules[owner.__name__], saved = owner, sys.modules.get(owner.__name__)
    try:
        exec("from vllm.model_executor.layers.activation import SiluAndMul", vars(owner))
        assert vars(owner)["SiluAndMul"].__module__ == owner.__name__
        with pytest.raises(ImportError):
            exec("from vllm.model_executor.layers.activation import GeluAndMul", vars(owner))
    finally:
        if saved is None:
            del sys.modules[owner.__name__]
        else:
            sys.modules[owner.__name__] = saved


def test_a_second_install_keeps_its_own_stand_ins_and_their_submodules():
    """An engine process forked after the parent installed the shims installs them again: the
    stand-in packages it finds in sys.modules are its own, and a submodule first imported then
    (0.5.11's HiCache imports sgl_kernel.kvcacheio only once a run makes the platform CUDA)
    is stood in too."""
    if importlib.util.find_spec("sgl_kernel") is not None:
        pytest.skip("sgl_kernel is installed here")
    code = ("import sys\n"
            "from racecheck.scenarios.sglang import imports\n"
            "imports.install(version='0.5.11')\n"
            "import sgl_kernel\n"
            "imports.install(version='0.5.11')\n"
            "ns = {'__name__': 'sglang.srt.mem_cache.fake'}\n"
            "exec('from sgl_kernel.kvcacheio import transfer_kv_per_layer', ns)\n"
            "print(type(sys.modules['sgl_kernel']).__name__, imports._FINDER.native)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "_MissingPackage" and "sgl_kernel" in out.stdout
