"""Chat templates for tests.

THINKING_GEMMA: Gemma's turns, with a `<think>` block opened in the generation prompt when
thinking is on (`enable_thinking`) and past reasoning rendered back. The default Gemma never
closes the block, so everything it writes under this template is reasoning, which makes a
reasoning split exact to check. Give it to a model as a file: `templates: {template: PATH}`.
"""

from __future__ import annotations

THINKING_GEMMA = """{{- bos_token -}}
{%- for message in messages -%}
{{- '<start_of_turn>' ~ ('model' if message['role'] == 'assistant' else 'user') ~ '\\n' -}}
{%- if message['reasoning_content'] -%}
{{- '<think>' ~ message['reasoning_content'] ~ '</think>' -}}
{%- endif -%}
{{- (message['content'] or '') ~ '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\\n' -}}{%- if enable_thinking -%}{{- '<think>\\n' -}}{%- endif -%}
{%- endif -%}
"""
