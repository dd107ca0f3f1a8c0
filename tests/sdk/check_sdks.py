"""The official OpenAI and Anthropic Python SDKs, talking to residue.

Run by tests/it/sdk.rs with residue's address; residue forwards to a fake
upstream that answers in each API's real shape. Exits non-zero on any
mismatch.
"""

import sys

import anthropic
import openai

base = sys.argv[1]

oa = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-openai-sdk", max_retries=0, timeout=10)
resp = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello"}])
assert resp.choices[0].message.content == "Hello from upstream", resp
assert resp.usage.prompt_tokens == 3, resp.usage
chunks = oa.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "Say hello"}], stream=True
)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == "Hello from upstream", text

an = anthropic.Anthropic(base_url=base, api_key="sk-ant-sdk", max_retries=0, timeout=10)
msg = an.messages.create(
    model="claude", max_tokens=16, messages=[{"role": "user", "content": "Say hello"}]
)
assert msg.content[0].text == "Hello from upstream", msg
assert msg.usage.input_tokens == 3, msg.usage
with an.messages.stream(
    model="claude", max_tokens=16, messages=[{"role": "user", "content": "Say hello"}]
) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text == "Hello from upstream", text
assert final.stop_reason == "end_turn", final

print("sdk checks ok")
