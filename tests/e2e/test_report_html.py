"""report.html: written beside report.json by every build, checked in a real headless browser."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import versions
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.product.builds import report_html
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.builds.summary import size_text
from hyperexport.product.config import BuildSettings, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.builds import build_composed
from tests.helpers.release_skips import NEEDS_DECODING_TASKS, NEEDS_QWEN3

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (apt-get install chromium; .ci/run does it)",
)
needs_graphviz = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="Graphviz (dot) is not installed (apt-get install graphviz; .ci/run does it)",
)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> BuildOutcome:
    """A 2-layer Llama with nested hiera, its decoder layers found by hiera: auto."""
    root = tmp_path_factory.mktemp("html")
    data: dict[str, Any] = {
        "name": "html",
        "model": {"_target_": "hyperexport.zoo.tiny_llama", "num_layers": 2, "seed": 0},
        "inputs": "auto",
        "hiera": "auto",
        "dynamo": False,
    }
    recipe = validate_recipe(data, str(root / "html.yaml"))
    settings = BuildSettings(str(root / "cache"), root / "out", False, ())
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.result.error
    return outcome


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> BuildOutcome:
    """A 2-layer Qwen3 for generation, quantized to int4: a quantized check, a decode check."""
    root = tmp_path_factory.mktemp("html_quantized")
    overrides = ["recipe=zoo_qwen3_generate", "quantize.method=int4_block"]
    outcome = build_composed([*overrides, "generation.max_new_tokens=6"], root)
    assert outcome.exit_code == 0, outcome.result.error
    return outcome


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_page_is_written_beside_the_report(build: BuildOutcome) -> None:
    page = (build.out_dir / report_html.REPORT_HTML).read_text()
    assert (build.out_dir / "report.json").is_file()
    assert build.report is not None
    for f in build.report["functions"]:
        assert f["function"] in page  # in the embedded data and the text tree
    assert "LlamaDecoderLayer" in page and "why it ran" in page
    assert "last_hidden_state" in page and "per function" in page
    assert "hiera: transformers.models.llama.modeling_llama.LlamaDecoderLayer" in page


@needs_chromium
def test_the_browser_renders_the_function_tree(build: BuildOutcome) -> None:
    url = (build.out_dir / report_html.REPORT_HTML).as_uri()
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", url).stdout
    assert build.report is not None
    functions = build.report["functions"]
    # Only the page's script makes these <li> (the static page has a <noscript> text copy).
    rendered = re.findall(r'<li class="fn" data-function="([^"]+)"', dom)
    assert sorted(rendered) == sorted(f["function"] for f in functions)
    assert f'data-rendered="{len(functions)}"' in dom


@needs_chromium
def test_the_screenshot_is_not_blank(build: BuildOutcome, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    url = (build.out_dir / report_html.REPORT_HTML).as_uri()
    _chromium("--window-size=1200,1400", f"--screenshot={shot}", url)
    width, height, pixels = _decode_png(shot.read_bytes())
    assert (width, height) == (1200, 1400)
    inked = sum(1 for p in pixels if p[:3] != (255, 255, 255))
    assert inked > 0.01 * len(pixels)  # text, tables and the picture cover > 1% of the page
    assert len(set(pixels)) > 20  # anti-aliased text and coloured status words


@needs_chromium
@NEEDS_DECODING_TASKS  # the quantized fixture: zoo_qwen3_generate
@NEEDS_QWEN3
def test_the_screenshot_shows_the_quantized_and_generation_sections(
    quantized: BuildOutcome, tmp_path: Path
) -> None:
    """The browser renders each new section with content (tables with rows), and a screenshot
    of each shows it: inked, with its green verdict."""
    url = (quantized.out_dir / report_html.REPORT_HTML).as_uri()
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", url).stdout
    for section in ("quantized-check", "generation-check"):
        body = dom[dom.index(f'<section id="{section}">') :]
        body = body[: body.index("</section>")]
        assert body.count("<tr>") > 2 and '<span class="ok">ok</span>' in body
    assert 'id="models-table"' in dom and "model.quantized.onnx" in dom
    assert "MatMulNBits" in dom[dom.index('<h2 id="ops">') :]
    # Each section alone (a copy of the page with the rest hidden): a screenshot shows it.
    page = (quantized.out_dir / report_html.REPORT_HTML).read_text()
    shots = []
    for section in ("quantized-check", "generation-check"):
        alone = tmp_path / f"{section}.html"
        hide = f"<style>body > :not(#{section}) {{ display: none !important; }}</style>"
        alone.write_text(page.replace("</head>", hide + "</head>", 1))
        shot = tmp_path / f"{section}.png"
        _chromium("--window-size=1200,900", f"--screenshot={shot}", alone.as_uri())
        width, height, pixels = _decode_png(shot.read_bytes())
        assert (width, height) == (1200, 900)
        inked = sum(1 for p in pixels if p[:3] != (255, 255, 255))
        assert inked > 0.01 * len(pixels), section  # headings, tables and numbers
        assert any(p[:3] == (0x17, 0x6F, 0x2C) for p in pixels), section  # a green "ok"
        shots.append(pixels)
    assert shots[0] != shots[1]


@NEEDS_DECODING_TASKS  # the quantized fixture: zoo_qwen3_generate
@NEEDS_QWEN3
def test_the_page_lists_both_models_and_the_quantized_ones_size(quantized: BuildOutcome) -> None:
    assert quantized.report is not None
    page = (quantized.out_dir / report_html.REPORT_HTML).read_text()
    files = quantized.report["files"]
    float_size = sum(i["size"] for n, i in files.items() if n.startswith("model.onnx"))
    q_size = sum(i["size"] for n, i in files.items() if n.startswith("model.quantized.onnx"))
    assert 0 < q_size < float_size
    overview = page[page.index('<table id="overview">') : page.index('<h2 id="models">')]
    assert f"{size_text(q_size)} (quantized int4_block, model.quantized.onnx)" in overview
    models = page[page.index('<table id="models-table">') :]
    models = models[: models.index("</table>")]
    assert size_text(float_size) in models and size_text(q_size) in models
    assert "generation_check.json" in page and "tokens identical" in page
    quantized_ops = quantized.report["ops"]["quantized"]
    assert quantized_ops and all(ops.get("MatMulNBits") for ops in quantized_ops.values())


@NEEDS_DECODING_TASKS  # the quantized fixture: zoo_qwen3_generate
@NEEDS_QWEN3
def test_the_summary_names_both_published_models(quantized: BuildOutcome) -> None:
    lines = (quantized.out_dir / "summary.txt").read_text().splitlines()
    out = quantized.out_dir
    assert lines[-1] == (
        f"model: {out / 'model.onnx'} (float), "
        f"{out / 'model.quantized.onnx'} (quantized int4_block)"
    )
    assert any(line.startswith("  model.quantized.onnx (quantized int4_block): ") for line in lines)
    assert any("quantized check passed" in line for line in lines)
    assert any(line.strip().startswith("generation prompt 0:") for line in lines)


def test_the_quantized_decode_and_the_fused_ops_are_shown_when_present() -> None:
    """``check.json``'s ``quantized.decode`` (written by checks that decode the quantized
    model) and ``ops.fused`` (rewrite.fuse) get their own tables; absent, nothing is shown."""
    decode = {
        "passed": False,
        "gate": True,
        "thresholds": {"min_token_agreement": 0.9, "min_decode_cosine": 0.99},
        "runtime": "onnxruntime-genai",
        "token_agreement": 0.8125,
        "min_cosine": 0.9731,
        "sequences": [
            {
                "name": "prompt 0",
                "steps": 16,
                "agreeing_steps": 13,
                "token_agreement": 0.8125,
                "min_cosine": 0.9731,
            },
        ],
    }
    report: dict[str, Any] = {
        "recipe": {"name": "q", "file": "q.yaml"},
        "status": "ok",
        "stages": [],
        "functions": [],
        "check": {"ok": True, "quantized": {"passed": False, "comparison": {}, "decode": decode}},
        "ops": {"fused": {"f::Layer": {"com.microsoft::GroupQueryAttention": 1}}},
        "artifacts": {},
    }
    page = report_html.render_report_html(report)
    part = page[page.index('<div id="quantized-decode">') :]
    assert "0.8125" in part and "0.9731" in part and "<td>prompt 0</td>" in part
    assert "min_decode_cosine 0.99" in part and '<span class="bad">FAILED</span>' in part
    ops = page[page.index('<h2 id="ops">') :]
    assert "com.microsoft::GroupQueryAttention" in ops and "<td>fused</td>" in ops
    del report["check"]["quantized"]["decode"], report["ops"]
    page = report_html.render_report_html(report)
    assert "quantized-decode" not in page and 'id="ops"' not in page


def test_without_graphviz_the_hierarchy_is_text(
    build: BuildOutcome, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert build.report is not None
    monkeypatch.setattr(report_html.shutil, "which", lambda name: None)
    assert report_html.hierarchy_svg(build.report) is None
    page = report_html.render_report_html(build.report, picture=None)
    assert '<p id="hierarchy-text">' in page and "Graphviz is not installed" in page
    # the function tree is printed once: its text copy (for readers without scripts) only
    first = report_html.render_tree(build.report["functions"])[0].strip()
    assert page.count(report_html._e(first)) == 1


@needs_graphviz
def test_with_graphviz_the_hierarchy_is_a_picture(build: BuildOutcome) -> None:
    assert build.report is not None
    svg = report_html.hierarchy_svg(build.report)
    assert svg is not None and svg.startswith("<svg")
    assert svg.count('class="node"') == len(build.report["functions"]) + 1  # + main graph


def test_a_failed_build_and_hostile_names_are_escaped() -> None:
    report = {
        "recipe": {"name": "bad", "file": "x.yaml"},
        "status": "failed",
        "error": "stage 'export' failed: <b>boom</b>",
        "stages": [{"name": "trace", "status": "failed", "reason": "", "seconds": 0.1}],
        "functions": [
            {
                "function": "f::A",
                "class": "m.<script>alert(1)</script>",
                "calls": 1,
                "module_paths": [],
                "parent": None,
            },
        ],
        "check": None,
        "artifacts": {},
    }
    page = report_html.render_report_html(report)
    assert "<b>boom</b>" not in page and "&lt;b&gt;boom&lt;/b&gt;" in page
    assert "<script>alert(1)</script>" not in page
    assert "FAILED" in page and "no check ran" in page


def _decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """RGB(A) pixels of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6)
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (
                    line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)
                ) & 255
        rows.append(line)
        previous = line
    pixels = [
        tuple(row[i : i + channels]) for row in rows[::4] for i in range(0, stride, 4 * channels)
    ]
    return width, height, pixels


def test_a_rebuild_with_the_same_hierarchy_reuses_the_picture(
    build: BuildOutcome, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Needs no Graphviz: the first picture is a stand-in, what is proven is its reuse."""
    assert build.report is not None
    # The build wrote a page already (with Graphviz, a real picture of the same hierarchy, which
    # would be reused): start from none, so the stand-in is drawn first.
    (build.out_dir / report_html.REPORT_HTML).unlink(missing_ok=True)
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: "<svg>zero</svg>")
    report_html.write_report_html(build.out_dir, build.report)
    before = (build.out_dir / report_html.REPORT_HTML).read_text()
    assert "<svg>zero</svg>" in before
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: pytest.fail("re-rendered"))
    report_html.write_report_html(build.out_dir, build.report)
    assert (build.out_dir / report_html.REPORT_HTML).read_text() == before
    changed = {**build.report, "functions": build.report["functions"][:1]}
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: "<svg>one</svg>")
    report_html.write_report_html(build.out_dir, changed)
    assert "<svg>one</svg>" in (build.out_dir / report_html.REPORT_HTML).read_text()


def test_a_new_publication_reuses_a_sibling_publications_picture(
    build: BuildOutcome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant that differs only in ``check.*`` is a new folder under ``.builds/`` with the
    same hierarchy: its page takes the picture of the recipe's other publication."""
    assert build.report is not None
    builds = tmp_path / "recipe" / ".builds"
    first, second = builds / "default.1", builds / "check.atol=0.001.2"
    for folder in (first, second):
        shutil.copytree(build.out_dir, folder)
        (folder / report_html.REPORT_HTML).unlink(missing_ok=True)
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: "<svg>sibling</svg>")
    report_html.write_report_html(first, build.report)
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: pytest.fail("re-rendered"))
    report_html.write_report_html(second, build.report)
    assert "<svg>sibling</svg>" in (second / report_html.REPORT_HTML).read_text()
    # outside .builds/ the folder's neighbours are not publications: not looked at
    alone = tmp_path / "alone"
    shutil.copytree(build.out_dir, alone)
    (alone / report_html.REPORT_HTML).unlink(missing_ok=True)
    monkeypatch.setattr(report_html, "hierarchy_svg", lambda report: "<svg>own</svg>")
    report_html.write_report_html(alone, build.report)
    assert "<svg>own</svg>" in (alone / report_html.REPORT_HTML).read_text()


def test_the_page_says_what_was_built_and_with_what(build: BuildOutcome) -> None:
    """Versions, opset, overrides, inputs and outputs with shapes and dtypes, size, date."""
    assert build.report is not None
    report_html.write_report_html(build.out_dir, build.report)
    page = (build.out_dir / report_html.REPORT_HTML).read_text()
    overview = page[page.index('<table id="overview">') : page.index('<h2 id="io">')]
    env = build.report["environment"]
    for name, version in env["packages"].items():
        assert f"{name} {version}" in overview
    opset = versions.torchscript_opset(DEFAULT_OPSET)  # the recipe leaves it unset
    assert re.search(rf"<th>opset</th><td>{opset}</td>", overview)
    assert "none (the recipe as written)" in overview
    assert re.search(r"<th>built</th><td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", overview)
    size = sum(
        info["size"]
        for name, info in build.report["files"].items()
        if name.startswith("model.onnx")
    )
    assert size > 0 and size_text(size) in overview
    io = build.report["io"]
    import onnx

    graph = onnx.load(str(build.out_dir / "model.onnx"), load_external_data=False).graph
    first = graph.input[0]
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim]
    assert io["inputs"][0]["name"] == first.name and io["inputs"][0]["shape"] == dims
    assert len(io["outputs"]) == len(graph.output)
    for t in io["inputs"] + io["outputs"]:
        assert f"<td>{t['name']}</td><td>{t['shape']}</td><td>{t['dtype']}</td>" in page
