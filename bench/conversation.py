"""Times a conversation's turns against a running `niwaki serve`: a long system prompt, then
five short user turns, each request carrying the whole conversation so far (as chat clients
do). Prints each turn's time, prompt tokens and the prompt tokens the server took from the
slot's kept conversation (usage.prompt_tokens_details.cached_tokens).

    python3 bench/conversation.py http://127.0.0.1:8080 [RULES]

RULES (default 250) sets the system prompt's length. Standard library only."""

import json
import sys
import time
import urllib.error
import urllib.request


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req) as r:
            v = json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"HTTP {e.code}: {e.read().decode()}")
    return time.monotonic() - t, v


def main():
    base = sys.argv[1]
    rules = int(sys.argv[2]) if len(sys.argv) > 2 else 250
    with urllib.request.urlopen(base + "/v1/models") as r:
        model = json.load(r)["data"][0]["id"]
    system = " ".join(f"rule {i}: answer briefly and cite section {i % 17}." for i in range(rules))
    messages = [{"role": "system", "content": system}]
    for turn in range(5):
        messages.append({"role": "user", "content": f"question {turn}: what does section {turn} say?"})
        dt, v = post(base, {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0,
                            "chat_template_kwargs": {"enable_thinking": False}})
        u = v["usage"]
        reply = v["choices"][0]["message"]["content"]
        cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        print(f"turn {turn}: {dt * 1000:9.1f} ms  prompt {u['prompt_tokens']:6d}  cached {cached:6d}  "
              f"reply {json.dumps(reply)[:40]}")
        messages.append({"role": "assistant", "content": reply})


if __name__ == "__main__":
    main()
