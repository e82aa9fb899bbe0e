"""The backstop's word: what the remediator tells the shims about one workload, and its one wire shape.

The remediator works out the word (llm_vitals/remediator/gate_word.py) and answers it on
GET /api/v1/backstop; a shim reads its own workload's word (llm_vitals/exporter/backstop_ask.py) and
its liveness obeys it (llm_vitals/exporter/backstop_rule.py). Both sides use this model, so what is
written and what is read cannot drift apart. The exporter and the remediator may not import each other:
this module is the contract between them.

The answer, at the remediator's clock:

    {"now": 1796222300.0,
     "words": [{"workload": "Deployment/llm/vllm", "word": "hold", "reason": "paused",
                "since": null, "detail": "the remediator is paused until 1796225900: upgrade"}]}

`word` is `act` or `hold`; a `hold` has a reason (one of the remediator's hold reasons) and an `act`
has none. `since` is when the hold began, where the state says so. A word that breaks these rules,
or one for another workload, cannot be read: the shim never obeys it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

Say = Literal["act", "hold"]
# A word's detail is for a human; longer text is cut here, on both sides.
DETAIL_LIMIT = 500


class BackstopWord(BaseModel):
    """The word for one workload. Strict: a string where a number belongs is refused, not converted."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    workload: str
    word: Say
    reason: str = ""  # a hold reason with `hold`; empty with `act`
    since: float | None = None  # when the hold began (the remediator's Unix time), where the state says so
    detail: str = ""

    @field_validator("reason", "detail", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("detail")
    @classmethod
    def _bounded(cls, value: str) -> str:
        return value[:DETAIL_LIMIT]

    @model_validator(mode="after")
    def _reason_with_hold_only(self) -> BackstopWord:
        if (self.word == "hold") != bool(self.reason):
            raise ValueError(f"contradictory word: {self.word} with reason {self.reason[:60]!r}")
        return self


def act(workload: str, detail: str = "") -> BackstopWord:
    return BackstopWord(workload=workload, word="act", detail=detail)


def hold(workload: str, reason: str, since: float | None, detail: str) -> BackstopWord:
    return BackstopWord(workload=workload, word="hold", reason=reason, since=since, detail=detail)


def answer_json(now: float, words: list[BackstopWord]) -> dict[str, Any]:
    """The body of GET /api/v1/backstop."""
    return {"now": now, "words": [w.model_dump() for w in words]}


def word_in(answer: Any, workload: str) -> BackstopWord | str:
    """The word for `workload` in a GET /api/v1/backstop answer (parsed JSON), or why it cannot be read.

    Only a whole word that is `workload`'s own is read: an answer without a `words` list, none or two
    words for it, an unknown word, a `since` that is no number, a reason with `act` or none with `hold`."""
    words = answer.get("words") if isinstance(answer, dict) else None
    if not isinstance(words, list):
        return "the answer holds no `words` list"
    mine = [w for w in words if isinstance(w, dict) and w.get("workload") == workload]
    if len(mine) != 1:
        return f"the answer holds {len(mine)} words for {workload}"
    try:
        return BackstopWord.model_validate(mine[0])
    except ValidationError as error:
        return _unreadable(mine[0], error)


def _unreadable(entry: dict[str, Any], error: ValidationError) -> str:
    """What a human reads of a word that failed validation: the first fault."""
    first = error.errors()[0]
    field = first["loc"][0] if first["loc"] else None
    if field == "since":
        return "`since` is not a number"
    if field is None and first["type"] == "value_error":
        return str(first["ctx"]["error"])
    return f"unknown word {str(entry.get('word'))[:40]!r}"
