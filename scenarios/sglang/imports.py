"""sglang made importable on a CPU-only runner, for every release in `SUPPORTED`, before it is
imported: `install()` does it, once per process, and nothing else in racecheck does.

sglang is written for GPU servers, and each release imports some GPU-only or GPU-wheel-bound
package unguarded somewhere on the scheduler's import path. Each `Shim` below names one such
package (or one sglang module, or one transformers registry), the releases that need it and why;
`install()` applies the shims whose range holds the installed release (a source checkout newer
than the newest release tested counts as that release: open-ended ranges). A stood-in name never
computes anything: calling it raises `NotInstalled`, naming what is missing, so a path the
scenario does not support fails on its first call instead of at import.

Setting `TRITON_INTERPRET=1` (Triton kernels in the CPU interpreter) is the caller's: triton
decides at decoration time, so it must be set before sglang is imported, like `install()`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types

SUPPORTED = ("0.5.4", "0.5.23")      # oldest and newest release imported with these shims
NATIVE = ("sgl_kernel", "flash_mla")  # native kernel packages stood in where not installed


class NotInstalled(RuntimeError):
    """A stood-in name was called: the package behind it is not installed on this runner."""


class _Missing:
    """A name from a package that is not installed: attributes chain (import-time tables like
    `scalar_types.uint4b8`, `InterpolationMode.BICUBIC`), a call says what is missing."""

    def __init__(self, path: str, why: str):
        self._path = path
        self._why = why

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}", self._why)

    def __call__(self, *args, **kwargs):
        raise NotInstalled(f"{self._path} was called, but {self._why}; racecheck's sglang "
                           "scenarios do not support the path that calls it")

    def __repr__(self):
        return f"<not installed: {self._path}>"


class _MissingPackage(types.ModuleType):
    """A package that is not installed: every attribute is a `_Missing` name, every submodule
    another `_MissingPackage` (sglang does `from sgl_kernel.flash_attn import ...`)."""

    __version__ = "0"

    def __init__(self, name: str, why: str):
        super().__init__(name)
        self._why = why

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _Missing(f"{self.__name__}.{name}", self._why)
        setattr(self, name, value)
        return value


class _StandIn(types.ModuleType):
    """An sglang module the decode path imports but never uses: classes are inert classes (config
    classes get registered by model type), functions return None."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__module__": self.__name__,
                                "model_type": f"racecheck-stand-in-{name}"}) \
            if name[:1].isupper() else (lambda *a, **k: None)
        setattr(self, name, value)
        return value


@dataclasses.dataclass(frozen=True)
class Shim:
    """One import-time stand-in, the releases that need it (`last` None: still needed by the
    newest release tested, so a newer checkout gets it too) and why."""

    name: str
    first: str
    last: str | None
    why: str

    def holds(self, version) -> bool:
        from packaging.version import Version
        v = Version(version.base_version) if version is not None else None
        if v is None:                     # no version metadata (a checkout on the path): newest
            return self.last is None
        return Version(self.first) <= v and (self.last is None or v <= Version(self.last))


_SGLANG_IMPORTER = "sglang"
_IMPORT_MACHINERY = {"importlib", "importlib._bootstrap", "importlib._bootstrap_external",
                     "_frozen_importlib", "_frozen_importlib_external", __name__}

# module name (or top-level package) -> the shim that stands it in
SHIMS = (
    Shim("sgl_kernel", "0.5.4", None,
         "sglang's native CUDA kernels (the sgl-kernel / sglang-kernel wheels are CUDA-only); "
         "mem_cache/memory_pool_host.py imports sgl_kernel.kvcacheio at module top unless the "
         "platform is NPU/XPU(/MPS) in 0.5.4-0.5.12, i.e. on a CPU too; from 0.5.13 only on "
         "CUDA/HIP, which a routed run can make true"),
    Shim("flash_mla", "0.5.4", None,
         "FlashMLA's CUDA kernels; attention/flashmla_backend.py imports it unguarded, and the "
         "EAGLE v2 worker imports that backend when it captures graphs"),
    Shim("vllm", "0.5.4", None,
         "only `vllm` and `vllm._custom_ops`: the rotary embedding imports "
         "`vllm._custom_ops` when its platform is neither CUDA nor CPU (a routed sim run); "
         "the rest of vllm stays missing, because sglang's suppress_other_loggers (and other "
         "guarded imports) must keep seeing vllm's submodules as absent"),
    Shim("vllm.model_executor.layers", "0.5.4", "0.5.7",
         "layers/activation.py and layers/layernorm.py import vllm's SiluAndMul/GeluAndMul, "
         "RMSNorm/GemmaRMSNorm at module top on a CPU without AMX (no CUDA/NPU/HIP/XPU); the "
         "stand-ins hand back the classes those sglang modules define just above the import, "
         "so the import rebinds each name to itself"),
    Shim("torchvision", "0.5.4", None,
         "torchvision's PyPI wheel does not load next to a CPU torch; srt/utils/common.py "
         "imports torchvision.io at module top (0.5.10-0.5.20; lazily from 0.5.21) and the "
         "multimodal processors import it everywhere. Visible only to sglang's own import "
         "statements: transformers' probes must keep seeing it as not installed"),
    Shim("torchao", "0.5.4", "0.5.8",
         "torchao (quantization; filtered out by the setup as a GPU-bound torch companion): "
         "ModelRunner.initialize calls layers/torchao_utils.apply_torchao_config_to_model, "
         "which imports torchao.quantization before it looks at the (empty) torchao config. "
         "Visible only to sglang's own import statements, as torchvision is"),
    Shim("sglang.srt.multimodal.internvl_utils", "0.5.4", None,
         "builds torchvision transforms at import (decode never calls it)"),
    Shim("sglang.srt.configs.deepseek_ocr", "0.5.4", None,
         "builds torchvision transforms at import (decode never calls it)"),
    Shim("transformers.AutoImageProcessor", "0.5.10", None,
         "the transformers 5.x these releases pin marks AutoImageProcessor (and its module) as "
         "needing torchvision in its lazy import table, though the class needs only PIL; "
         "sglang's configs/utils.py registers image processors with it at import. The mark is "
         "lifted for that class alone (transformers still reports torchvision as absent)"),
    Shim("transformers.register", "0.5.4", None,
         "sglang registers its own configs (qwen3_asr, ...) with transformers' AutoConfig; "
         "a transformers newer than the release's pin ships the same model type and "
         "refuses (\"'qwen3_asr' is already used\", 0.5.19-0.5.20 next to transformers 5.24): "
         "registrations made by sglang's modules pass exist_ok=True, sglang's class wins as it "
         "did with the pinned transformers"),
)


def installed_version():
    """The installed sglang's version (a packaging Version), or None (no metadata)."""
    from packaging.version import Version
    try:
        return Version(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _from_sglang(frame) -> bool:
    """Whether the import in progress is an import statement (or import_module) in one of
    sglang's own modules; probes (importlib.util.find_spec) are not imports."""
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if name == "importlib.util":
            return False
        if name in _IMPORT_MACHINERY:
            frame = frame.f_back
            continue
        return name == _SGLANG_IMPORTER or name.startswith(_SGLANG_IMPORTER + ".")
    return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers only the names its shims stand in for (see `SHIMS`)."""

    def __init__(self):
        self.native: tuple = ()        # top-level packages stood in as `_MissingPackage`
        self.modules: tuple = ()       # sglang modules stood in as `_StandIn`
        self.vllm = False
        self.vllm_modules: tuple = ("vllm", "vllm._custom_ops")
        self.torchvision = False
        self.torchao = False

    def _kind(self, fullname: str):
        top = fullname.partition(".")[0]
        if top in self.native:
            return "native"
        if fullname in self.modules:
            return "module"
        if self.vllm and fullname in self.vllm_modules:
            return "vllm"
        if self.torchvision and top == "torchvision" and _from_sglang(sys._getframe(2)):
            return "torchvision"
        if self.torchao and top == "torchao" and _from_sglang(sys._getframe(2)):
            return "torchao"
        return None

    def find_spec(self, fullname, path, target=None):
        kind = self._kind(fullname)
        if kind is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self)
        if kind != "module":
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        name = spec.name
        top = name.partition(".")[0]
        if top in self.native:
            return _MissingPackage(name, f"{top} (a native CUDA kernel package) is not installed")
        if name in self.modules:
            return _StandIn(name)
        if name in self.vllm_modules[:1] + _VLLM_PACKAGES:
            return types.ModuleType(name)   # a package whose other submodules stay missing
        if name in _VLLM_LAYERS:
            return _SglangLayers(name)
        if name == "vllm._custom_ops":
            return _MissingPackage(name, "vllm (CUDA kernels) is not installed")
        if top == "torchao":
            return _MissingPackage(name, "torchao is not installed (a GPU-bound torch companion)")
        return _MissingPackage(name, "torchvision is not installed (its PyPI wheel does not "
                                     "load next to a CPU torch)")

    def exec_module(self, module):
        pass


_VLLM_LAYERS = {"vllm.model_executor.layers.activation": "sglang.srt.layers.activation",
                "vllm.model_executor.layers.layernorm": "sglang.srt.layers.layernorm"}
_VLLM_PACKAGES = ("vllm.model_executor", "vllm.model_executor.layers")


class _SglangLayers(types.ModuleType):
    """A vllm layers module as sglang 0.5.4-0.5.7 import it on a CPU: each name is the class the
    importing sglang module (`_VLLM_LAYERS`) defines itself."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        owner = sys.modules.get(_VLLM_LAYERS[self.__name__])
        if owner is None or name not in vars(owner):
            raise AttributeError(f"{self.__name__}.{name} is stood in only for the names "
                                 f"{_VLLM_LAYERS[self.__name__]} defines itself")
        return vars(owner)[name]


_FINDER = _Finder()


def _transformers_sees_no_torchvision(probes=("is_torchvision_available",
                                              "is_torchvision_v2_available")):
    """Run transformers' cached torchvision (or torchao) probes now, while the package is absent,
    so the stand-in (once in sys.modules) cannot change their answer."""
    try:
        from transformers.utils import import_utils
    except ImportError:
        return
    for probe in probes:
        fn = getattr(import_utils, probe, None)
        if callable(fn):
            fn()


_IMAGE_PROCESSOR = {"transformers": ("AutoImageProcessor", "models.auto.image_processing_auto"),
                    "transformers.models.auto": ("AutoImageProcessor", "image_processing_auto")}


def _lift_torchvision_mark(module):
    table = getattr(module, "_object_missing_backend", None)
    if isinstance(table, dict):
        for name in _IMAGE_PROCESSOR.get(getattr(module, "__name__", None), ()):
            if list(table.get(name, ())) == ["torchvision"]:
                del table[name]


def _image_processor_without_torchvision():
    """Lift the torchvision mark from AutoImageProcessor in transformers' lazy import tables, now
    and in every table made later (processing_utils re-executes transformers/__init__.py through
    `direct_transformers_import`, which makes a fresh top-level lazy module)."""
    try:
        import transformers
        import transformers.models.auto as auto
        from transformers.utils.import_utils import _LazyModule
    except ImportError:
        return
    if not getattr(_LazyModule.__init__, "_racecheck_lift", False):
        init = _LazyModule.__init__

        def __init__(self, name, *args, **kwargs):
            init(self, name, *args, **kwargs)
            _lift_torchvision_mark(self)
        __init__._racecheck_lift = True
        functools.update_wrapper(__init__, init)
        _LazyModule.__init__ = __init__
    for module in (transformers, auto):
        _lift_torchvision_mark(module)


def _register_from_sglang_exist_ok():
    """transformers' AutoConfig.register, called from an sglang module, with exist_ok=True
    (sglang's other registrations pass exist_ok=True themselves)."""
    import inspect
    try:
        from transformers.models.auto.configuration_auto import AutoConfig
    except ImportError:
        return
    owners = [AutoConfig]
    for owner in owners:
        register = getattr(owner, "register", None) if owner is not None else None
        if register is None or getattr(register, "_racecheck_exist_ok", False):
            continue
        try:
            if "exist_ok" not in inspect.signature(register).parameters:
                continue
        except (TypeError, ValueError):
            continue

        def wrapper(*args, _register=register, **kwargs):
            if _from_sglang(sys._getframe(1)):
                kwargs.setdefault("exist_ok", True)
            return _register(*args, **kwargs)
        functools.update_wrapper(wrapper, register)
        wrapper._racecheck_exist_ok = True
        setattr(owner, "register", staticmethod(wrapper))


def needed(version=None) -> tuple:
    """The shims the release `version` (default: the installed one) needs."""
    if version is None:
        version = installed_version()
    elif isinstance(version, str):
        from packaging.version import Version
        version = Version(version)
    return tuple(shim for shim in SHIMS if shim.holds(version))


def _to_stand_in(name: str) -> bool:
    """Not installed, or already stood in by an earlier install() (a forked engine process finds
    its parent's stand-ins in sys.modules: they stay stood in, with their submodules)."""
    if isinstance(sys.modules.get(name), _MissingPackage):
        return True
    return name not in sys.modules and importlib.util.find_spec(name) is None


def install(native: tuple = NATIVE, version=None) -> tuple:
    """Make the installed sglang importable here (see the module docstring); idempotent.
    `native`: kernel packages to stand in where they are not installed (a GPU runner with
    sgl_kernel keeps its own). Returns the shims applied."""
    if _FINDER in sys.meta_path:            # find_spec below must not see our own answers
        sys.meta_path.remove(_FINDER)
    shims = needed(version)
    names = {shim.name for shim in shims}
    _FINDER.native = tuple(n for n in native if n in names and _to_stand_in(n))
    _FINDER.modules = tuple(n for n in names if n.startswith("sglang."))
    _FINDER.vllm = "vllm" in names and importlib.util.find_spec("vllm") is None
    _FINDER.vllm_modules = ("vllm", "vllm._custom_ops") + (
        _VLLM_PACKAGES + tuple(_VLLM_LAYERS) if "vllm.model_executor.layers" in names else ())
    _FINDER.torchvision = "torchvision" in names and _to_stand_in("torchvision")
    _FINDER.torchao = "torchao" in names and _to_stand_in("torchao")
    if _FINDER.torchvision:
        _transformers_sees_no_torchvision()
    if _FINDER.torchao:
        _transformers_sees_no_torchvision(("is_torchao_available",))
    if "transformers.AutoImageProcessor" in names:
        _image_processor_without_torchvision()
    if "transformers.register" in names:
        _register_from_sglang_exist_ok()
    sys.meta_path.insert(0, _FINDER)
    return shims
