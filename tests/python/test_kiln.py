"""The Python package (python/kiln) against the examples' reference data, NumPy,
and PyTorch where it is installed. tests/python/run.sh installs the package into a
venv and runs this file with pytest."""
import gc
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kiln

examples = Path(__file__).resolve().parents[2] / "examples"
small_cnn = examples / "small_cnn.kiln"
relu_text = "model tiny\ninput x : f32[2, 3]\ny = relu(x)\noutput y\n"


def close(a, b):
    return np.all(np.abs(a - b) <= 1e-4 + 1e-4 * np.abs(b))


@pytest.fixture(scope="module")
def cnn():
    return kiln.compile(small_cnn)


@pytest.fixture(scope="module")
def cnn_input():
    return np.load(examples / "small_cnn_input.npy")


def test_version_is_the_librarys():
    assert kiln.__version__ == kiln._lib.kiln_version().decode()


def test_compile_path_matches_pytorch(cnn, cnn_input):
    assert cnn.name == "small_cnn"
    assert cnn.inputs == (kiln.TensorInfo("x", (1, 3, 32, 32), np.dtype(np.float32)),)
    assert [o.name for o in cnn.outputs] == ["y"]
    y = cnn(cnn_input)
    assert y.shape == (1, 10) and y.dtype == np.float32
    assert close(y, np.load(examples / "small_cnn_expected.npy"))
    assert "small_cnn" in repr(cnn)


def test_compile_text_and_named_inputs(tmp_path, monkeypatch):
    m = kiln.compile(relu_text)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    assert np.array_equal(m(x), np.maximum(x, 0))
    assert np.array_equal(m(x=x), np.maximum(x, 0))
    (tmp_path / "relu.txt").write_text(relu_text)  # a file of kiln text by any name
    assert np.array_equal(kiln.compile(str(tmp_path / "relu.txt"))(x), np.maximum(x, 0))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-O0.kiln").write_text(relu_text)  # a name like an option, for the tools too
    assert "relu" in kiln.compile("-O0.kiln").source


def test_symbolic_batch():
    m = kiln.compile("model rows\ndim B <= 4\ninput x : f32[B, 3]\nparam w : f32[3] = fill(2.0)\n"
                     "y = mul(x, w)\nr = reshape(y, shape=[-1, 1])\noutput r\n")
    assert m.symbolic == ("B", 4)
    assert m.inputs == (kiln.TensorInfo("x", (None, 3), np.dtype(np.float32)),)
    assert m.outputs[0].shape == (None, 1)
    for n in (1, 3, 4):
        x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
        assert np.array_equal(m(x), (2 * x).reshape(3 * n, 1))
    with pytest.raises(kiln.Error, match=r"input 'x' has shape \[5, 3\]: its first dim is B for B from 1 to 4"):
        m(np.zeros((5, 3), np.float32))
    with pytest.raises(kiln.Error, match=r"has shape \[2, 4\]; the model takes \[None, 3\]"):
        m(np.zeros((2, 4), np.float32))


def test_weights_from_arrays_and_files(tmp_path):
    text = "model m\ninput x : f32[2]\nparam w : f32[2]\ny = mul(x, w)\noutput y\n"
    w = np.array([3, -2], np.float32)
    assert np.array_equal(kiln.compile(text, weights={"w": w})(np.ones(2, np.float32)), w)
    kiln.save_safetensors(tmp_path / "w.safetensors", {"w": w})
    assert np.array_equal(kiln.compile(text, weights=tmp_path / "w.safetensors")(np.ones(2, np.float32)), w)


def test_inputs_need_not_be_dense_or_arrays(cnn, cnn_input):
    expected = cnn(cnn_input)
    strided = np.zeros((1, 3, 32, 64), np.float32)
    strided[..., ::2] = cnn_input
    assert not strided[..., ::2].flags.c_contiguous
    assert np.array_equal(cnn(strided[..., ::2]), expected)

    class WithArray:
        def __array__(self, dtype=None):
            return cnn_input

    class WithDLPack:
        def __dlpack__(self, stream=None):
            return cnn_input.__dlpack__()

        def __dlpack_device__(self):
            return cnn_input.__dlpack_device__()

    assert np.array_equal(cnn(WithArray()), expected)
    assert np.array_equal(cnn(WithDLPack()), expected)


def test_integer_and_boolean_tensors():
    text = ("model m\ninput ids : i64[4]\ninput keep : bool[4]\ninput other : i64[4]\nparam table : f32[3, 2]\n"
            "e = gather(table, ids, axis=0)\nz = where(keep, ids, other)\noutput e, z\n")
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    m = kiln.compile(text, weights={"table": table})
    ids, keep, other = np.array([2, 0, 1, 2]), np.array([True, False, True, True]), np.full(4, -7)
    e, z = m(ids, keep, other)
    assert np.array_equal(e, table[ids]) and e.dtype == np.float32
    assert np.array_equal(z, np.where(keep, ids, other)) and z.dtype == np.int64


@pytest.mark.parametrize("call, expect", [
    (lambda m: m(np.zeros((2, 3), np.float64)), "input 'x' is float64; the model takes float32"),
    (lambda m: m(np.zeros((3, 2), np.float32)), "input 'x' has shape [3, 2]; the model takes [2, 3]"),
    (lambda m: m(), "needs input 'x', which was not given"),
    (lambda m: m(z=np.zeros((2, 3), np.float32)), "has no input 'z' (its inputs: x)"),
    (lambda m: m(np.zeros((2, 3), np.float32), np.zeros(1)), "takes 1 inputs; 2 were given"),
    (lambda m: m(np.zeros((2, 3), np.float32), x=np.zeros((2, 3), np.float32)), "input 'x' is given twice"),
])
def test_bad_inputs_are_errors(call, expect):
    with pytest.raises(kiln.Error) as e:
        call(kiln.compile(relu_text))
    assert expect in str(e.value)


def test_cuda_target_emulated(tmp_path):
    m = kiln.compile(relu_text, target="cuda", cuda="emulate")
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    assert np.array_equal(m(x), np.maximum(x, 0))
    assert "__global__" in m.source
    m.save(tmp_path / "m.so")  # emulated too: it runs here, GPU or not
    assert np.array_equal(kiln.load(tmp_path / "m.so")(x), np.maximum(x, 0))


def test_an_error_names_the_line():
    with pytest.raises(kiln.Error) as e:
        kiln.compile("model m\ninput x : f32[2]\ny = relu(x, x)\noutput y\n")
    assert (e.value.file, e.value.line, e.value.kind) == ("<model>", 3, "user")
    assert e.value.column >= 1 and "relu" in e.value.message


def test_missing_weight_and_missing_file(tmp_path):
    with pytest.raises(kiln.Error, match="missing weight 'w'"):
        kiln.compile("model m\ninput x : f32[2]\nparam w : f32[2]\ny = add(x, w)\noutput y\n")
    with pytest.raises(kiln.Error, match="no such file"):
        kiln.compile(tmp_path / "absent.kiln")
    with pytest.raises(kiln.Error, match="not int"):
        kiln.compile(3)
    with pytest.raises(kiln.Error, match="opt_level is 5"):
        kiln.compile(relu_text, opt_level=5)


def test_save_and_load(tmp_path, cnn, cnn_input):
    cnn.save(tmp_path / "cnn.so")
    assert [p.name for p in tmp_path.iterdir()] == ["cnn.so"]
    loaded = kiln.load(tmp_path / "cnn.so")
    assert np.array_equal(loaded(cnn_input), cnn(cnn_input))
    loaded.save(tmp_path / "again.so")
    assert np.array_equal(kiln.load(tmp_path / "again.so")(cnn_input), cnn(cnn_input))
    with pytest.raises(kiln.Error, match="its source is not at hand"):
        loaded.source
    with pytest.raises(kiln.Error, match="has no profiling clocks"):
        loaded.profile(iters=1)
    with pytest.raises(kiln.Error, match="not a shared object|cannot|ELF"):
        (tmp_path / "bad.so").write_bytes(b"not an ELF file")
        kiln.load(tmp_path / "bad.so")


def test_closed_model():
    m = kiln.compile(relu_text)
    m.close()
    with pytest.raises(kiln.Error, match="is closed"):
        m(np.zeros((2, 3), np.float32))


def test_tools(tmp_path, cnn):
    assert "kiln_model" in cnn.source
    assert "memory plan of 'small_cnn'" in cnn.memory_report()
    rows = cnn.profile(iters=3)
    assert rows and all(r["mean_ms"] >= 0 and 0 <= r["share"] <= 1 for r in rows)
    assert any("fused_conv" in r["computes"] for r in rows)
    dot = cnn.dot()
    assert dot.startswith('digraph "small_cnn"')
    stages = kiln.opt(small_cnn, dump_dir=tmp_path / "dump")
    assert stages[0][0] == "input" and "fold" in [name for name, _ in stages]
    assert stages[-1][1].startswith("model small_cnn")
    assert len(list((tmp_path / "dump").glob("*.kiln"))) == len(stages)
    only = kiln.opt(relu_text, passes=["fold"])
    assert [name for name, _ in only] == ["input", "fold"]
    with pytest.raises(kiln.Error, match="unknown pass"):
        kiln.opt(relu_text, passes="nonsense")


def test_training_steps_follow_pytorch(tmp_path):
    m = kiln.compile(examples / "train_cnn.kiln", weights=examples / "train_cnn_init.safetensors")
    xs, ys = np.load(examples / "train_x.npy"), np.load(examples / "train_y.npy")
    expected = np.load(examples / "train_cnn_loss.npy")
    batch = m.inputs[0].shape[0]
    for s in range(16):
        at = [(s * batch + i) % len(xs) for i in range(batch)]
        loss = m.step(x=xs[at], y=ys[at])
        assert abs(float(loss.reshape(-1)[0]) - expected[s]) <= 1e-4 * max(1, abs(expected[s])), s
    assert "conv1.weight" in m.params and len(m.params) == len(list(m.params))
    w = m.params["fc.bias"]
    m.params["fc.bias"] = w + 1
    assert np.array_equal(m.params["fc.bias"], w + 1)
    with pytest.raises(kiln.Error, match="param 'fc.bias' has shape"):
        m.params["fc.bias"] = np.zeros(3, np.float32)
    m.save_weights(tmp_path / "trained.safetensors")
    again = kiln.compile(examples / "train_cnn.kiln", weights=tmp_path / "trained.safetensors")
    for name in m.params:
        assert np.array_equal(again.params[name], m.params[name]), name


def test_onnx_proto():
    pytest.importorskip("onnx.helper")
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    assert close(kiln.compile(proto)(x), np.maximum(x @ w, 0))


def test_torch_module():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 5)).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    m = kiln.compile(net, example_inputs=x)
    assert [t.name for t in m.inputs] == ["x"] and [t.name for t in m.outputs] == ["y"]
    with torch.no_grad():
        assert close(m(x.numpy()), net(x).numpy())
    parsed = kiln.opt(net, example_inputs=x, opt_level=0)[0][1]
    for name in ("0.weight", "1.running_mean", "1.running_var", "4.bias"):  # PyTorch's names
        assert f'param "{name}"' in parsed, name
    with pytest.raises(kiln.Error, match="needs example_inputs"):
        kiln.compile(net)


def test_four_threads_four_models(tmp_path, cnn, cnn_input):
    cnn.save(tmp_path / "cnn.so")
    inputs = [cnn_input * (i + 1) for i in range(4)]
    expected = [cnn(x) for x in inputs]
    models = [kiln.load(tmp_path / "cnn.so") for _ in range(4)]
    results = [None] * 4

    def work(i):
        results[i] = [models[i](inputs[i]) for _ in range(50)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert all(np.array_equal(r, expected[i]) for r in results[i])


def resident_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_no_growth_over_1000_cycles(tmp_path):
    x = np.zeros((2, 3), np.float32)

    def cycles(n):
        for _ in range(n):
            m = kiln.compile(relu_text, cache_dir=tmp_path)
            m(x)
            del m
        gc.collect()

    cycles(100)  # the cache filled, the allocator's arenas grown
    before = resident_kib()
    cycles(1000)
    grown = resident_kib() - before
    assert grown < 4096, f"{grown} KiB more after 1000 compile/call/free cycles"


def generate(*args):
    return subprocess.run([sys.executable, str(examples / "generate.py"), *map(str, args)],
                          capture_output=True, text=True)


def test_generate_script_gives_pytorchs_tokens(tmp_path):
    """examples/generate.py, the shell's way to generate: PyTorch's 32 greedy tokens
    from the decoder step, compiled here and loaded from a .so alike; a position past
    the cache, a model that is not a decoder step, tokens that differ from --expect's
    or a file of other text, each exit status 1, and a malformed command line 2."""
    tokens = examples / "gpt2_tokens.txt"
    prompt = tokens.read_text().split("\n")[0].split()
    weights = examples / "gpt2_step.safetensors"
    done = generate(examples / "gpt2_step.kiln", 32, *prompt, "--weights", weights, "--expect", tokens)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"all 32 tokens match {tokens}\n")
    so = tmp_path / "gpt2.so"
    kiln.compile(examples / "gpt2_step.kiln", weights=weights).save(so)
    done = generate(so, 32, *prompt, "--expect", tokens)
    assert done.returncode == 0, done.stderr
    past = generate(so, 100, *prompt)
    assert past.returncode == 1
    assert "run failed at position 64" in past.stderr
    wrong = generate(examples / "small_cnn.kiln", 4, 1)
    assert wrong.returncode == 1
    assert "a decoder step takes two inputs" in wrong.stderr
    lines = tokens.read_text().split("\n")
    differ = tmp_path / "differ.txt"
    differ.write_text(lines[0] + "\n" + " ".join(["0"] + lines[1].split()[1:]) + "\n")
    done = generate(so, 32, *prompt, "--expect", differ)
    assert done.returncode == 1
    assert f"token 0 is {lines[1].split()[0]}, {differ} expects 0" in done.stderr
    differ.write_text(lines[0] + "\nseven\n")
    done = generate(so, 32, *prompt, "--expect", differ)
    assert done.returncode == 1
    assert f"{differ}: line 2: not a line of token ids" in done.stderr
    done = generate(so, 0, *prompt)
    assert done.returncode == 2
    assert "STEPS must be positive" in done.stderr
