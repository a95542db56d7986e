"""Each task's part in the trace and export stages (:class:`~hyperexport.library.tasks.task.TaskModel`):
what each graph is traced and exported from. Imported by those stages only (inside ``run``:
the parts load torch and transformers), so only their keys cover this code.
"""

from __future__ import annotations

from hyperexport.base.contracts.names import (
    FORWARD,
    SPEECH_RECOGNITION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)
from hyperexport.library.tasks.causal_lm import CausalLMModel
from hyperexport.library.tasks.encoder_decoder import EncoderDecoderModel
from hyperexport.library.tasks.task import ForwardModel, TaskModel

#: The trace's and export's part of every task, by name.
MODELS: dict[str, TaskModel] = {
    FORWARD: ForwardModel(),
    TEXT_GENERATION: CausalLMModel(),
    TEXT2TEXT_GENERATION: EncoderDecoderModel(),
    SPEECH_RECOGNITION: EncoderDecoderModel(),
}


def model_part(task: str) -> TaskModel:
    """The trace's and export's part of task ``task``."""
    return MODELS[task]
