"""The syntax of the ``.gsp`` text form: tokens, the syntax tree and the parser (grammar: :mod:`.text_format`).

Nothing here evaluates anything; :mod:`.text_format` builds the program from the statements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from gensorage.errors import ConfigError

KEYWORDS = frozenset({"program", "param", "input", "output", "true", "false"})
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
Number = Fraction | float  # exact until a sqrt or a float literal needs a float


# ---------------------------------------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "name", "number", "op" (punctuation), "newline", "eof"
    text: str
    line: int


_TOKEN_RE = re.compile(
    r"(?P<ws>[ \t\r\f]+)|(?P<comment>\#[^\n]*)|(?P<newline>\n)"
    r"|(?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[()\[\],=+\-*/])"
)


def tokenize(text: str, source: str) -> list[Token]:
    """Tokens of ``text``; newlines inside brackets are dropped so a statement may span lines."""
    tokens: list[Token] = []
    line, pos, depth = 1, 0, 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ConfigError(f"{source}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        value = m.group()
        pos = m.end()
        if kind == "newline":
            if depth == 0:
                tokens.append(Token("newline", "\n", line))
            line += 1
        elif kind in ("number", "name", "op"):
            if value in "([":
                depth += 1
            elif value in ")]":
                depth = max(0, depth - 1)
            tokens.append(Token(kind, value, line))
    tokens.append(Token("newline", "\n", line))
    tokens.append(Token("eof", "", line))
    return tokens


# ---------------------------------------------------------------------------------------------- syntax tree


@dataclass(frozen=True, slots=True)
class Num:
    value: Number
    line: int


@dataclass(frozen=True, slots=True)
class Name:
    id: str
    line: int


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]
    line: int


@dataclass(frozen=True, slots=True)
class ListExpr:
    items: tuple[Expr, ...]
    line: int


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Expr
    right: Expr
    line: int


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Expr
    line: int


Expr = Num | Name | Call | ListExpr | BinOp | Neg


@dataclass(frozen=True, slots=True)
class Statement:
    kind: str  # "program", "param", "input", "assign", "output"
    line: int
    name: str = ""
    expr: Expr | None = None
    dims: tuple[Expr, ...] = ()
    dtype: str | None = None
    names: tuple[str, ...] = ()


class Parser:
    """Recursive descent over the tokens: one :class:`Statement` per line."""

    def __init__(self, tokens: list[Token], source: str) -> None:
        self.tokens = tokens
        self.pos = 0
        self.source = source

    def error(self, msg: str, tok: Token | None = None) -> ConfigError:
        tok = tok or self.peek()
        return ConfigError(f"{self.source}:{tok.line}: {msg}")

    def peek(self, k: int = 0) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.pos += 1
        return tok

    def expect(self, text: str, what: str) -> Token:
        tok = self.next()
        if tok.text != text or tok.kind not in ("op", "newline"):
            raise self.error(f"expected {what}, found {shown(tok)}", tok)
        return tok

    def expect_name(self, what: str) -> Token:
        tok = self.next()
        if tok.kind != "name":
            raise self.error(f"expected {what}, found {shown(tok)}", tok)
        return tok

    def end_of_statement(self) -> None:
        tok = self.next()
        if tok.kind != "newline":
            raise self.error(f"unexpected {shown(tok)} after the end of the statement", tok)

    # statements

    def statements(self) -> list[Statement]:
        out: list[Statement] = []
        while self.peek().kind != "eof":
            if self.peek().kind == "newline":
                self.next()
                continue
            out.append(self.statement())
        return out

    def statement(self) -> Statement:
        tok = self.peek()
        if tok.kind != "name":
            raise self.error(
                f"expected a statement (program, param, input, output or NAME = ...), found {shown(tok)}"
            )
        handler = {
            "program": self.program_stmt,
            "param": self.param_stmt,
            "input": self.input_stmt,
            "output": self.output_stmt,
        }.get(tok.text)
        if handler is not None:
            self.next()
            stmt = handler(tok.line)
        else:
            stmt = self.assign_stmt()
        self.end_of_statement()
        return stmt

    def program_stmt(self, line: int) -> Statement:
        return Statement("program", line, name=self.expect_name("a program name after 'program'").text)

    def param_stmt(self, line: int) -> Statement:
        name = self.expect_name("a parameter name after 'param'")
        self.check_name(name)
        self.expect("=", "'=' after the parameter name")
        return Statement("param", line, name=name.text, expr=self.expr())

    def input_stmt(self, line: int) -> Statement:
        name = self.expect_name("an input name after 'input'")
        self.check_name(name)
        open_tok = self.next()
        if open_tok.text != "[":
            raise self.error(
                f"expected '[' starting the shape of input '{name.text}', found {shown(open_tok)}", open_tok
            )
        dims = self.list_items("]")
        if not dims:
            raise self.error(f"input '{name.text}' needs at least one dimension", open_tok)
        dtype = None
        if self.peek().kind == "name":
            dtype = self.next().text
        return Statement("input", line, name=name.text, dims=dims, dtype=dtype)

    def output_stmt(self, line: int) -> Statement:
        names = [self.expect_name("a tensor name after 'output'").text]
        while self.peek().text == "," and self.peek().kind == "op":
            self.next()
            names.append(self.expect_name("a tensor name after ','").text)
        return Statement("output", line, names=tuple(names))

    def assign_stmt(self) -> Statement:
        name = self.next()
        self.check_name(name)
        eq = self.next()
        if eq.text != "=":
            raise self.error(
                f"expected '=' after '{name.text}' (a statement is NAME = expression), found {shown(eq)}", eq
            )
        return Statement("assign", name.line, name=name.text, expr=self.expr())

    def check_name(self, tok: Token) -> None:
        if tok.text in KEYWORDS:
            raise self.error(f"'{tok.text}' is a keyword and cannot name a tensor or parameter", tok)

    # expressions

    def expr(self) -> Expr:
        left = self.term()
        while self.peek().kind == "op" and self.peek().text in "+-":
            op = self.next()
            left = BinOp(op.text, left, self.term(), op.line)
        return left

    def term(self) -> Expr:
        left = self.unary()
        while self.peek().kind == "op" and self.peek().text in "*/":
            op = self.next()
            left = BinOp(op.text, left, self.unary(), op.line)
        return left

    def unary(self) -> Expr:
        tok = self.peek()
        if tok.kind == "op" and tok.text in "+-":
            self.next()
            operand = self.unary()
            return operand if tok.text == "+" else Neg(operand, tok.line)
        return self.atom()

    def atom(self) -> Expr:
        tok = self.next()
        if tok.kind == "number":
            return Num(Fraction(tok.text), tok.line)
        if tok.kind == "name":
            if self.peek().text == "(" and self.peek().kind == "op":
                self.next()
                return self.call(tok)
            return Name(tok.text, tok.line)
        if tok.text == "(":
            inner = self.expr()
            self.expect(")", "')'")
            return inner
        if tok.text == "[":
            return ListExpr(self.list_items("]"), tok.line)
        raise self.error(f"expected a value, found {shown(tok)}", tok)

    def list_items(self, close: str) -> tuple[Expr, ...]:
        items: list[Expr] = []
        while not (self.peek().kind == "op" and self.peek().text == close):
            items.append(self.expr())
            if not (self.peek().kind == "op" and self.peek().text == ","):
                break
            self.next()
        self.expect(close, f"',' or '{close}'")
        return tuple(items)

    def call(self, func: Token) -> Call:
        args: list[Expr] = []
        kwargs: list[tuple[str, Expr]] = []
        while not (self.peek().kind == "op" and self.peek().text == ")"):
            if self.peek().kind == "name" and self.peek(1).text == "=" and self.peek(1).kind == "op":
                key = self.next()
                self.next()
                if any(k == key.text for k, _ in kwargs):
                    raise self.error(f"{func.text}: argument '{key.text}' given twice", key)
                kwargs.append((key.text, self.expr()))
            else:
                if kwargs:
                    raise self.error(f"{func.text}: positional argument after a keyword argument")
                args.append(self.expr())
            if not (self.peek().kind == "op" and self.peek().text == ","):
                break
            self.next()
        self.expect(")", f"',' or ')' closing the call to {func.text}")
        return Call(func.text, tuple(args), tuple(kwargs), func.line)


def shown(tok: Token) -> str:
    if tok.kind == "eof":
        return "end of input"
    if tok.kind == "newline":
        return "end of line"
    return f"'{tok.text}'"


__all__ = [
    "IDENT",
    "KEYWORDS",
    "BinOp",
    "Number",
    "Call",
    "Expr",
    "ListExpr",
    "Name",
    "Neg",
    "Num",
    "Parser",
    "Statement",
    "Token",
    "shown",
    "tokenize",
]
