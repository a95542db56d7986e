"""The README's snippets run as written.

"Two commands": the test command is the one ``.ci/run`` runs. "Export your Hugging Face model":
each recipe validates as it stands (fast), and builds on the first try on a tiny checkpoint that
``save_pretrained`` wrote (slow); the test substitutes the checkpoint's path and nothing else of
the recipe (the encoder-decoder recipe also builds T5, and Whisper with the two fields the prose
says to change), runs the section's commands as they are from the folder holding the recipe files,
and keeps the build in its temporary directory with build settings (``build.*`` never changes
what is built). Every file the section says a folder holds must be there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hyperexport.base import versions
from hyperexport.base.contracts.names import TEXT_GENERATION
from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.registry import TASKS
from hyperexport.product.config.validate import validate_recipe
from tests.helpers.cli import REPO

README = REPO / "README.md"
SECTION = "## Export your Hugging Face model"
#: The tiny checkpoint each recipe's ``model.path`` is replaced by: transformers class, config,
#: seed. BART's seed and weight scale give a greedy decode whose tokens vary (as zoo_bart's).
CHECKPOINTS = {
    "my_llama": (
        "LlamaForCausalLM",
        {
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
        0,
    ),
    "my_bert": (
        "BertModel",
        {
            "vocab_size": 128,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
        0,
    ),
    "my_bart": (
        "BartForConditionalGeneration",
        {
            "vocab_size": 128,
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "max_position_embeddings": 64,
            "bos_token_id": 0,
            "pad_token_id": 1,
            "eos_token_id": 2,
            "decoder_start_token_id": 2,
            "init_std": 0.5,
        },
        1,
    ),
    "my_vit": (
        "ViTModel",
        {
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
        0,
    ),
}


#: Other checkpoints the section's prose says a recipe takes: (recipe, checkpoint) -> its tiny
#: checkpoint, and the fields the prose says to change for it. T5's seed and scale decode varied
#: tokens (as zoo_t5's); its first decoder layer passes on a position bias of zeros by
#: construction, which the check judges by equality: no accept_vacuous.
ALSO = {
    ("my_bart", "t5"): (
        (
            "T5ForConditionalGeneration",
            {
                "vocab_size": 128,
                "d_model": 64,
                "d_kv": 16,
                "d_ff": 128,
                "num_layers": 2,
                "num_heads": 4,
                "decoder_start_token_id": 0,
                "pad_token_id": 0,
                "eos_token_id": 1,
                "initializer_factor": 5.0,
            },
            25,
        ),
        {},
    ),
    ("my_bart", "whisper"): (
        (
            "WhisperForConditionalGeneration",
            {
                "vocab_size": 128,
                "d_model": 64,
                "encoder_layers": 2,
                "decoder_layers": 2,
                "encoder_attention_heads": 4,
                "decoder_attention_heads": 4,
                "encoder_ffn_dim": 128,
                "decoder_ffn_dim": 128,
                "num_mel_bins": 16,
                "max_source_positions": 30,
                "max_target_positions": 64,
                "bos_token_id": 0,
                "pad_token_id": 1,
                "eos_token_id": 2,
                "decoder_start_token_id": 3,
                "init_std": 0.5,
                "suppress_tokens": None,
                "begin_suppress_tokens": None,
            },
            2,
        ),
        {"task": "automatic-speech-recognition", "auto_class": "AutoModelForSpeechSeq2Seq"},
    ),
}


@dataclass(frozen=True)
class Example:
    """One recipe of the section: its file, its text, its commands, the files it promises."""

    name: str
    file: str
    text: str
    commands: tuple[str, ...]
    files: tuple[str, ...]


def _blocks(text: str) -> Iterator[tuple[str, str, int]]:
    """Fenced blocks of ``text``: (language, body, end offset)."""
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):
        yield m.group(1), m.group(2), m.end()


def _section(text: str) -> str:
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return text[start:end]


def examples() -> list[Example]:
    """The section's recipes: each YAML block named by its first line (``# my_x.yaml``), the
    bash block after it, and the files the prose up to the next recipe names."""
    section = _section(README.read_text(encoding="utf-8"))
    blocks = list(_blocks(section))
    found = []
    for i, (lang, body, _end) in enumerate(blocks):
        first = body.splitlines()[0]
        if lang != "yaml" or not re.fullmatch(r"# [\w.-]+\.yaml", first):
            continue
        file = first[2:]
        lang2, command, end2 = blocks[i + 1]
        assert lang2 == "bash", f"{file}: no command after the recipe"
        following = [b for b in blocks[i + 2 :] if b[0] == "yaml"]
        stop = section.index("```yaml", end2) if following else len(section)
        prose = section[end2:stop]
        named = re.findall(r"`([\w.]+\.(?:onnx|json|txt|html))`", prose)
        found.append(
            Example(
                name=yaml.safe_load(body).get("name", Path(file).stem),
                file=file,
                text=body,
                commands=tuple(line for line in command.splitlines() if line.strip()),
                files=tuple(dict.fromkeys(named)),
            )
        )
    return found


EXAMPLES = examples()


def test_the_section_covers_the_four_kinds_of_model() -> None:
    assert sorted(e.name for e in EXAMPLES) == sorted(CHECKPOINTS)
    for example in EXAMPLES:
        assert example.files, f"{example.file}: the README names no file of its output folder"


def test_no_doc_holds_a_recipe_file_the_walk_misses() -> None:
    """A snippet marked as a recipe file (first line ``# <name>.yaml``, a ``model`` key) is
    built by this test only in the README's section; docs/ hold fragments of recipes."""
    for doc in sorted((REPO / "docs").glob("*.md")):
        for lang, body, _ in _blocks(doc.read_text(encoding="utf-8")):
            first = body.splitlines()[0] if body else ""
            if lang == "yaml" and re.fullmatch(r"# [\w.-]+\.yaml", first):
                assert "model" not in (yaml.safe_load(body) or {}), (
                    f"{doc.name}: recipe {first[2:]} is not built by tests/test_readme.py"
                )


def test_the_test_command_is_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    two = text[text.index("## Two commands") : text.index(SECTION)]
    commands = [body.strip() for lang, body, _ in _blocks(two) if lang == "bash"]
    assert len(commands) == 2
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci, "the README's test command is not the line .ci/run runs"


def test_ci_stops_when_a_step_of_the_test_command_fails(tmp_path: Path) -> None:
    """Under ``set -e`` bash goes on after an ``&&`` list whose failing command is not the last
    (a mypy error skipped the tests and CI still passed): ``.ci/run`` checks the list's status.
    The script up to the next command, run with the test command's steps replaced by a failing
    one in the middle."""
    text = README.read_text(encoding="utf-8")
    two = text[text.index("## Two commands") : text.index(SECTION)]
    command = [body.strip() for lang, body, _ in _blocks(two) if lang == "bash"][1]
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    at = lines.index(command)
    after = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("#"))
    # Only that check runs here, never what follows it (the next line may start a leg).
    assert lines[after].startswith("status=$?"), "no status check right after the test command"
    for steps, expected in (("true && false && true", 1), ("true && true && true", 0)):
        script = ["set -euo pipefail", steps, *lines[at + 1 : after + 1], "echo reached"]
        path = tmp_path / "run"
        path.write_text("\n".join(script) + "\n", encoding="utf-8")
        done = subprocess.run(["bash", str(path)], capture_output=True, text=True)
        assert done.returncode == expected, done.stderr
        assert ("reached" in done.stdout) == (expected == 0)


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 210


def _with_checkpoint(example: Example, path: Path) -> str:
    """The recipe with its ``path:`` replaced by ``path``: the one substitution."""
    text, count = re.subn(r"(path: )/models/[\w.-]+", rf"\g<1>{path}", example.text)
    assert count == 1, f"{example.file}: expected one /models/... checkpoint path"
    return text


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_each_recipe_validates_as_written(example: Example, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()  # validation reads no checkpoint file: task is explicit in each
    recipe = tmp_path / example.file
    recipe.write_text(_with_checkpoint(example, checkpoint))
    data = yaml.safe_load(recipe.read_text())
    task = TASKS.get(data.get("task", ""))
    decoding = data.get("task") == TEXT_GENERATION or (task is not None and bool(task.graphs))
    if decoding and (missing := versions.decoding_task_missing(data["task"])):
        with pytest.raises(RecipeError) as refused:  # one line, on a transformers before 4.57
            validate_recipe(data, str(recipe))
        assert (refused.value.field, refused.value.reason) == ("task", missing)
        return
    validated = validate_recipe(data, str(recipe))
    assert validated.name == example.name


def test_the_prose_says_what_each_other_checkpoint_changes() -> None:
    section = _section(README.read_text(encoding="utf-8"))
    for _, edits in ALSO.values():
        said = " and ".join(f"`{field}: {value}`" for field, value in edits.items())
        assert said in section, f"the README no longer says {said}"


def _edited(text: str, edits: dict[str, str]) -> str:
    """``text`` with each ``field: value`` of ``edits`` set (a flow mapping's key too)."""
    for field, value in edits.items():
        text, count = re.subn(rf"(\b{field}: )[\w-]+", rf"\g<1>{value}", text)
        assert count == 1, f"{field}: expected once in the recipe"
    return text


def _save_checkpoint(spec: tuple[str, dict[str, object], int], folder: Path) -> None:
    from hyperexport.zoo import random_transformer

    model_class, config, seed = spec
    random_transformer(model_class, config, seed=seed).save_pretrained(folder)


BUILDS = [(e, e.name, CHECKPOINTS[e.name], {}) for e in EXAMPLES] + [
    (next(e for e in EXAMPLES if e.name == name), f"{name}-{kind}", spec, edits)
    for (name, kind), (spec, edits) in ALSO.items()
]


@pytest.mark.slow
@pytest.mark.parametrize(("example", "label", "spec", "edits"), BUILDS, ids=[b[1] for b in BUILDS])
def test_each_recipe_builds_on_the_first_try(
    example: Example,
    label: str,
    spec: tuple[str, dict[str, object], int],
    edits: dict[str, str],
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "checkpoints" / label
    _save_checkpoint(spec, checkpoint)
    work = tmp_path / "work"
    work.mkdir()
    (work / example.file).write_text(_edited(_with_checkpoint(example, checkpoint), edits))
    outputs = tmp_path / "outputs"
    env = {**os.environ, "HYPEREXPORT_CACHE_DIR": str(tmp_path / "cache")}
    for command in example.commands:
        assert command.startswith("python -m hyperexport "), command
        proc = subprocess.run(
            ["bash", "-c", f"{command} build.outputs_dir={outputs}"],
            cwd=work,
            env={**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = outputs / example.name / "default"
    missing = [f for f in example.files if not (folder / f).is_file()]
    assert not missing, f"{example.name}: the README names {missing}, not in {folder}"
