"""Bad requests get OpenAI-shaped errors with the right status and leave the server healthy."""

import pytest


def post(http, body, path="/v1/chat/completions", **kw):
    headers = {"content-type": "application/json"}
    if isinstance(body, (bytes, str)):
        return http.post(path, content=body, headers=headers, **kw)
    return http.post(path, json=body, **kw)


def check(r, status, param=None, contains=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param
    if contains is not None:
        assert contains in err["message"], err["message"]


@pytest.fixture(autouse=True)
def still_healthy(http):
    yield
    assert http.get("/health").status_code == 200


def msgs():
    return [{"role": "user", "content": "hi"}]


def test_malformed_json_is_400(http):
    check(post(http, b'{"model": "x", "messages": ['), 400, contains="not valid JSON")


def test_a_body_that_is_not_an_object_is_400(http):
    check(post(http, b"[1, 2, 3]"), 400)


def test_wrong_types_are_400(http, model_id):
    check(post(http, {"model": model_id, "messages": msgs(), "max_tokens": "ten"}), 400,
          contains="max_tokens")
    check(post(http, {"model": model_id, "messages": "hello"}), 400)
    check(post(http, {"model": model_id, "messages": msgs(), "temperature": -1}), 400,
          param="temperature")
    check(post(http, {"model": model_id, "messages": msgs(), "max_tokens": -5}), 400)


def test_huge_max_tokens_is_400(http, model_id):
    check(post(http, {"model": model_id, "messages": msgs(), "max_tokens": 10**12}), 400,
          param="max_tokens", contains="context")


def test_unknown_fields_are_400(http, model_id):
    check(post(http, {"model": model_id, "messages": msgs(), "temprature": 0.5}), 400,
          contains="temprature")


def test_empty_messages_are_400(http, model_id):
    check(post(http, {"model": model_id, "messages": []}), 400, param="messages")


def test_missing_model_is_400_and_unknown_model_404(http, model_id):
    check(post(http, {"messages": msgs()}), 400, contains="model")
    check(post(http, {"model": "nope", "messages": msgs()}), 404, param="model")


def test_invalid_utf8_is_400(http, model_id):
    body = b'{"model": "' + model_id.encode() + b'", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    check(post(http, body), 400)


def test_ten_megabyte_body_is_413(http, model_id):
    big = b'{"model": "' + model_id.encode() + b'", "messages": [{"role": "user", "content": "' + \
        b"a" * (10 * 1024 * 1024) + b'"}]}'
    check(post(http, big), 413)


def test_bad_role_and_content_are_400(http, model_id):
    check(post(http, {"model": model_id, "messages": [{"role": "robot", "content": "x"}]}), 400,
          param="messages[0].role")
    check(post(http, {"model": model_id, "messages": [{"role": "user", "content": 5}]}), 400,
          param="messages[0].content")


def test_unsupported_options_are_refused_not_ignored(http, model_id):
    check(post(http, {"model": model_id, "messages": msgs(), "logit_bias": {"1": 5}}), 400,
          param="logit_bias")
    check(post(http, {"model": model_id, "messages": msgs(), "tool_choice": "required",
                      "tools": [{"type": "function", "function": {"name": "f"}}]}), 400,
          param="tool_choice")
    check(post(http, {"model": model_id, "prompt": "x", "echo": True}, "/v1/completions"), 400,
          param="echo")


def test_too_many_stop_strings_are_400(http, model_id):
    check(post(http, {"model": model_id, "messages": msgs(), "stop": ["a", "b", "c", "d", "e"]}),
          400, param="stop")


def test_unknown_endpoint_is_404(http):
    check(http.get("/v1/nothing"), 404)


def test_detokenize_of_an_unknown_id_is_400(http):
    check(http.post("/detokenize", json={"tokens": [10**9]}), 400)
