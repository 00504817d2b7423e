"""The base of every typed result a service returns and a verb prints.

A result is a pydantic model; its ``-o json``/``-o yaml`` form is :meth:`Result.to_json`. The rule that keeps
the JSON what users already parse: a key that is always there is a field without a default; a key that is
there only sometimes is a field with a default, set only when it applies (``exclude_unset`` leaves it out
otherwise, so a field set to None stays in the output as null)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The result as ``-o json`` prints it."""
        return self.model_dump(mode="json", exclude_unset=True, by_alias=True)
