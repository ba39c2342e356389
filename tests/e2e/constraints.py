"""The constraints the structured-output tests send, each with its independent
reference check (jsonschema, re.fullmatch, membership, a Lark parser of the
grammar's language), which raises when an answer is outside the constraint."""

from __future__ import annotations

import json
import re

import jsonschema
import lark

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)"
COLORS = ["red", "green", "blue", "light blue"]
# Sums of up to three terms with parentheses: nesting makes it not a regular language,
# so no regex could stand in for the grammar; the bounded length lets a real model,
# which would add terms forever, finish. The same language in both syntaxes vLLM takes.
SUM_LARK = ('start: expr\nexpr: term ("+" term)? ("+" term)?\n'
            'term: NUM | "(" expr ")"\nNUM: /[1-9][0-9]?/\n')
SUM_EBNF = ('root ::= expr\nexpr ::= term ("+" term)? ("+" term)?\n'
            'term ::= num | "(" expr ")"\nnum ::= [1-9] [0-9]?\n')
SUM_PARSER = lark.Lark(SUM_LARK)


def is_person(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


def is_email(text: str) -> None:
    assert re.fullmatch(EMAIL, text), text


def is_color(text: str) -> None:
    assert text in COLORS, text


def is_sum(text: str) -> None:
    SUM_PARSER.parse(text)  # raises on a string outside the language


# kind -> (request fields, reference check). json_schema goes through OpenAI's
# response_format, the rest through vLLM's structured_outputs.
CONSTRAINTS = {
    "json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}}, is_person),
    "regex": ({"structured_outputs": {"regex": EMAIL}}, is_email),
    "choice": ({"structured_outputs": {"choice": COLORS}}, is_color),
    "grammar_lark": ({"structured_outputs": {"grammar": SUM_LARK}}, is_sum),
    "grammar_ebnf": ({"structured_outputs": {"grammar": SUM_EBNF}}, is_sum),
}
