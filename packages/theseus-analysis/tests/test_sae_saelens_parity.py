"""SAELens itself, the reference: it loads the files we write and computes what we compute,
and what it saves we read and compute alike (torch session).

For each architecture, random params (inputs and encoders scaled so pre-activations are
of order 1; jumprelu thresholds from 0.05 to 2, so that some features pass their
threshold, some are positive but gated off, some negative; topk with k < width) are
written with ``saelens_files`` into a folder that ``sae_lens.SAE.load_from_disk`` loads.
On the same float32 inputs, SAELens's ``encode`` and ``decode`` equal our ``encode`` and
``decode`` elementwise within 1e-5 relative plus 1e-6 of the largest reference magnitude
(float32 sums of products in another order), with the same features active. The
other way round, SAEs that SAELens builds (its inference classes, its training classes,
BatchTopK exported as JumpReLU, ``apply_b_dec_to_input=False``, topk rescaled by decoder
norm) and saves with its own ``save_model`` / ``save_inference_model`` read back with
``read_saelens`` and encode and decode alike, within the same tolerance.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sae_lens = pytest.importorskip("sae_lens")

from theseus.analysis.sae import SAEConfig, decode, encode, read_saelens, saelens_files  # noqa: E402

pytestmark = pytest.mark.torch

RTOL, SCALED_ATOL = 1e-5, 1e-6  # atol: SCALED_ATOL times the reference's largest magnitude
D_IN, WIDTH, K, N = 16, 48, 5, 512
CONFIGS = {
    "relu": SAEConfig(d_in=D_IN, width=WIDTH, architecture="relu", l1=0.3),
    "topk": SAEConfig(d_in=D_IN, width=WIDTH, architecture="topk", k=K),
    "jumprelu": SAEConfig(
        d_in=D_IN, width=WIDTH, architecture="jumprelu", l0=0.1, threshold=0.2, bandwidth=0.05
    ),
}
CLASSES = {"relu": "StandardSAE", "topk": "TopKSAE", "jumprelu": "JumpReLUSAE"}
WHERE = {
    "hook_name": "blocks_1/mlp",
    "model_name": "proj.group.run~1a2b3c4d~12",
    "context_size": 64,
}


def random_params(config: SAEConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        "W_enc": rng.normal(size=(config.d_in, config.width)) / np.sqrt(config.d_in),
        "W_dec": rng.normal(size=(config.width, config.d_in))
        * rng.uniform(0.5, 2, (config.width, 1)),
        "b_enc": rng.normal(size=config.width) * 0.3,
        "b_dec": rng.normal(size=config.d_in) * 0.3,
    }
    if config.architecture == "jumprelu":
        params["log_threshold"] = rng.uniform(np.log(0.05), np.log(2.0), config.width)
    return {name: value.astype(np.float32) for name, value in params.items()}


def inputs(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(N, D_IN)).astype(np.float32)


def ours(
    params: dict[str, np.ndarray], x: np.ndarray, config: SAEConfig
) -> tuple[np.ndarray, np.ndarray]:
    jax_params = {name: jnp.asarray(value) for name, value in params.items()}
    features = encode(jax_params, jnp.asarray(x), config)
    return np.asarray(features), np.asarray(decode(jax_params, features))


def theirs(sae, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        features = sae.encode(torch.from_numpy(x))
        if features.is_sparse:
            features = features.to_dense()
        return features.numpy(), sae.decode(features).numpy()


def compare(mine: np.ndarray, reference: np.ndarray, what: str) -> float:
    np.testing.assert_array_equal(mine > 0, reference > 0, err_msg=f"{what}: active features")
    atol = SCALED_ATOL * float(np.max(np.abs(reference)))
    np.testing.assert_allclose(mine, reference, rtol=RTOL, atol=atol, err_msg=what)
    difference = float(np.max(np.abs(mine - reference)))
    print(f"{what}: max |ours - SAELens| = {difference:.3g}")
    return difference


def write(files: dict[str, bytes], folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("architecture", sorted(CONFIGS))
def test_saelens_loads_what_we_write_and_computes_alike(architecture: str, tmp_path: Path) -> None:
    config = CONFIGS[architecture]
    params = random_params(config)
    folder = write(saelens_files(params, config, **WHERE), tmp_path / architecture)
    sae = sae_lens.SAE.load_from_disk(folder)
    assert type(sae).__name__ == CLASSES[architecture]
    assert (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.apply_b_dec_to_input) == (D_IN, WIDTH, True)
    assert sae.cfg.metadata.hook_name == WHERE["hook_name"]
    assert sae.cfg.metadata.model_name == WHERE["model_name"]
    assert sae.cfg.metadata.context_size == WHERE["context_size"]
    if architecture == "topk":
        assert sae.cfg.k == K

    x = inputs()
    my_features, my_recon = ours(params, x, config)
    their_features, their_recon = theirs(sae, x)
    compare(my_features, their_features, f"{architecture} encode")
    compare(my_recon, their_recon, f"{architecture} decode")
    active = (my_features > 0).sum(axis=1)
    if architecture == "topk":
        assert np.all(active == K)
    else:
        assert 0 < active.mean() < WIDTH * 0.9
    if architecture == "jumprelu":  # positive pre-activations gated off by their threshold
        pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
        threshold = np.exp(params["log_threshold"])
        assert np.mean((pre > 0) & (pre <= threshold)) > 0.05
        assert np.mean(pre > threshold) > 0.05

    # decode on its own, of the same random sparse features
    features = np.where(their_features > 0, np.abs(inputs(2)[:, :1]) + their_features, 0)
    with torch.no_grad():
        reference = sae.decode(torch.from_numpy(features.astype(np.float32))).numpy()
    mine = np.asarray(decode({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(features)))
    compare(mine, reference, f"{architecture} decode alone")


def _set_weights(sae, params: dict[str, np.ndarray]) -> None:
    with torch.no_grad():
        for name, value in params.items():
            getattr(sae, name).data.copy_(torch.from_numpy(value))


def _saved(sae, folder: Path, inference: bool = False) -> dict[str, bytes]:
    (sae.save_inference_model if inference else sae.save_model)(folder)
    return {name: (folder / name).read_bytes() for name in ("cfg.json", "sae_weights.safetensors")}


def _weights(architecture: str) -> dict[str, np.ndarray]:
    """SAELens's tensors of random params (``threshold``, not its log)."""
    params = random_params(CONFIGS[architecture])
    if "log_threshold" in params:
        params["threshold"] = np.exp(params.pop("log_threshold"))
    return params


def _saelens_saes() -> dict[str, tuple[str, object, bool, dict[str, float]]]:
    """Case name: (our architecture, an SAE built with SAELens's own classes, whether it is
    saved with ``save_inference_model``, the settings ``read_saelens`` must find)."""
    meta = sae_lens.saes.sae.SAEMetadata(
        hook_name="blocks.1.hook_mlp_out", model_name="gpt2", context_size=128
    )
    common = {"d_in": D_IN, "d_sae": WIDTH, "metadata": meta}
    topk = sae_lens.TopKTrainingSAEConfig(**common, k=K, rescale_acts_by_decoder_norm=True)
    jumprelu = sae_lens.JumpReLUTrainingSAEConfig(
        **common, l0_coefficient=0.4, jumprelu_init_threshold=0.3, jumprelu_bandwidth=0.02
    )
    jump_settings = {"l0": 0.4, "threshold": 0.3, "bandwidth": 0.02}
    batchtopk = sae_lens.BatchTopKTrainingSAEConfig(
        **common, k=K, rescale_acts_by_decoder_norm=False
    )
    return {
        "standard": ("relu", sae_lens.StandardSAE(sae_lens.StandardSAEConfig(**common)), False, {}),
        "standard, b_dec not applied to the input": (
            "relu",
            sae_lens.StandardSAE(sae_lens.StandardSAEConfig(**common, apply_b_dec_to_input=False)),
            False,
            {},
        ),
        "topk": ("topk", sae_lens.TopKSAE(sae_lens.TopKSAEConfig(**common, k=K)), False, {"k": K}),
        "topk rescaled by decoder norm": (
            "topk",
            sae_lens.TopKSAE(
                sae_lens.TopKSAEConfig(**common, k=K, rescale_acts_by_decoder_norm=True)
            ),
            False,
            {"k": K},
        ),
        "jumprelu": (
            "jumprelu",
            sae_lens.JumpReLUSAE(sae_lens.JumpReLUSAEConfig(**common)),
            False,
            {},
        ),
        "standard training": (
            "relu",
            sae_lens.StandardTrainingSAE(
                sae_lens.StandardTrainingSAEConfig(**common, l1_coefficient=0.7)
            ),
            False,
            {"l1": 0.7},
        ),
        "topk training": ("topk", sae_lens.TopKTrainingSAE(topk), False, {"k": K}),
        "topk training, inference export": ("topk", sae_lens.TopKTrainingSAE(topk), True, {"k": K}),
        "jumprelu training": (
            "jumprelu",
            sae_lens.JumpReLUTrainingSAE(jumprelu),
            False,
            jump_settings,
        ),
        "jumprelu training, inference export": (
            "jumprelu",
            sae_lens.JumpReLUTrainingSAE(jumprelu),
            True,
            jump_settings,
        ),
        "batchtopk, inference export as jumprelu": (
            "jumprelu",
            sae_lens.BatchTopKTrainingSAE(batchtopk),
            True,
            {},
        ),
    }


CASES = [
    "standard",
    "standard, b_dec not applied to the input",
    "topk",
    "topk rescaled by decoder norm",
    "jumprelu",
    "standard training",
    "topk training",
    "topk training, inference export",
    "jumprelu training",
    "jumprelu training, inference export",
    "batchtopk, inference export as jumprelu",
]


@pytest.mark.parametrize("case", CASES)
def test_we_read_what_saelens_saves_and_compute_alike(case: str, tmp_path: Path) -> None:
    architecture, sae, inference, settings = _saelens_saes()[case]
    weights = _weights(architecture)
    if case.startswith("batchtopk"):  # its threshold is one learned scalar
        del weights["threshold"]
        sae.topk_threshold = torch.tensor(0.4, dtype=torch.double)
    _set_weights(sae, weights)
    files = _saved(sae, tmp_path / "saved", inference)

    config, params = read_saelens(files)
    assert (config.architecture, config.d_in, config.width) == (architecture, D_IN, WIDTH)
    for field, value in settings.items():
        assert getattr(config, field) == pytest.approx(value), field
    if case.startswith("batchtopk"):  # saved as a JumpReLU SAE: SAELens's loaded one computes
        sae = sae_lens.SAE.load_from_disk(tmp_path / "saved")
        assert type(sae).__name__ == "JumpReLUSAE"
    x = inputs()
    my_features, my_recon = ours(params, x, config)
    their_features, their_recon = theirs(sae, x)
    compare(my_features, their_features, f"{case} encode")
    compare(my_recon, their_recon, f"{case} decode")
    assert (my_features > 0).any()
