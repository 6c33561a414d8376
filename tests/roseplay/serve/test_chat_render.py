"""The play template (roseplay/serve/chat.py) rendered by jinja2 itself equals what
transformers' apply_chat_template makes of it, and rendering it loads no transformers."""
from __future__ import annotations

import subprocess
import sys

import pytest

from engine.tokenizer import DEFAULT_MODEL_DIR, load_tokenizer_dir
from roseplay.serve import chat

CALL = {"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Vérone <b>&\'x\'", "n": 2}'}}
CHATS = [
    [{"role": "user", "content": "What news from the court?"}],
    [{"role": "system", "content": "A street in Verona."},
     {"role": "user", "content": "Wherefore art thou?"},
     {"role": "assistant", "content": "Here, <love> & 'night'."},
     {"role": "user", "content": "Swear not by the moon."}],
    [{"role": "developer", "content": "Be brief."},
     {"role": "user", "content": "Is it raining?"},
     {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
     {"role": "tool", "tool_call_id": "c1", "content": "rain, 12 °C"},
     {"role": "user", "content": "Then stay."}],
]


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CHATS)
def test_the_play_template_renders_as_transformers_does(messages, generation_prompt):
    tok = load_tokenizer_dir(str(DEFAULT_MODEL_DIR))
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    want = tok.apply_chat_template(messages, chat_template=chat.PLAY_TEMPLATE, tokenize=False,
                                   add_generation_prompt=generation_prompt, tools=tools)
    text, ids = chat.render(tok, chat.PLAY_TEMPLATE, messages, generation_prompt, tools)
    assert text == want
    assert ids == tok.encode(want, add_special_tokens=False)


def test_rendering_the_play_template_loads_no_transformers():
    """What made the first chat request of `roseplay serve` on the bundled model take ~5 s."""
    code = ("import sys\n"
            "from engine.tokenizer import DEFAULT_MODEL_DIR, load_tokenizer_dir\n"
            "from roseplay.serve import chat\n"
            "tok = load_tokenizer_dir(str(DEFAULT_MODEL_DIR))\n"
            "template = chat.pick_template(tok)\n"
            "assert template == chat.PLAY_TEMPLATE\n"
            "text, _ = chat.render(tok, template, [{'role': 'user', 'content': 'Hail'}])\n"
            "assert text == 'ROMEO.\\nHail\\n\\nJULIET.\\n', text\n"
            "assert 'transformers' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
