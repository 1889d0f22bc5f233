"""Sends chat completions with the official `openai` client, one after another, and prints
one JSON line per request: its status, the site that served it (`x-grid-site`), its
Retry-After, its content (the streamed chunks joined) and the error code of a refusal.

Arguments: base URL, how many requests, `plain` or `stream`, and the seconds the client
waits for each answer. Retries are off: a 429 or 503
must reach the caller as it was answered."""
import json
import sys

import openai
from openai import OpenAI

base_url, count, mode, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
client = OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, timeout=timeout)
messages = [{"role": "user", "content": "hi"}]

for _ in range(count):
    try:
        if mode == "stream":
            raw = client.chat.completions.with_raw_response.create(
                model="llama", messages=messages, stream=True
            )
            content = "".join(
                c.choices[0].delta.content or "" for c in raw.parse() if c.choices
            )
        else:
            raw = client.chat.completions.with_raw_response.create(model="llama", messages=messages)
            content = raw.parse().choices[0].message.content
        line = {
            "status": raw.http_response.status_code,
            "site": raw.headers.get("x-grid-site"),
            "headroom": raw.headers.get("x-llm-d-flow-band-headroom-requests"),
            "content": content,
        }
    except openai.APIStatusError as e:
        body = e.response.json()
        line = {
            "status": e.status_code,
            "site": e.response.headers.get("x-grid-site"),
            "retry_after": e.response.headers.get("retry-after"),
            "code": body["error"]["code"],
            "type": body["error"]["type"],
        }
    print(json.dumps(line), flush=True)
