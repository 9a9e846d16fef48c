"""The grammar of kq expressions (a subset of AMPS expressions), for lark's LALR parser."""

GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr (_OR and_expr)*            -> or_
?and_expr: not_expr (_AND not_expr)*          -> and_
?not_expr: _NOT not_expr                      -> not_
         | predicate

?predicate: sum COMPARE sum                   -> compare
          | sum _LIKE sum                     -> like
          | sum _NOT _LIKE sum                -> not_like
          | sum _IN "(" sum ("," sum)* ")"    -> in_
          | sum _NOT _IN "(" sum ("," sum)* ")"    -> not_in
          | sum _BETWEEN sum _AND sum         -> between
          | sum _NOT _BETWEEN sum _AND sum    -> not_between
          | sum _IS _NULL                     -> is_null
          | sum _IS _NOT _NULL                -> is_not_null
          | sum

?sum: product (ADD_OP product)*               -> arith
?product: unary (MUL_OP unary)*               -> arith
?unary: "-" unary                             -> neg
      | atom

?atom: NUMBER                                 -> number
     | STRING                                 -> string
     | _TRUE                                  -> true
     | _FALSE                                 -> false
     | _NULL                                  -> null
     | PATH                                   -> path
     | _HEADER "(" STRING ")"                 -> header
     | FUNC "(" [sum ("," sum)*] ")"          -> call
     | "(" or_expr ")"

COMPARE: "=" | "!=" | "<>" | "<=" | ">=" | "<" | ">"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/" | "%"
PATH: /(\/[A-Za-z_][A-Za-z0-9_]*)+/
NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
STRING: /'([^']|'')*'/
FUNC.2: /(?i:UPPER|LOWER|LENGTH|COALESCE|ABS|ROUND|NOW)(?=\s*\()/

_OR.2: /(?i:OR)\b/
_AND.2: /(?i:AND)\b/
_NOT.2: /(?i:NOT)\b/
_LIKE.2: /(?i:LIKE)\b/
_IN.2: /(?i:IN)\b/
_BETWEEN.2: /(?i:BETWEEN)\b/
_IS.2: /(?i:IS)\b/
_NULL.2: /(?i:NULL)\b/
_TRUE.2: /(?i:TRUE)\b/
_FALSE.2: /(?i:FALSE)\b/
_HEADER.2: /(?i:HEADER)(?=\s*\()/

%import common.WS
%ignore WS
"""
