"""Tool calling through `flashtree serve` and the official `openai` client: tools rendered by the
model's chat template, tool_choice "required" / a named function held to the tools' JSON schemas by
the grammar path (every call parses and validates, under speculation), `tool_calls` in the reply,
the client's pydantic helpers, and one agent-style round trip (call, tool result, answer). A
template that ignores tools, and tool choices that cannot be met, are 400s. tiny-code's weights
with a Hermes-style template written here (its own template renders no tools)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

import flashtree
from flashtree import LLM
from flashtree.server.tools import call_format, call_schema, read_calls
from serving import openai_client, served

TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\n"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>\n{% endfor %}"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}")
LLAMA3_TEMPLATE = (  # the shape of Llama 3.1-3.3's: the instruction, the tools as JSON, calls as bare JSON
    "{% if tools %}Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}ipython: {{ m.content }}\n"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}{\"name\": \"{{ c.function.name }}\", "
    "\"parameters\": {{ c.function.arguments | tojson }}}{% endfor %}\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=10)
    unit: Literal["c", "f"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    bundled = Path(flashtree.__file__).parent / "bundled"
    target = tmp_path_factory.mktemp("tools") / "target"
    shutil.copytree(bundled / "target", target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    r = served(LLM(model=str(target), draft=str(bundled / "drafter"), dtype="float32", compile=False,
                   method="ddtree", max_batch_size=2))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_required_calls_parse_and_validate(client, method):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=96,
                                       extra_body={"speculative": {"method": method}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert call.id.startswith("call_") and call.type == "function"


def test_streamed_calls_arrive_as_one_delta_equal_to_the_reply(client):
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              temperature=0, max_tokens=96)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or ())]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == whole.function.name
    assert calls[0].function.arguments == whole.function.arguments and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_a_named_function_and_sampled_calls(client):
    for seed in range(3):
        r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0.9, seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           max_tokens=64)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), TIME)


def test_the_clients_pydantic_tool_helper(client):
    r = client.chat.completions.parse(model="tiny", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)],
                                      tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=256)
    assert isinstance(r.choices[0].message.tool_calls[0].function.parsed_arguments, GetWeather)


def test_an_agent_round_trip(server, client):
    """Call, run the tool, send its result back, get the answer: the template renders the call and
    the result into the second prompt."""
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=96,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    follow = [*ASK, msg, {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = client.chat.completions.create(model="tiny", messages=follow, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=16)
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)
    rendered = server.llm.tokenizer.apply_chat_template(
        [*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                             "arguments": json.loads(call.function.arguments)}}]},
         {"role": "tool", "content": "sunny, 21 C", "tool_call_id": call.id}], tools=TOOLS)
    assert "<tool_response>sunny, 21 C</tool_response>" in rendered and '"name": "get_weather"' in rendered
    assert second.usage.prompt_tokens == len(server.llm.tokenizer.encode(rendered)) > first.usage.prompt_tokens


@pytest.mark.parametrize("body, match", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "at most one output constraint"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
])
def test_tool_choices_that_cannot_be_met_are_400s(server, body, match):
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": ASK, "max_tokens": 4, "tools": TOOLS, **body})
    assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": ASK, "max_tokens": 4, "tool_choice": "required"})
    assert r.status_code == 400 and "tool_choice needs tools" in r.json()["error"]["message"]


def test_calls_are_read_back_in_the_templates_format_and_schemas_built():
    text = 'Let me check.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    content, calls = read_calls(text, "auto", "hermes", finished=True)
    assert content == "Let me check." and calls[0]["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    assert read_calls(text, "auto", None, finished=True) == (text, None)
    assert read_calls('{"zone": "U', "get_time", None, finished=False) == ('{"zone": "U', None)
    # Mistral: content, then [TOOL_CALLS] and an array
    text = 'Sure. [TOOL_CALLS] [{"name": "get_time", "arguments": {"zone": "CET"}}, {"name": "get_weather", ' \
           '"arguments": {"city": "Oslo", "unit": "c"}}]'
    content, calls = read_calls(text, "auto", "mistral", finished=True)
    assert content == "Sure." and [c["function"]["name"] for c in calls] == ["get_time", "get_weather"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    assert read_calls("[TOOL_CALLS] [{\"name\": 3}]", "auto", "mistral", True) == ("[TOOL_CALLS] [{\"name\": 3}]", None)
    # Llama 3.x: the reply is the calls (after an optional <|python_tag|>), ;-separated; prose is prose
    text = '<|python_tag|>{"name": "get_time", "parameters": {"zone": "PST"}}; {"name": "get_time", "parameters": {}}'
    content, calls = read_calls(text, "auto", "llama3", finished=True)
    assert content is None and [json.loads(c["function"]["arguments"]) for c in calls] == [{"zone": "PST"}, {}]
    prose = 'The call would be {"name": "get_time", "parameters": {"zone": "PST"}}.'
    assert read_calls(prose, "auto", "llama3", True) == (prose, None)
    assert read_calls('{"city": "Oslo"}', "auto", "llama3", True) == ('{"city": "Oslo"}', None)
    assert [call_format(t) for t in (TEMPLATE, LLAMA3_TEMPLATE, "{{ '[TOOL_CALLS]' }}", "{{ m.content }}", None)] \
        == ["hermes", "llama3", "mistral", None, None]
    schema = call_schema(TOOLS, "required", parallel=True)
    jsonschema.validate([{"name": "get_time", "parameters": {"zone": "CET"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_time", "parameters": {"city": "Oslo", "unit": "c"}}], schema)
    assert call_schema(TOOLS, "required", parallel=False)["maxItems"] == 1 and call_schema(TOOLS, "auto", True) is None


def test_auto_reads_back_a_llama3_style_call_through_the_client(tmp_path):
    """A Llama-3-style template: an "auto" reply that is a {"name", "parameters"} object comes back
    as `tool_calls` (the reply is held to one such object by a response_format here, since the tiny
    model would not write one of its own); a free reply stays content."""
    bundled = Path(flashtree.__file__).parent / "bundled"
    target = tmp_path / "target"
    shutil.copytree(bundled / "target", target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": LLAMA3_TEMPLATE}))
    call = {"type": "object", "properties": {"name": {"const": "get_time"}, "parameters": TIME},
            "required": ["name", "parameters"], "additionalProperties": False}
    r = served(LLM(model=str(target), draft=str(bundled / "drafter"), dtype="float32", compile=False,
                   method="ddtree", max_batch_size=2))
    try:
        client = openai_client(r)
        reply = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": call, "strict": True}})
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (made,) = choice.message.tool_calls
        assert made.function.name == "get_time"
        jsonschema.validate(json.loads(made.function.arguments), TIME)
        free = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=8)
        assert free.choices[0].message.tool_calls is None and isinstance(free.choices[0].message.content, str)
    finally:
        r.stop()
