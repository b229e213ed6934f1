"""Structured output through `flashtree serve` and the official `openai` client: response_format
(json_schema, json_object, the client's pydantic `parse` helper), vLLM's guided_* extensions,
streaming, and bad constraints answered with a 400 while the server keeps serving. tiny-code's
tokenizer spells JSON; replies equal the Python API's under the same constraint."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pydantic
import pytest

from flashtree import LLM, SamplingParams, StructuredOutput
from serving import openai_client, served

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "size": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "size"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "def main():\n    return"}]


class Item(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    size: int


@pytest.fixture(scope="module")
def offline():
    """An LLM of its own (the server's engine belongs to its loop thread)."""
    return LLM("tiny-code", dtype="float32", compile=False, max_batch_size=2, method="ddtree")


@pytest.fixture(scope="module")
def server():
    r = served(LLM("tiny-code", dtype="float32", compile=False, max_batch_size=4, method="ddtree"))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_a_json_schema_reply_validates_and_equals_the_python_api(offline, client, method):
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="tiny", messages=CHAT, temperature=0, max_tokens=64,
                                       response_format=fmt, extra_body={"speculative": {"method": method}})
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    want = offline.chat(CHAT, SamplingParams(temperature=0, max_tokens=64,
                                             structured=StructuredOutput(json_schema=SCHEMA)), method=method)[0]
    assert text == want.text and r.choices[0].finish_reason == "stop"


def test_the_clients_parse_helper_gets_its_pydantic_model(client):
    r = client.chat.completions.parse(model="tiny", messages=CHAT, temperature=0, max_tokens=64, response_format=Item)
    assert isinstance(r.choices[0].message.parsed, Item)


def test_json_object_and_guided_regex_and_a_stream(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT, temperature=0.8, seed=3, max_tokens=64,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    c = client.completions.create(model="tiny", prompt="x = ", temperature=0, max_tokens=20,
                                  extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert len(c.choices[0].text) == 6 and c.choices[0].text[3] == "-"
    parts = client.completions.create(model="tiny", prompt="x = ", temperature=0, max_tokens=20, stream=True,
                                      extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert "".join(p.choices[0].text for p in parts if p.choices) == c.choices[0].text


@pytest.mark.parametrize("body, match", [
    ({"guided_json": {"type": "objekt"}}, "json schema cannot be compiled"),
    ({"guided_regex": "(ab"}, "regex cannot be compiled"),
    ({"guided_grammar": "root ::= missing"}, "grammar cannot be compiled"),
    ({"guided_regex": "a", "guided_grammar": "root ::= \"a\""}, "at most one output constraint"),
    ({"response_format": {"type": "json_schema"}}, "needs json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
])
def test_bad_constraints_are_400s_and_the_server_keeps_serving(server, client, body, match):
    r = httpx.post(server.base + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4, **body},
                   timeout=60)
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text is not None


def test_openapi_describes_the_constraints(server):
    props = httpx.get(server.base + "/openapi.json").json()["components"]["schemas"]
    assert {"response_format", "guided_json", "guided_regex", "guided_grammar", "tools", "tool_choice"} <= set(
        props["ChatCompletionRequest"]["properties"])
    assert {"ResponseFormat", "JSONSchemaFormat", "ToolDef", "ToolCall"} <= set(props)


def test_tools_for_a_template_that_renders_none_are_a_400(server):
    """tiny-code's template ignores tools: the model could not be told about them."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": CHAT, "max_tokens": 4, "tools": [tool]})
    assert r.status_code == 400 and "does not render tools" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "tools"
