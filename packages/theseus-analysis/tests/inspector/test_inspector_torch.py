"""PyTorch recording, and one network ported by hand between PyTorch and Equinox.

Run with torch installed (the nox `torch` session); skipped otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from theseus.analysis.inspector import (  # noqa: E402
    is_jax_model,
    is_torch_model,
    read_from_safetensors,
    tail,
)
from theseus.analysis.inspector.cli import inspect  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.safetensors]


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


@pytest.fixture
def torch_net():
    torch.manual_seed(0)
    net = TorchNet()
    with torch.no_grad():  # a non-trivial LayerNorm affine part
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.5, 0.5)
    return net


@pytest.fixture
def batch():
    return np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)


def test_torch_keys_values_inputs_and_hook_removal(torch_net, batch, tmp_path):
    x = torch.from_numpy(batch)
    with tail(torch_net, tmp_path, record="both") as fm:
        assert fm is torch_net
        fm(x)
        fm(x[:2])
    data = read_from_safetensors(tmp_path, framework="torch")
    assert list(data) == [
        "fc1.__call__.input",
        "fc1.__call__",
        "norm.__call__.input",
        "norm.__call__",
        "fc2.__call__.input",
        "fc2.__call__",
    ]
    with torch.no_grad():
        h = torch_net.fc1(torch.cat([x, x[:2]]))
        expected_norm = torch_net.norm(h)
    torch.testing.assert_close(data["fc1.__call__.input"], torch.cat([x, x[:2]]), rtol=0, atol=0)
    torch.testing.assert_close(data["fc1.__call__"], h, rtol=0, atol=0)
    torch.testing.assert_close(data["norm.__call__"], expected_norm, rtol=0, atol=0)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in torch_net.modules())
    assert is_torch_model(torch_net) and not is_jax_model(torch_net)


def test_torch_separate_and_nested(torch_net, batch, tmp_path):
    x = torch.from_numpy(batch)
    with (
        tail(torch_net, tmp_path / "outer", filter_=lambda p, m: p == "fc2") as outer,
        tail(outer, tmp_path / "inner", stack="separate") as inner,
    ):
        inner(x)
        inner(x)
    assert list(read_from_safetensors(tmp_path / "outer")) == ["fc2.__call__"]
    assert read_from_safetensors(tmp_path / "outer")["fc2.__call__"].shape == (10, 3)
    assert list(read_from_safetensors(tmp_path / "inner"))[:2] == [
        "fc1.__call__#0",
        "fc1.__call__#1",
    ]


def _equinox_port(net):
    eqx = pytest.importorskip("equinox")

    class EqxNet(eqx.Module):
        fc1: eqx.nn.Linear
        norm: eqx.nn.LayerNorm
        fc2: eqx.nn.Linear

        def __call__(self, x):
            h = jax.vmap(self.norm)(jax.vmap(self.fc1)(x))
            return jax.vmap(self.fc2)(jax.nn.relu(h))

    keys = jax.random.split(jax.random.key(0), 2)
    model = EqxNet(
        eqx.nn.Linear(4, 8, key=keys[0]), eqx.nn.LayerNorm(8), eqx.nn.Linear(8, 3, key=keys[1])
    )
    state = {k: jnp.asarray(v.detach().numpy()) for k, v in net.state_dict().items()}
    return eqx.tree_at(
        lambda m: (m.fc1.weight, m.fc1.bias, m.norm.weight, m.norm.bias, m.fc2.weight, m.fc2.bias),
        model,
        tuple(
            state[k]
            for k in (
                "fc1.weight",
                "fc1.bias",
                "norm.weight",
                "norm.bias",
                "fc2.weight",
                "fc2.bias",
            )
        ),
    )


def test_torch_and_equinox_port_diff_close_then_perturbed(torch_net, batch, tmp_path):
    port = _equinox_port(torch_net)
    with tail(port, tmp_path / "jax") as fm:
        jax.jit(lambda m, v: m(v))(fm, jnp.asarray(batch))
    with tail(torch_net, tmp_path / "torch") as fm:
        fm(torch.from_numpy(batch))
    jax_keys = list(read_from_safetensors(tmp_path / "jax"))
    torch_keys = list(read_from_safetensors(tmp_path / "torch"))
    # one naming for both frameworks: the recordings compare key by key, no --key-map
    assert jax_keys == torch_keys == ["fc1.__call__", "norm.__call__", "fc2.__call__"]
    tolerances = ["--rtol", "1e-5", "--atol", "1e-5"]
    runner = CliRunner()
    close = runner.invoke(
        inspect, ["diff", str(tmp_path / "torch"), str(tmp_path / "jax"), *tolerances]
    )
    assert close.exit_code == 0, close.output
    assert close.output.count(" close ") == 3 and "3 close, 0 differ" in close.output

    # a recording from before PyTorch keys were `__call__` (they ended in `.forward`)
    # still compares, through a key map
    old_names = [(r"\.__call__$", ".forward")]
    with tail(torch_net, tmp_path / "torch-old", key_map=old_names) as fm:
        fm(torch.from_numpy(batch))
    assert next(iter(read_from_safetensors(tmp_path / "torch-old"))) == "fc1.forward"
    mapped = runner.invoke(
        inspect,
        [
            "diff", str(tmp_path / "torch-old"), str(tmp_path / "jax"),
            "--key-map", r"\.forward$", ".__call__", *tolerances,
        ],
    )  # fmt: skip
    assert mapped.exit_code == 0 and "3 close, 0 differ" in mapped.output, mapped.output

    with torch.no_grad():
        torch_net.fc2.weight[0] += 0.5
    with tail(torch_net, tmp_path / "torch") as fm:
        fm(torch.from_numpy(batch))
    differs = runner.invoke(
        inspect, ["diff", str(tmp_path / "torch"), str(tmp_path / "jax"), *tolerances]
    )
    assert differs.exit_code == 1
    fc2_line = next(line for line in differs.output.splitlines() if line.startswith("fc2"))
    assert "DIFFERS" in fc2_line and "5/15 exceed" in fc2_line
    assert "2 close, 1 differ" in differs.output


def test_documented_torch_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(10, 5)
    x = torch.randn(3, 10)
    with tail(model, path=".clouseau/trace-torch.safetensors") as fmodel:
        out = fmodel(x)
    data = read_from_safetensors(".clouseau/trace-torch.safetensors", framework="torch")
    assert list(data) == ["__call__"]
    torch.testing.assert_close(data["__call__"], out.detach(), rtol=0, atol=0)
    numpy_data = read_from_safetensors(tmp_path / ".clouseau" / "trace-torch.safetensors")
    np.testing.assert_array_equal(numpy_data["__call__"], out.detach().numpy())


def test_torch_bfloat16_and_string_filters(torch_net, batch, tmp_path):
    net = torch_net.to(torch.bfloat16)
    x = torch.from_numpy(batch).to(torch.bfloat16)
    with tail(net, tmp_path, filter_=lambda p, m: p.startswith("fc") and "1" in p) as fm:
        fm(x)
    data = read_from_safetensors(tmp_path, framework="torch")
    assert list(data) == ["fc1.__call__"]
    assert data["fc1.__call__"].dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(data["fc1.__call__"], net.fc1(x), rtol=0, atol=0)
