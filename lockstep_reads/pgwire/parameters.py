"""A statement's ``$n`` parameters: how many it uses, and its text with their literals in place
(never inside strings or comments: the statement is tokenized in PostgreSQL's dialect)."""

from __future__ import annotations

from sqlglot.tokens import Tokenizer, TokenType

from lockstep_reads.pgwire.session import SqlError
from lockstep_reads.statements import DIALECT


def parameter_count(text: str) -> int:
    """How many ``$n`` placeholders a statement uses (the highest n)."""
    numbers = [int(tok.text[1:]) for tok in _tokens(text) if tok.text[:1] == "$" and tok.text[1:].isdigit()]
    return max(numbers, default=0)


def _tokens(text: str) -> list:  # type: ignore[type-arg]
    try:
        return Tokenizer(dialect=DIALECT).tokenize(text)
    except Exception:  # noqa: BLE001 - an untokenizable text has no parameters; the parser says what is wrong
        return []


def substitute(text: str, literals: list[str]) -> str:
    """``text`` with each ``$n`` replaced by its literal (not inside strings or comments).

    >>> substitute("SELECT * FROM t WHERE a = $1 AND b = '$2' AND c = $2", ["1", "'x'"])
    "SELECT * FROM t WHERE a = 1 AND b = '$2' AND c = 'x'"
    """
    out, at = [], 0
    for tok in _tokens(text):
        if tok.token_type != TokenType.STRING and tok.text[:1] == "$" and tok.text[1:].isdigit():
            n = int(tok.text[1:])
            if not 1 <= n <= len(literals):
                raise SqlError("08P01", f"there is no parameter ${n}")
            out += [text[at:tok.start], literals[n - 1]]
            at = tok.end + 1
    return "".join(out) + text[at:]
