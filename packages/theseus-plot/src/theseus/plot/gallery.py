"""Render one example of each helper to PDF and PNG: ``python -m theseus.plot.gallery OUT_DIR``.

The examples use synthetic data shaped like what a language-model researcher
plots (activations, losses per model size, training curves, an embedding
projection), generated from a fixed seed so the files are identical run to run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from theseus.plot._bar import bar
from theseus.plot._export import save
from theseus.plot._heatmap import heatmap
from theseus.plot._relational import line, scatter


def heatmap_example(rng: np.random.Generator) -> Figure:
    """Activations ``[token, feature]`` with a few outlier features, as in seed 001."""
    values = rng.normal(size=(64, 128)) * np.linspace(0.5, 1.5, 128)
    values[:, [7, 42, 99]] += 6.0
    return heatmap(
        values, center=0.0, xlabel="Feature", ylabel="Token", title="Input to blocks_0/attn"
    )


def bar_example(rng: np.random.Generator) -> Figure:
    """Validation loss per model size and tokenizer, five seeds each (long-form dict)."""
    sizes = ["gpt-nano", "gpt-micro", "gpt-mini", "gpt-small", "gpt-medium", "gpt-large"]
    rows: dict[str, list[object]] = {"model": [], "tokenizer": [], "loss": []}
    for index, name in enumerate(sizes):
        for tokenizer, offset in (("byte-level", 0.25), ("BPE 32k", 0.0)):
            for _ in range(5):
                rows["model"].append(name)
                rows["tokenizer"].append(tokenizer)
                rows["loss"].append(4.2 - 0.35 * index + offset + rng.normal(scale=0.05))
    return bar(
        rows,
        x="model",
        y="loss",
        hue="tokenizer",
        xlabel="Model",
        ylabel="Validation loss (nats)",
        title="Loss by model size",
    )


def line_example(rng: np.random.Generator) -> Figure:
    """Training loss over steps for three learning rates: mean and standard deviation of three seeds."""
    steps = np.arange(0, 5000, 50)
    rows: dict[str, list[object]] = {"step": [], "loss": [], "learning rate": []}
    for rate, speed in (("1e-4", 0.4), ("3e-4", 0.8), ("1e-3", 1.2)):
        for _ in range(3):
            curve = (
                2.0 + 8.0 * np.exp(-speed * steps / 1000) + rng.normal(scale=0.08, size=steps.size)
            )
            rows["step"].extend(steps.tolist())
            rows["loss"].extend(curve.tolist())
            rows["learning rate"].extend([rate] * steps.size)
    return line(
        rows,
        x="step",
        y="loss",
        hue="learning rate",
        errorbar="sd",
        xlabel="Step",
        ylabel="Training loss",
        title="Learning-rate sweep",
    )


def scatter_example(rng: np.random.Generator) -> Figure:
    """A 2-D projection of token embeddings, coloured by part of speech."""
    groups = {"noun": (-2.0, 1.0), "verb": (1.5, 1.5), "adjective": (0.0, -2.0)}
    rows: dict[str, list[object]] = {"pc 1": [], "pc 2": [], "part of speech": []}
    for name, (cx, cy) in groups.items():
        points = rng.normal(loc=(cx, cy), scale=0.8, size=(120, 2))
        rows["pc 1"].extend(points[:, 0].tolist())
        rows["pc 2"].extend(points[:, 1].tolist())
        rows["part of speech"].extend([name] * len(points))
    return scatter(
        rows,
        x="pc 1",
        y="pc 2",
        hue="part of speech",
        xlabel="Principal component 1",
        ylabel="Principal component 2",
        title="Token embeddings",
    )


EXAMPLES: dict[str, Callable[[np.random.Generator], Figure]] = {
    "heatmap": heatmap_example,
    "bar": bar_example,
    "line": line_example,
    "scatter": scatter_example,
}


def render(out_dir: Path, seed: int = 0) -> list[Path]:
    """Write ``<name>.pdf`` and ``<name>.png`` for every example into ``out_dir``.

    Args:
        out_dir: Destination directory; created if missing.
        seed: Seed of the synthetic data.

    Returns:
        The files written, in order.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in EXAMPLES.items():
        fig = build(np.random.default_rng(seed))
        for suffix in (".pdf", ".png"):
            written.append(save(fig, out_dir / f"{name}{suffix}"))
    return written


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: ``python -m theseus.plot.gallery OUT_DIR [--seed N]``."""
    parser = argparse.ArgumentParser(prog="python -m theseus.plot.gallery", description=__doc__)
    parser.add_argument("out_dir", type=Path, help="directory to write the PDF and PNG files into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    args = parser.parse_args(argv)
    for path in render(args.out_dir, args.seed):
        print(path)


if __name__ == "__main__":
    main()
