"""The official `openai` client against a running `niwaki serve` (tiny synthetic model).

Requests whose last user message contains a probe word from script.json get a scripted reply:
the server forces those tokens through the real sampler, detokenizer, reasoning/tool-call parser
and SSE path, so replies are deterministic on a random model."""

import json
import threading
import time

import httpx
import jsonschema
import openai
import pytest

from conftest import metric

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def user(text):
    return [{"role": "user", "content": text}]


def test_models_lists_the_served_model(client, model_id):
    models = client.models.list().data
    assert [m.id for m in models] == [model_id]


def test_health_is_ok(http):
    r = http.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_chat_returns_a_message_and_usage(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=user("Hello"), max_tokens=12, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    c = r.choices[0]
    assert r.object == "chat.completion"
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_conversations_next_turn_goes_on_from_its_cached_start(client, model_id):
    def turn(messages):
        return client.chat.completions.create(
            model=model_id, messages=messages, max_tokens=6, temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    messages = [{"role": "system", "content": "cache probe"}] + user("Hello")
    first = turn(messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    messages += [{"role": "assistant", "content": first.choices[0].message.content}] + user("More")
    second = turn(messages)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    # The first request's prompt, up to its reply's opening.
    assert cached < first.usage.prompt_tokens


def test_chat_streams_chunks_then_usage(client, model_id):
    stream = client.chat.completions.create(
        model=model_id, messages=user("Hello"), max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] or finishes == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens <= 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    again = client.chat.completions.create(
        model=model_id, messages=user("Hello"), max_tokens=10, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert text == again.choices[0].message.content


def test_raw_sse_ends_with_done(http, model_id):
    body = {"model": model_id, "messages": user("Hi"), "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    for d in data[:-1]:
        assert json.loads(d)["object"] == "chat.completion.chunk"


def test_completions_non_streaming_and_streaming_agree(client, model_id):
    r = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=16,
                                  temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens <= 16
    s = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=16,
                                  temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(s)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_stop_string_ends_the_reply_and_is_not_shown(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=user("stop-probe"), stop=["STOP"], max_tokens=50,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "alpha beta "
    assert r.choices[0].finish_reason == "stop"


def test_stop_string_when_streaming(client, model_id):
    s = client.chat.completions.create(
        model=model_id, messages=user("stop-probe"), stop="STOP", max_tokens=50, stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    chunks = list(s)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "STOP" not in text and text.startswith("alpha beta")


def test_same_seed_same_text_and_other_seed_other_text(client, model_id):
    def ask(seed):
        return client.completions.create(model=model_id, prompt="The", max_tokens=24,
                                         temperature=1.0, seed=seed).choices[0].text
    a, b, c = ask(11), ask(11), ask(12)
    assert a == b
    assert a != c


def test_chat_logprobs(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=user("Hi"), max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token or t.bytes


def test_completion_logprobs(client, model_id):
    r = client.completions.create(model=model_id, prompt="Hi", max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_streamed_completion_logprobs_match_the_whole_answer(client, model_id):
    whole = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=12,
                                      temperature=0, logprobs=2)
    s = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=12,
                                  temperature=0, logprobs=2, stream=True,
                                  stream_options={"include_usage": True})
    chunks = list(s)
    lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    tokens = [t for lp in lps for t in lp.tokens]
    offsets = [o for lp in lps for o in lp.text_offset]
    assert tokens == whole.choices[0].logprobs.tokens
    # Offsets count over the whole stream, not from each chunk's start.
    assert offsets == whole.choices[0].logprobs.text_offset
    assert len(tokens) == chunks[-1].usage.completion_tokens


def test_streamed_chat_logprobs_match_the_whole_answer(client, model_id):
    args = dict(model=model_id, messages=user("Hi"), max_tokens=8, temperature=0, logprobs=True,
                top_logprobs=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert streamed == [t.token for t in whole.choices[0].logprobs.content]
    assert len(streamed) == chunks[-1].usage.completion_tokens
    assert chunks[-1].choices == []


def test_tool_call_is_parsed(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=user("What is the weather in Paris?"),
                                       tools=[WEATHER_TOOL], max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content in (None, "")
    assert "<tool_call>" not in (c.message.content or "")
    [call] = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert "call the tool" in c.message.model_extra["reasoning_content"]


def test_tool_call_when_streaming_never_leaks_tags(client, model_id):
    s = client.chat.completions.create(model=model_id, messages=user("What is the weather in Paris?"),
                                       tools=[WEATHER_TOOL], max_tokens=200, stream=True)
    content, calls, finish = "", [], None
    for chunk in s:
        d = chunk.choices[0].delta
        content += d.content or ""
        calls += d.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    assert "<" not in content and "tool_call" not in content
    assert finish == "tool_calls"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] == "Paris"


def test_tool_results_go_back_through_the_template(client, model_id):
    first = client.chat.completions.create(model=model_id, messages=user("What is the weather in Paris?"),
                                           tools=[WEATHER_TOOL], max_tokens=200)
    call = first.choices[0].message.tool_calls[0]
    messages = user("What is the weather in Paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER_TOOL],
                                       max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_json_schema_output_validates(client, model_id):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": False,
    }
    for seed in (1, 2, 3):
        r = client.chat.completions.create(
            model=model_id, messages=user("Describe a person as JSON."), max_tokens=120, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_json_object_output_is_an_object(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=user("JSON please"), max_tokens=60, seed=5, temperature=0.7,
        response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_thinking_goes_to_reasoning_content(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=user("think-probe"), max_tokens=100)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "Six times seven. That is 42."
    assert m.content == "The answer is 42."


def test_thinking_is_streamed_as_reasoning_content(client, model_id):
    s = client.chat.completions.create(model=model_id, messages=user("think-probe"), max_tokens=100,
                                       stream=True)
    reasoning, content = "", ""
    for chunk in s:
        d = chunk.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
    assert reasoning == "Six times seven. That is 42."
    assert content == "The answer is 42."


def test_enable_thinking_false_gives_no_reasoning(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=user("plain-probe"), max_tokens=100,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = r.choices[0].message
    assert m.content == "Just the answer: 42."
    assert "reasoning_content" not in (m.model_extra or {})


def test_thinking_on_by_default_sends_free_text_to_reasoning(client, model_id):
    # A random model never closes its think block: everything it says is reasoning.
    r = client.chat.completions.create(model=model_id, messages=user("Hello"), max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.model_extra.get("reasoning_content")


def test_cancelling_a_stream_stops_generation(client, http, model_id):
    before = metric(http, "niwaki_generations_total", {"finish": "cancelled"})
    s = client.chat.completions.create(model=model_id, messages=user("story-probe"),
                                       max_tokens=1000, stream=True)
    for i, _ in enumerate(s):
        if i == 3:
            break
    s.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        if metric(http, "niwaki_generations_total", {"finish": "cancelled"}) > before:
            break
        time.sleep(0.05)
    assert metric(http, "niwaki_generations_total", {"finish": "cancelled"}) == before + 1
    while metric(http, "niwaki_requests_in_flight") > 0 and time.time() < deadline:
        time.sleep(0.05)
    assert metric(http, "niwaki_requests_in_flight") == 0


def test_context_limit_returns_text_with_length(client, model_id, http):
    ctx = client.models.list().data[0].model_extra["max_model_len"]
    prompt = "x" * (ctx - 4)
    prompt_len = http.post("/tokenize", json={"content": prompt}).json()["count"]
    assert prompt_len == ctx - 4
    r = client.completions.create(model=model_id, prompt=prompt, max_tokens=100, temperature=0)
    assert r.choices[0].finish_reason == "length"
    # The last token is sampled from the last position's logits and never needs a slot itself.
    assert r.usage.prompt_tokens + r.usage.completion_tokens in (ctx, ctx + 1)
    assert len(r.choices[0].text) > 0


def test_prompt_longer_than_context_is_a_400_with_both_numbers(client, model_id):
    ctx = client.models.list().data[0].model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="y" * (ctx + 50), max_tokens=5)
    msg = e.value.body["message"]
    assert str(ctx) in msg and str(ctx + 50) in msg


def test_state_never_leaks_between_requests(client, model_id):
    def ask(prompt):
        return client.completions.create(model=model_id, prompt=prompt, max_tokens=24,
                                         temperature=0).choices[0].text
    alone = ask("The quiet garden")
    ask("Something entirely different that fills the recurrent state " * 4)
    assert ask("The quiet garden") == alone
    # And while another generation runs at the same time.
    results = {}

    def worker(key, prompt):
        results[key] = ask(prompt)
    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in
               enumerate(["The quiet garden", "Noise " * 30, "The quiet garden", "More noise"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == alone and results[2] == alone


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=user("hi"), max_tokens=1)
    assert e.value.body["code"] == "model_not_found"


def test_n_greater_than_one_is_refused(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=user("hi"), max_tokens=1, n=2)
    assert e.value.body["param"] == "n"


def test_tokenize_and_detokenize_round_trip(http):
    ids = http.post("/tokenize", json={"content": "Hello, world"}).json()["tokens"]
    assert ids
    assert http.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello, world"
    chat = http.post("/tokenize", json={"messages": user("Hello")}).json()
    assert chat["count"] > len(ids) - 5


def test_metrics_report_requests_tokens_and_latency(http):
    text = http.get("/metrics").text
    for name in ["niwaki_requests_total", "niwaki_prompt_tokens_total", "niwaki_generated_tokens_total",
                 "niwaki_time_to_first_token_seconds_bucket", "niwaki_inter_token_latency_seconds_bucket",
                 "niwaki_queue_depth", "niwaki_sequence_state_bytes"]:
        assert name in text, name
    assert metric(http, "niwaki_generated_tokens_total") > 0


def test_policy_explains_each_decision(http):
    p = http.get("/v1/policy").json()
    for key in ["backend", "threads", "context", "slots", "queue", "speculation", "conversation_cache"]:
        assert "value" in p[key] and p[key]["rule"], key
    assert p["slots"]["measured_decode_step_s"] > 0


def test_overload_is_a_503_with_retry_after(http, model_id):
    cap = http.get("/v1/policy").json()
    capacity = cap["slots"]["value"] + cap["queue"]["value"]
    body = {"model": model_id, "messages": user("story-probe"), "max_tokens": 1000,
            "stream": True}
    streams, statuses, retry = [], [], []
    with httpx.Client(base_url=http.base_url, timeout=60) as c:
        for _ in range(capacity + 3):
            cm = c.stream("POST", "/v1/chat/completions", json=body)
            r = cm.__enter__()
            statuses.append(r.status_code)
            if r.status_code == 503:
                retry.append(r.headers.get("retry-after"))
                assert r.read() and json.loads(r.content)["error"]["type"] == "server_overloaded"
            streams.append(cm)
        for cm in streams:
            cm.__exit__(None, None, None)
    assert statuses.count(200) == capacity
    assert statuses.count(503) == 3 and all(retry)
    deadline = time.time() + 20
    while metric(http, "niwaki_requests_in_flight") > 0 and time.time() < deadline:
        time.sleep(0.1)
    assert http.get("/health").status_code == 200
