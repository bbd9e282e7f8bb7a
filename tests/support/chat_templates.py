"""ChatML, and a chat tokenizer: the tiny policy's character tokenizer plus ChatML's two special tokens
and a chat template (ChatML unless told), so that expected token lists can be written out as text."""

from lit_asyncrl.models.char_tokenizer import build_char_tokenizer

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Renders tools and tool messages itself, Qwen2.5-style: schemas in the system message, calls as
# <tool_call> blocks, consecutive tool messages grouped into one user message of <tool_response>s.
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n' }}{% endif %}"
    "{{ 'TOOLS:' }}{% for tool in tools %}{{ ' ' + tool['function']['name'] }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% if not tools %}{{ '<|im_start|>system\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' + message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer(template: str = CHATML):
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = template
    return tokenizer
