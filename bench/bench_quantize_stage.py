"""The quantize stage's time against ONNX Runtime's own int4 quantizer on the same weights (issue 35).

    python bench/bench_quantize_stage.py [--recipe llama] [--repeat 7] [--block-size 32]
    python bench/bench_quantize_stage.py --recipe-file bench/recipes/qwen2_0_5b_quantize.yaml

One process. It builds the recipe with ``quantize.method=int4_block`` once (a cold cache in a
temporary folder), keeps the rewrite's published ``model.onnx`` and ``manifest.json``, and
exports the recipe's model flat (``torch.onnx.export(dynamo=True)`` on the recipe's inputs; the
TorchScript exporter refuses the tiny Llama's mask, ``aten::diff``).
Then, alternating ``--repeat`` rounds:

  stage  the quantize stage's body (``QuantizeStage.run`` on the rewrite's files: load, the
         pass, ONNX Runtime's support probe, save, the quantized manifest), fresh folder each
  ort    ``onnx.load`` of the flat export, ``MatMulNBitsQuantizer`` (same block size,
         asymmetric, the stage's ``accuracy_level``), ``save_model_to_file``
  pass   the stage's ``QuantizeMatMulsPass`` alone, on the rewrite's model already loaded
  ort quantizer  ``MatMulNBitsQuantizer.process`` alone, on the flat export already loaded

(the last two: each tool's quantization without its reading and writing of the model, which the
stage does through onnx_ir and ONNX Runtime's quantizer through protobuf)

and prints the medians of wall and CPU time (``time.process_time``) and their ratios. The build's
own ``quantize`` and ``evaluate`` wall times are printed beside them: evaluate runs the quantized
model against the float one in ONNX Runtime (whole and every call site), which is not the
quantizer's work. Ratios are what to read: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any


def _flat_export(recipe: Any, path: Path) -> None:
    """The recipe's model exported flat on its inputs (dynamo)."""
    import torch

    from hyperexport.product.from_recipe.model import model_loader

    model = model_loader(recipe)().eval()
    inputs = {}
    for name, spec in recipe.data["inputs"].items():
        generator = torch.Generator().manual_seed(int(spec["seed"]))
        low, high = int(spec["low"]), int(spec["high"])
        inputs[name] = torch.randint(low, high, spec["shape"], generator=generator)
    names = list(inputs)

    class Flat(torch.nn.Module):  # the recipe's inputs, by name
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, *args: torch.Tensor) -> Any:
            return self.inner(**dict(zip(names, args)))[0]

    with torch.no_grad():
        torch.onnx.export(
            Flat().eval(),
            tuple(inputs.values()),
            str(path),
            dynamo=True,
            opset_version=int(recipe.data["opset"]),
            input_names=list(inputs),
            # A model near 2 GB cannot be one protobuf; a small one stays inline, as before.
            external_data=sum(p.numel() * p.element_size() for p in model.parameters()) >= 1 << 30,
        )


def _time(run: Any) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="llama")
    parser.add_argument(
        "--recipe-file", type=Path, help="a recipe file instead of --recipe (bench/recipes/)"
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    import onnx
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    from hyperexport.engine.stage import StageInputs, config_slice
    from hyperexport.library.model_file import load_model
    from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass
    from hyperexport.product.builds.session import run_build
    from hyperexport.product.config import compose_recipe
    from hyperexport.product.stages import PIPELINE, model_loader
    from hyperexport.product.stages.quantize import QuantizeStage

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        overrides = [
            "quantize.method=int4_block",
            f"quantize.block_size={args.block_size}",
            f"build.cache_dir={root / 'cache'}",
            f"build.outputs_dir={root / 'out'}",
        ]
        if args.recipe_file is not None:
            recipe, settings = compose_recipe(overrides, recipe_file=args.recipe_file.resolve())
        else:
            recipe, settings = compose_recipe([f"recipe={args.recipe}", *overrides])
        outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
        assert outcome.exit_code == 0, outcome.result.error
        build = {s.name: round(s.seconds, 2) for s in outcome.result.stages}
        published = outcome.out_dir
        flat = root / "flat" / "model.onnx"
        flat.parent.mkdir()
        _flat_export(recipe, flat)

        stage = QuantizeStage()
        params = config_slice(recipe.data, stage.reads)
        inputs = StageInputs(
            upstream={"rewrite": published, "trace": published},
            model=lambda: None,
            source=recipe.file,
        )
        level = int(recipe.data["quantize"]["accuracy_level"])
        times: dict[str, list[tuple[float, float]]] = {
            "stage": [],
            "ort": [],
            "pass": [],
            "ort quantizer": [],
        }
        for round_ in range(args.repeat + 1):  # the first round warms imports and caches up
            out = root / f"stage{round_}"
            out.mkdir()
            stage_time = _time(lambda out=out: stage.run(params, inputs, out))

            def ort(round_: int = round_) -> None:
                quantizer = MatMulNBitsQuantizer(
                    onnx.load(flat),
                    algo_config=DefaultWeightOnlyQuantConfig(
                        block_size=args.block_size, is_symmetric=False, accuracy_level=level
                    ),
                )
                quantizer.process()
                quantizer.model.save_model_to_file(str(root / f"flat{round_}.onnx"))

            ort_time = _time(ort)
            model = load_model(published / "model.onnx")
            quantize = QuantizeMatMulsPass(
                "int4_block", args.block_size, accuracy_level=level, symmetric=False
            )
            pass_time = _time(lambda model=model, quantize=quantize: quantize(model))
            quantizer = MatMulNBitsQuantizer(
                onnx.load(flat),
                algo_config=DefaultWeightOnlyQuantConfig(
                    block_size=args.block_size, is_symmetric=False, accuracy_level=level
                ),
            )
            quantizer_time = _time(quantizer.process)
            if round_:
                times["stage"].append(stage_time)
                times["ort"].append(ort_time)
                times["pass"].append(pass_time)
                times["ort quantizer"].append(quantizer_time)
        median = {
            k: {
                "wall": statistics.median(t[0] for t in v),
                "cpu": statistics.median(t[1] for t in v),
            }
            for k, v in times.items()
        }
        print(
            json.dumps(
                {
                    "recipe": str(args.recipe_file or args.recipe),
                    "rounds": args.repeat,
                    "median_seconds": median,
                    "stage/ort": {
                        "wall": median["stage"]["wall"] / median["ort"]["wall"],
                        "cpu": median["stage"]["cpu"] / median["ort"]["cpu"],
                    },
                    "pass/ort quantizer": {
                        "wall": median["pass"]["wall"] / median["ort quantizer"]["wall"],
                        "cpu": median["pass"]["cpu"] / median["ort quantizer"]["cpu"],
                    },
                    "build_stage_seconds": build,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
