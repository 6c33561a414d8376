"""Schemas the structured-outputs tests constrain to (pydantic models: their JSON schema
is the constraint, their validator the check), each bounded so that any model, a random
one included, finishes it within a few dozen tokens."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """additionalProperties false in the schema (as OpenAI's strict mode requires): JSON
    Schema allows any other key by default, and a model fills it with them."""
    model_config = ConfigDict(extra="forbid")


class Address(Strict):
    city: str = Field(max_length=12)
    zip: int = Field(ge=0, le=99999)


class Person(Strict):            # nested objects ($defs + $ref)
    name: str = Field(max_length=12)
    address: Address


class Order(Strict):             # enums and an array of enums
    item: Literal["sword", "cloak", "crown"]
    sizes: list[Literal["s", "m", "l"]] = Field(min_length=1, max_length=3)
    count: int = Field(ge=1, le=9)


class Speaker(Strict):
    name: str = Field(max_length=10)
    lines: int = Field(ge=0, le=99)


class Scene(Strict):             # an array of objects, a boolean
    act: int = Field(ge=1, le=5)
    speakers: list[Speaker] = Field(max_length=2)
    final: bool


MODELS = (Person, Order, Scene)
MAX_TOKENS = 120        # the longest of them, written a byte per token, fits


def schema(model) -> dict:
    return model.model_json_schema()


def check(model, text: str):
    """The output parsed by the model (raises if it does not validate)."""
    return model.model_validate_json(text)
