"""A copy of the default model (SmolLM2) that speaks gpt-oss's harmony format, for tests: seven
of its unused control tokens renamed to harmony's markers, and gpt-oss's own chat template
(tests/data/gpt-oss.jinja, from llama.cpp's models/templates). llama.cpp treats the markers by
their text as it does gpt-oss's (`<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>`
and, in this llama.cpp, `<|end|>` user-defined and rendered as text; `<|return|>` and
`<|call|>` ending generation), so the worker's harmony path runs as with gpt-oss; the weights are
SmolLM2's, which never learned the format: a test that needs the answer after the thinking
opens the analysis message in the prompt (`opening_template`) and ends it with a thinking
budget."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFReader, GGUFWriter

from worker.settings import default_model_path
from worker.text import harmony

TEMPLATE = Path(__file__).resolve().parent / "data" / "gpt-oss.jinja"
UNUSED = range(3, 10)  # SmolLM2's <repo_name> .. <issue_start>: control tokens no prompt uses
GENERATION_PROMPT = "{%- if add_generation_prompt -%}\n<|start|>assistant\n{%- endif -%}"


def write(out: Path) -> Path:
    """The harmony copy of the default model, at `out`."""
    source = GGUFReader(default_model_path())
    w = GGUFWriter(out, source.fields["general.architecture"].contents())
    for name, field in source.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer's own
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            value = list(value)
            for i, marker in zip(UNUSED, harmony.MARKERS, strict=True):
                value[i] = marker
        elif name == "tokenizer.chat_template":
            value = TEMPLATE.read_text()
        sub = field.types[-1] if len(field.types) > 1 else None
        w.add_key_value(name, value, field.types[0], sub_type=sub)
    for tensor in source.tensors:
        w.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tensor in source.tensors:
        w.write_tensor_data(tensor.data)
    w.close()
    return out


def opening_template(out: Path) -> Path:
    """gpt-oss's template with the analysis message opened in the generation prompt (the
    output starts inside the thinking, as a template that opens it would leave it)."""
    text = TEMPLATE.read_text()
    if GENERATION_PROMPT not in text:
        raise ValueError("tests/data/gpt-oss.jinja's generation prompt is not where it was")
    opened = GENERATION_PROMPT.replace(
        "<|start|>assistant", "<|start|>assistant<|channel|>analysis<|message|>"
    )
    out.write_text(text.replace(GENERATION_PROMPT, opened))
    return out
