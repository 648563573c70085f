"""kiln from Python: compile a model (kiln text, ONNX, or a torch.nn.Module) or load a
compiled .so, and run it on NumPy arrays.

    import kiln, numpy as np
    model = kiln.compile("examples/small_cnn.kiln")
    y = model(np.zeros((1, 3, 32, 32), np.float32))

The model's life (compile, load, run, params) goes through libkiln (kiln/kiln.h) by
ctypes, which releases the GIL for the length of each call; the tools that write
files or print reports (save, source, memory_report, profile, dot, opt) run the kiln
command shipped beside it, on the same model and options. docs/python.md documents
the API.
"""
import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import weakref
from collections import namedtuple
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ._version import __version__

__all__ = ["Error", "Model", "TensorInfo", "compile", "load", "opt", "save_safetensors"]

_here = Path(__file__).resolve().parent
_command = os.environ.get("KILN_COMMAND") or str(_here / "_lib" / "kiln")


class Error(Exception):
    """A kiln diagnostic: `message` is its whole text; `file`, `line` and `column`
    give the place in a model file where it names one (else None); `kind` is
    "user" (the model, a weight, an input or an option is wrong), "no memory" or
    "internal" (a bug in kiln)."""

    def __init__(self, message, kind="user"):
        super().__init__(message)
        self.message = message
        self.kind = kind
        place = re.match(r"(.+?):(\d+):(\d+): error: ", message)
        self.file = place.group(1) if place else None
        self.line = int(place.group(2)) if place else None
        self.column = int(place.group(3)) if place else None


class _KilnError(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char * 1024), ("kind", ctypes.c_int)]


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64))]


_KILN_EXT_PARAMS = 1
_KILN_EXT_SYM = 8


class _ModelDef(ctypes.Structure):
    # the part of kiln_model_def that is there in every model; the params fields
    # follow only with KILN_EXT_PARAMS (_ParamsDef)
    _fields_ = [("abi_version", ctypes.c_uint32), ("extensions", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("n_inputs", ctypes.c_int32), ("n_outputs", ctypes.c_int32),
                ("inputs", ctypes.POINTER(_TensorInfo)), ("outputs", ctypes.POINTER(_TensorInfo)),
                ("create", ctypes.c_void_p), ("run", ctypes.c_void_p), ("destroy", ctypes.c_void_p)]


class _ParamsDef(ctypes.Structure):
    _fields_ = _ModelDef._fields_ + [("n_params", ctypes.c_int32), ("params", ctypes.POINTER(_TensorInfo))]


class _SymDef(ctypes.Structure):
    # with KILN_EXT_SYM (docs/abi.md): the symbolic dim's name and bound
    _fields_ = _ParamsDef._fields_ + [("read_param", ctypes.c_void_p), ("write_param", ctypes.c_void_p),
                                      ("create_comm", ctypes.c_void_p), ("run_error", ctypes.c_void_p),
                                      ("n_sym", ctypes.c_int32), ("sym_names", ctypes.POINTER(ctypes.c_char_p)),
                                      ("sym_bounds", ctypes.POINTER(ctypes.c_int64)), ("run_sym", ctypes.c_void_p)]


class _Options(ctypes.Structure):
    _fields_ = [("target", ctypes.c_char_p), ("opt_level", ctypes.c_int),
                ("weights", ctypes.POINTER(ctypes.c_char_p)), ("n_weights", ctypes.c_int),
                ("cache_dir", ctypes.c_char_p), ("cpu", ctypes.c_char_p), ("jit", ctypes.c_char_p),
                ("cc", ctypes.c_char_p), ("cxx", ctypes.c_char_p), ("blas", ctypes.c_char_p),
                ("cuda", ctypes.c_char_p)]


def _open_library():
    lib = ctypes.CDLL(os.environ.get("KILN_LIBRARY") or str(_here / "_lib" / "libkiln.so"))
    err = ctypes.POINTER(_KilnError)
    for name, restype, argtypes in [
        ("kiln_version", ctypes.c_char_p, []),
        ("kiln_options_from_env", _Options, []),
        ("kiln_load", ctypes.c_void_p, [ctypes.c_char_p, err]),
        ("kiln_jit", ctypes.c_void_p, [ctypes.c_char_p, ctypes.POINTER(_Options), err]),
        ("kiln_jit_file", ctypes.c_void_p, [ctypes.c_char_p, ctypes.POINTER(_Options), err]),
        ("kiln_run", ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(ctypes.c_void_p), err]),
        ("kiln_run_sym", ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), err]),
        ("kiln_def", ctypes.POINTER(_ModelDef), [ctypes.c_void_p]),
        ("kiln_read_param", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, err]),
        ("kiln_write_param", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, err]),
        ("kiln_free", None, [ctypes.c_void_p]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    found = lib.kiln_version().decode()
    if found != __version__:
        raise ImportError(f"kiln {__version__} found libkiln {found} ({lib._name}); reinstall the package")
    return lib


_lib = _open_library()
_kinds = {1: "user", 2: "no memory", 3: "internal"}


def _raise(err):
    raise Error(err.message.decode(errors="replace"), _kinds.get(err.kind, "internal"))


# kiln's element types (enum kiln_dtype) and NumPy's
_dtypes = {1: np.dtype(np.float32), 2: np.dtype(np.float16), 4: np.dtype(np.int64), 5: np.dtype(np.int32),
           6: np.dtype(np.bool_)}
_safetensors_dtypes = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
                       np.dtype(np.int32): "I32", np.dtype(np.bool_): "BOOL"}

TensorInfo = namedtuple("TensorInfo", "name shape dtype")
TensorInfo.__doc__ = ("A model's input, output or param: its name, shape (a tuple; None for the model's "
                      "symbolic dim, a batch) and NumPy dtype.")


def _infos(array, n):
    infos = []
    for i in range(n):
        t = array[i]
        if t.dtype not in _dtypes:
            raise Error(f"'{t.name.decode()}' has element type {t.dtype}, which NumPy cannot hold")
        shape = tuple(t.shape[k] if t.shape[k] >= 0 else None for k in range(t.rank))
        infos.append(TensorInfo(t.name.decode(), shape, _dtypes[t.dtype]))
    return tuple(infos)


def _multiples(array, n):
    """Each tensor's multiple of the symbolic dim in its first dim (0: none)."""
    return tuple(-array[i].shape[0] if array[i].rank and array[i].shape[0] < 0 else 0 for i in range(n))


def _as_array(value, info, what):
    """value as a dense array of info's dtype and shape, without a copy where it is one."""
    if type(value) is np.ndarray:
        array = value
    elif not hasattr(value, "__array__") and hasattr(value, "__dlpack__"):
        array = np.from_dlpack(value)
    else:
        array = np.asarray(value)
    if array.dtype != info.dtype:
        raise Error(f"{what} '{info.name}' is {array.dtype}; the model takes {info.dtype}")
    if len(array.shape) != len(info.shape) or any(
            want is not None and got != want for got, want in zip(array.shape, info.shape)):
        raise Error(f"{what} '{info.name}' has shape {list(array.shape)}; the model takes {list(info.shape)}")
    if not array.flags.c_contiguous or not array.flags.aligned:
        array = np.ascontiguousarray(array)
    return array


def save_safetensors(path, tensors):
    """Writes tensors (a mapping of names to arrays) to the safetensors file path,
    whole or not at all."""
    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        array = np.ascontiguousarray(value)
        if array.dtype not in _safetensors_dtypes:
            raise Error(f"weight '{name}' is {array.dtype}; safetensors files of kiln's hold "
                        f"{', '.join(str(t) for t in _safetensors_dtypes)}")
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        header[name] = {"dtype": _safetensors_dtypes[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for array in arrays:
                f.write(array.tobytes())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# the compile options the kiln command takes from its environment
_option_variables = {"cache_dir": "KILN_CACHE_DIR", "blas": "KILN_BLAS", "cuda": "KILN_CUDA"}


def _command_run(args, what, source=None):
    env = dict(os.environ)
    for field, variable in _option_variables.items():
        if source is not None and source.options.get(field) is not None:
            env[variable] = str(source.options[field])
    result = subprocess.run([_command, *args], capture_output=True, text=True, env=env)
    if result.returncode:
        message = result.stderr.strip().replace("kiln: error: ", "", 1) or f"{what} failed"
        if source is not None and source.text is not None:  # as kiln_jit names model text
            message = message.replace(source.path, "<model>")
        raise Error(message, {1: "user", 3: "internal"}.get(result.returncode, "user"))
    return result.stdout


class _Source:
    """Where a model came from, as a file the kiln command can read (text, an
    ONNX proto and a torch module are written to a folder of the Model's own),
    with the weights files and options it was compiled with."""

    def __init__(self, model, weights, example_inputs, options):
        self.folder = None
        self.options = options
        self.text = None
        if isinstance(weights, Mapping):
            weights = [self._file("weights.safetensors", lambda p: save_safetensors(p, weights))]
        elif weights is not None:
            weights = [weights] if isinstance(weights, (str, os.PathLike)) else list(weights)
        self.weights = [str(w) for w in weights or []]
        if isinstance(model, os.PathLike) or (isinstance(model, str) and "\n" not in model and (
                model.endswith((".kiln", ".onnx")) or os.path.isfile(model))):
            self.path = str(model)
            if not os.path.exists(self.path):
                raise Error(f"{self.path}: no such file")
        elif isinstance(model, str):
            self.text = model
            self.path = self._file("model.kiln", lambda p: Path(p).write_text(model))
        elif hasattr(model, "SerializeToString"):
            self.path = self._file("model.onnx", lambda p: Path(p).write_bytes(model.SerializeToString()))
        elif hasattr(model, "forward") and hasattr(model, "state_dict"):
            self.path = self._file("model.onnx", lambda p: _export_torch(model, example_inputs, p))
        else:
            raise Error(f"kiln.compile takes a .kiln or .onnx path, model text, an onnx.ModelProto or a "
                        f"torch.nn.Module, not {type(model).__name__}")

    def _file(self, name, write):
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="kiln-")
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        path = os.path.join(self.folder, name)
        write(path)
        return path

    def arguments(self, with_target=True):
        def operand(path):  # never taken for an option
            return "./" + path if path.startswith("-") else path

        args = [operand(self.path)]
        for w in self.weights:
            args += ["--weights", operand(w)]
        args.append(f"-O{self.options['opt_level']}")
        if with_target:
            args += ["--target", self.options["target"]]
            if self.options.get("cpu"):
                args += ["--cpu", self.options["cpu"]]
        return args


def _export_torch(module, example_inputs, path):
    import torch

    if example_inputs is None:
        raise Error("kiln.compile of a torch.nn.Module needs example_inputs (a tensor or a tuple of them)")
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    example_inputs = tuple(torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
                           for x in example_inputs)
    def names(stem, n):
        return [stem] if n == 1 else [f"{stem}{i}" for i in range(n)]

    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            outputs = module(*example_inputs)
            n_outputs = len(outputs) if isinstance(outputs, (tuple, list)) else 1
            # PRESERVE rather than EVAL: the exporter then folds no batch norm into its
            # conv, so every param keeps its PyTorch name (kiln's fold pass folds them)
            torch.onnx.export(module, example_inputs, path, input_names=names("x", len(example_inputs)),
                              output_names=names("y", n_outputs), opset_version=13, do_constant_folding=False,
                              training=torch.onnx.TrainingMode.PRESERVE)
    finally:
        module.train(was_training)


class _Params(Mapping):
    """A model's params that its runs update, by name: reading one copies it out of
    the instance, assigning one copies it in."""

    def __init__(self, model):
        self._model = model
        self._infos = {p.name: p for p in model._param_infos}

    def __getitem__(self, name):
        info = self._infos[name]
        array = np.empty(info.shape, info.dtype)
        err = _KilnError()
        with self._model._lock:
            if _lib.kiln_read_param(self._model._handle(), name.encode(), array.ctypes.data, array.nbytes, err):
                _raise(err)
        return array

    def __setitem__(self, name, value):
        if name not in self._infos:
            raise KeyError(name)
        array = _as_array(value, self._infos[name], "param")
        err = _KilnError()
        with self._model._lock:
            if _lib.kiln_write_param(self._model._handle(), name.encode(), array.ctypes.data, array.nbytes, err):
                _raise(err)

    def __iter__(self):
        return iter(self._infos)

    def __len__(self):
        return len(self._infos)


class Dot(str):
    """Graphviz source of a model's graph; shown as SVG in Jupyter where the
    graphviz package is installed."""

    def _repr_svg_(self):
        try:
            import graphviz
        except ImportError:
            return None
        return graphviz.Source(str(self)).pipe(format="svg").decode()


class Model:
    """A compiled model with one instance: call it on arrays. One call runs at a
    time per Model (others wait); threads that want to run in parallel each use a
    Model of their own."""

    def __init__(self, module, source=None, so_path=None):
        self._module = module
        self._source = source
        self._so_path = so_path
        self._compiled = None  # the kiln command's .so, source and memory report, made once
        self._lock = threading.Lock()
        d = _lib.kiln_def(module).contents
        self.name = d.name.decode()
        self.inputs = _infos(d.inputs, d.n_inputs)
        self.outputs = _infos(d.outputs, d.n_outputs)
        self._param_infos = ()
        if d.extensions & _KILN_EXT_PARAMS:
            p = ctypes.cast(ctypes.pointer(d), ctypes.POINTER(_ParamsDef)).contents
            self._param_infos = _infos(p.params, p.n_params)
        # the symbolic dim: (name, bound), and each input's and output's multiple of it
        self.symbolic = None
        self._in_mult, self._out_mult = _multiples(d.inputs, d.n_inputs), _multiples(d.outputs, d.n_outputs)
        if d.extensions & _KILN_EXT_SYM:
            sd = ctypes.cast(ctypes.pointer(d), ctypes.POINTER(_SymDef)).contents
            if sd.n_sym == 1:
                self.symbolic = (sd.sym_names[0].decode(), sd.sym_bounds[0])
        self._size = ctypes.c_int64(0)
        # what each run passes to kiln_run, set under _lock
        self._in_ptrs = (ctypes.c_void_p * max(1, len(self.inputs)))()
        self._out_ptrs = (ctypes.c_void_p * max(1, len(self.outputs)))()
        self._err = _KilnError()
        self._finalizer = weakref.finalize(self, _lib.kiln_free, module)

    def _handle(self):
        if not self._finalizer.alive:
            raise Error(f"model '{self.name}' is closed")
        return self._module

    def close(self):
        """Frees the instance now rather than when the Model is collected."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        def show(infos):
            return ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in infos)

        return f"<kiln.Model '{self.name}' ({show(self.inputs)}) -> ({show(self.outputs)})>"

    def __call__(self, *args, **named):
        """Runs the model: inputs by position, in declaration order, or by name.
        Returns the output, or a tuple of them when there are several."""
        if named or len(args) != len(self.inputs):
            args = self._by_position(args, named)
        arrays = [_as_array(value, t, "input") for value, t in zip(args, self.inputs)]
        size = self._size_of(arrays)
        outputs = [np.empty(((size * m,) if m else t.shape[:1]) + t.shape[1:], t.dtype)
                   for t, m in zip(self.outputs, self._out_mult)]
        with self._lock:
            for i, a in enumerate(arrays):
                self._in_ptrs[i] = a.ctypes.data
            for i, o in enumerate(outputs):
                self._out_ptrs[i] = o.ctypes.data
            self._size.value = size
            sizes = ctypes.byref(self._size) if self.symbolic else None
            if _lib.kiln_run_sym(self._handle(), sizes, self._in_ptrs, self._out_ptrs, self._err):
                _raise(self._err)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _size_of(self, arrays):
        """The size of the symbolic dim the inputs give (0 without one): each input with
        it a whole multiple, all the same, from 1 to the bound."""
        if not self.symbolic:
            return 0
        name, bound = self.symbolic
        size = None
        for a, t, m in zip(arrays, self.inputs, self._in_mult):
            if not m:
                continue
            here = a.shape[0] // m
            if a.shape[0] % m or not 1 <= here <= bound or (size is not None and here != size):
                raise Error(f"input '{t.name}' has shape {list(a.shape)}: its first dim is {name}"
                            f"{'*' + str(m) if m > 1 else ''} for {name} from 1 to {bound}"
                            f"{'' if size is None else f', and the inputs before it give {name} = {size}'}")
            size = here
        return size or bound

    def _by_position(self, args, named):
        if len(args) > len(self.inputs):
            raise Error(f"model '{self.name}' takes {len(self.inputs)} inputs; {len(args)} were given")
        values = dict(zip((t.name for t in self.inputs), args))
        for name, value in named.items():
            if name in values:
                raise Error(f"input '{name}' is given twice")
            if name not in (t.name for t in self.inputs):
                raise Error(f"model '{self.name}' has no input '{name}' (its inputs: "
                            f"{', '.join(t.name for t in self.inputs)})")
            values[name] = value
        missing = [t.name for t in self.inputs if t.name not in values]
        if missing:
            raise Error(f"model '{self.name}' needs input '{missing[0]}', which was not given")
        return [values[t.name] for t in self.inputs]

    def step(self, **inputs):
        """One training step: runs the model, whose update statements change its
        params in place, and returns its outputs (the loss, say)."""
        return self(**inputs)

    @property
    def params(self):
        """The params the model's runs update (a training step's weights and
        optimizer state), as a mapping of names to arrays, readable and assignable."""
        return _Params(self)

    def save_weights(self, path):
        """Writes params (a training step's current weights) to a safetensors file,
        which compile(..., weights=path) reads back."""
        params = self.params
        save_safetensors(path, {name: params[name] for name in params})

    def _compile_files(self):
        if self._compiled is None:
            if self._source is None:
                raise Error(f"model '{self.name}' was loaded from {self._so_path}: its source is not at hand")
            folder = tempfile.mkdtemp(prefix="kiln-")
            weakref.finalize(self, shutil.rmtree, folder, True)
            so, source = os.path.join(folder, "model.so"), os.path.join(folder, "model.src")
            report = _command_run(["compile", *self._source.arguments(), "-o", so, "--emit-source", source,
                                   "--memory-report", "--quiet"], "kiln compile", self._source)
            self._compiled = (so, Path(source).read_text(), report)
        return self._compiled

    def save(self, path):
        """Writes the model as a shared object that kiln.load, libkiln's kiln_load or
        any C program (docs/abi.md) loads. It holds the model as compiled, with the
        weights it was compiled with (save_weights keeps trained ones)."""
        so = self._so_path or self._compile_files()[0]
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        try:
            shutil.copyfile(so, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @property
    def source(self):
        """The generated source: C, or for the CUDA target the CUDA kernels."""
        return self._compile_files()[1]

    def memory_report(self):
        """The memory plan as text: each buffer's size, lifetime and offset, the peak
        and the lower bound."""
        return self._compile_files()[2]

    def profile(self, iters=20):
        """Runs the model iters times and returns a row per kernel: a dict of its
        name, mean milliseconds, share of the time, GFLOP/s (None where it counts
        none) and what it computes."""
        target = self._so_path or None
        args = [target] if target else self._source.arguments()
        text = _command_run(["bench", *args, "--profile", "--iters", str(iters)], "kiln bench", self._source)
        rows = []
        for line in text.splitlines():
            m = re.match(r"(\S+)\s+([0-9.]+)\s+([0-9.]+)%\s+(?:([0-9.]+)\s+)?(.*)$", line)
            if m and m.group(1) not in ("kernel", "total"):
                rows.append({"kernel": m.group(1), "mean_ms": float(m.group(2)), "share": float(m.group(3)) / 100,
                             "gflops": float(m.group(4)) if m.group(4) else None, "computes": m.group(5)})
        return rows

    def dot(self):
        """The graph after the passes, as Graphviz source (a str; SVG in Jupyter)."""
        if self._source is None:
            raise Error(f"model '{self.name}' was loaded from {self._so_path}: its graph is not at hand")
        return Dot(_command_run(["dot", *self._source.arguments(with_target=False)], "kiln dot", self._source))


def _options(target, opt_level, cpu, cache_dir, jit, blas, cuda):
    options = _lib.kiln_options_from_env()
    options.target = target.encode()
    if opt_level not in (0, 1, 2):
        raise Error(f"opt_level is {opt_level}; it is 0, 1 or 2")
    options.opt_level = opt_level
    for field, value in (("cpu", cpu), ("cache_dir", cache_dir), ("jit", jit), ("blas", blas), ("cuda", cuda)):
        if value is not None:
            setattr(options, field, str(value).encode())
    return options


def compile(model, weights=None, target="c", *, example_inputs=None, opt_level=2, cpu=None, cache_dir=None,
            jit=None, blas=None, cuda=None):
    """Compiles a model in process and returns a Model ready to run.

    model: a .kiln or .onnx path, model text, an onnx.ModelProto, or a
    torch.nn.Module with example_inputs (exported to ONNX, its weights with it).
    weights: a safetensors path, a list of them, or a mapping of names to arrays.
    target: "c" or "cuda". The rest are kiln_options' fields (kiln/kiln.h):
    opt_level 0, 1 or 2; cpu ("native", "x86-64-v3", ...); cache_dir; jit ("clang"
    or "cc"); blas ("on" or "off"); cuda ("gpu" or "emulate")."""
    source = _Source(model, weights, example_inputs, {"target": target, "opt_level": opt_level, "cpu": cpu,
                                                      "cache_dir": cache_dir, "blas": blas, "cuda": cuda})
    options = _options(target, opt_level, cpu, cache_dir, jit, blas, cuda)
    files = (ctypes.c_char_p * max(1, len(source.weights)))(*[w.encode() for w in source.weights])
    options.weights, options.n_weights = files, len(source.weights)
    err = _KilnError()
    if source.text is not None:
        module = _lib.kiln_jit(source.text.encode(), options, err)
    else:
        module = _lib.kiln_jit_file(source.path.encode(), options, err)
    if not module:
        _raise(err)
    return Model(module, source=source)


def load(path):
    """Loads a shared object made by `kiln compile` or Model.save."""
    path = os.fspath(path)
    err = _KilnError()
    module = _lib.kiln_load(path.encode(), err)
    if not module:
        _raise(err)
    return Model(module, so_path=path)


def opt(model, passes=None, dump_dir=None, weights=None, opt_level=2, *, example_inputs=None):
    """Runs the pass pipeline (opt_level's, or the passes named in order) and returns
    the model after each stage as a list of (stage, text) pairs, the parsed model
    first. dump_dir keeps the files (DIR/NN-PASS.kiln) as `kiln opt --dump-dir` does.
    model, weights and example_inputs are as compile's."""
    source = _Source(model, weights, example_inputs, {"target": "c", "opt_level": opt_level})
    folder = dump_dir or tempfile.mkdtemp(prefix="kiln-opt-")
    try:
        args = ["opt", *source.arguments(with_target=False), "--dump-dir", os.fspath(folder)]
        if passes is not None:
            args.append("--passes=" + ",".join([passes] if isinstance(passes, str) else passes))
        _command_run(args, "kiln opt", source)
        stages = sorted(p for p in Path(folder).iterdir() if re.fullmatch(r"\d+-.+\.kiln", p.name))
        return [(re.sub(r"^\d+-", "", p.stem), p.read_text()) for p in stages]
    finally:
        if dump_dir is None:
            shutil.rmtree(folder, True)
