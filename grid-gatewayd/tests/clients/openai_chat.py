"""Drives one non-streaming and one streaming chat completion through the gateway with the
official `openai` client. Prints one JSON line with what it got; any failure raises."""
import json
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["GATEWAY_BASE_URL"], api_key="sk-test", max_retries=0, timeout=10)

plain = client.chat.completions.with_raw_response.create(
    model="m", messages=[{"role": "user", "content": "hi"}]
)
completion = plain.parse()

chunks = []
with client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "hi"}], stream=True
) as stream:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks.append(chunk.choices[0].delta.content)

json.dump(
    {
        "content": completion.choices[0].message.content,
        "site": plain.headers.get("x-grid-site"),
        "stream": chunks,
    },
    sys.stdout,
)
