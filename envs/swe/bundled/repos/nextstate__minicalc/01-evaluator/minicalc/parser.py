from minicalc.errors import CalcError
from minicalc.tokens import tokenize


class Parser:
    """Recursive descent over the token list.

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := NUMBER | '(' expr ')'
    """

    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        tok = self.peek()
        self.pos += 1
        return tok

    def parse(self):
        if not self.tokens:
            raise CalcError("empty expression")
        value = self.expr()
        if self.peek() is not None:
            raise CalcError(f"unexpected token {self.peek()!r}")
        return value

    def expr(self):
        left = self.term()
        if self.peek() in ("+", "-"):
            op = self.take()
            right = self.expr()
            return left + right if op == "+" else left - right
        return left

    def term(self):
        left = self.factor()
        if self.peek() in ("*", "/"):
            op = self.take()
            right = self.term()
            if op == "/":
                if right == 0:
                    raise CalcError("division by zero")
                return left / right
            return left * right
        return left

    def factor(self):
        tok = self.take()
        if isinstance(tok, (int, float)):
            return tok
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise CalcError("missing closing parenthesis")
            return value
        raise CalcError(f"unexpected token {tok!r}")


def evaluate(text):
    """Evaluate the arithmetic expression `text`."""
    return Parser(tokenize(text)).parse()
