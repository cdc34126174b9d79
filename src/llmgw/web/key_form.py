"""The Keys page's forms: reading what was typed, and what an edit changes.

Both forms send every field as text; an empty field means "no limit" (empty
models: every model; empty expiry: never). The edit form is filled with
`form_values(key)` and also carries those values in hidden `was_*` fields, so
that `KeyFields.edits` can tell what the person changed from what only differs
because the key changed elsewhere after the form was opened: a field left as
shown is kept as stored, so saving a form opened a while ago does not undo
someone else's change to another field. A field the person did change is
saved, last writer wins.

Not guaranteed: fractions of a second. The form shows an expiry to the second,
and a stored expiry with a fraction counts as unchanged when saved as shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TypeVar

from llmgw.store import KEEP, ApiKey, Keep
from llmgw.web.sources import ActionError

T = TypeVar("T")
# What the edit form's hidden copies of the shown values are called.
SHOWN_PREFIX = "was_"


def form_int(form: Mapping[str, str], field: str) -> int | None:
    """A whole number typed into `field`; None when it is empty."""
    text = form.get(field, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ActionError(f"{field} must be a whole number, got {text!r}") from None


def form_expiry(text: str, field: str = "expires_at") -> datetime | None:
    """A `datetime-local` value, read as UTC; None when it is empty."""
    if not text.strip():
        return None
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ActionError(f"{field} is not a date and time: {text!r}") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def form_models(text: str) -> list[str] | None:
    """Model names separated by commas or lines; None (every model) when there are none."""
    names = [n.strip() for n in text.replace("\n", ",").split(",") if n.strip()]
    return names or None


def form_values(key: ApiKey) -> dict[str, str]:
    """The edit form's fields for `key`, as the inputs show them."""
    expires = key.expires_at
    return {
        "name": key.name,
        "models": ", ".join(key.models) if key.models is not None else "",
        "rpm": _text(key.rpm),
        "tpm": _text(key.tpm),
        "budget_tokens": _text(key.budget_tokens),
        "period": key.budget_period or "",
        "expires_at": f"{expires.astimezone(UTC):%Y-%m-%dT%H:%M:%S}" if expires else "",
        "role": key.admin_role or "",
        "user_rpm": _text(key.user_rpm),
        "user_tpm": _text(key.user_tpm),
        "user_budget_tokens": _text(key.user_budget_tokens),
    }


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _changed(wanted: T, now: T, shown: T | Keep) -> T | Keep:
    """`wanted` if the person changed the field and the key does not have it already."""
    return KEEP if wanted in (now, shown) else wanted


@dataclass(frozen=True, slots=True)
class KeyEdits:
    """What `KeyService.update` is asked to change; `KEEP` fields stay as stored."""

    name: str | Keep = KEEP
    models: tuple[str, ...] | Keep | None = KEEP
    rpm: int | Keep | None = KEEP
    tpm: int | Keep | None = KEEP
    budget_tokens: int | Keep | None = KEEP
    period: str | Keep | None = KEEP
    expires_at: datetime | Keep | None = KEEP
    admin_role: str | Keep | None = KEEP
    # Each end user's limits (the request's `user`), per key.
    user_rpm: int | Keep | None = KEEP
    user_tpm: int | Keep | None = KEEP
    user_budget_tokens: int | Keep | None = KEEP

    def changed(self) -> list[str]:
        """The names of the fields to change."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not KEEP]


@dataclass(frozen=True, slots=True)
class KeyFields:
    """A key's editable fields, from the store or from a submitted form, comparable."""

    name: str
    models: tuple[str, ...] | None
    rpm: int | None
    tpm: int | None
    budget_tokens: int | None
    period: str | None
    expires_at: datetime | None
    admin_role: str | None
    user_rpm: int | None
    user_tpm: int | None
    user_budget_tokens: int | None

    @classmethod
    def of(cls, key: ApiKey) -> KeyFields:
        """`key` as its edit form shows it (expiry to the second)."""
        expires = key.expires_at.replace(microsecond=0) if key.expires_at else None
        return cls(
            name=key.name,
            models=key.models,
            rpm=key.rpm,
            tpm=key.tpm,
            budget_tokens=key.budget_tokens,
            period=key.budget_period,
            expires_at=expires,
            admin_role=key.admin_role,
            user_rpm=key.user_rpm,
            user_tpm=key.user_tpm,
            user_budget_tokens=key.user_budget_tokens,
        )

    @classmethod
    def from_form(cls, form: Mapping[str, str], prefix: str = "") -> KeyFields:
        """The fields named `prefix + field` in a submitted form; `ActionError` for
        text that is not a number or a time. Limits are checked by the key service."""
        models = form_models(form.get(prefix + "models", ""))
        return cls(
            name=form.get(prefix + "name", "").strip(),
            # In order, without repeats, as the key service keeps them.
            models=tuple(dict.fromkeys(models)) if models is not None else None,
            rpm=form_int(form, prefix + "rpm"),
            tpm=form_int(form, prefix + "tpm"),
            budget_tokens=form_int(form, prefix + "budget_tokens"),
            period=form.get(prefix + "period", "").strip() or None,
            expires_at=form_expiry(form.get(prefix + "expires_at", ""), prefix + "expires_at"),
            admin_role=form.get(prefix + "role", "").strip() or None,
            user_rpm=form_int(form, prefix + "user_rpm"),
            user_tpm=form_int(form, prefix + "user_tpm"),
            user_budget_tokens=form_int(form, prefix + "user_budget_tokens"),
        )

    @classmethod
    def shown_in(cls, form: Mapping[str, str]) -> KeyFields | None:
        """What the edit form was filled with, or None for a form without the copies."""
        if SHOWN_PREFIX + "name" not in form:
            return None
        return cls.from_form(form, prefix=SHOWN_PREFIX)

    def edits(self, now: KeyFields | None, shown: KeyFields | None) -> KeyEdits:
        """The fields of this form that differ from the key `now` and from what the
        form `shown`; every field when `now` is None."""
        if now is None:
            return KeyEdits(
                name=self.name,
                models=self.models,
                rpm=self.rpm,
                tpm=self.tpm,
                budget_tokens=self.budget_tokens,
                period=self.period,
                expires_at=self.expires_at,
                admin_role=self.admin_role,
                user_rpm=self.user_rpm,
                user_tpm=self.user_tpm,
                user_budget_tokens=self.user_budget_tokens,
            )
        was = shown if shown is not None else now
        return KeyEdits(
            name=_changed(self.name, now.name, was.name),
            models=_changed(self.models, now.models, was.models),
            rpm=_changed(self.rpm, now.rpm, was.rpm),
            tpm=_changed(self.tpm, now.tpm, was.tpm),
            budget_tokens=_changed(self.budget_tokens, now.budget_tokens, was.budget_tokens),
            period=_changed(self.period, now.period, was.period),
            expires_at=_changed(self.expires_at, now.expires_at, was.expires_at),
            admin_role=_changed(self.admin_role, now.admin_role, was.admin_role),
            user_rpm=_changed(self.user_rpm, now.user_rpm, was.user_rpm),
            user_tpm=_changed(self.user_tpm, now.user_tpm, was.user_tpm),
            user_budget_tokens=_changed(
                self.user_budget_tokens, now.user_budget_tokens, was.user_budget_tokens
            ),
        )
