# llama.cpp's grammar element kinds (`llama_gretype`): the one definition the parser, the checks, the stacks
# and the mask caches read.
#
# Contract:
# - `GreType` numbers the kinds exactly as llama.cpp does; a parsed rule is a tuple of (kind, value) pairs.
# - The same numbers as plain ints (END, ALT, ...), for the inner loops: a flattened rule table holds plain
#   ints, and an int compares with an int faster than with an enum member. They are `GreType`'s values,
#   not a second numbering.
# - A leaf: imports nothing of the project, so every module of the grammar package can import it.
from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "ALT",
    "CHAR",
    "CHAR_ALT",
    "CHAR_ANY",
    "CHAR_NOT",
    "CHAR_RNG_UPPER",
    "END",
    "RULE_REF",
    "TOKEN",
    "TOKEN_NOT",
    "GreType",
]


class GreType(enum.IntEnum):
    """llama.cpp's `llama_gretype`: the kind of one grammar element."""

    END = 0  # end of a rule
    ALT = 1  # start of another alternate of the rule
    RULE_REF = 2  # value: the referenced rule's id
    CHAR = 3  # value: a code point; may be followed by CHAR_RNG_UPPER / CHAR_ALT
    CHAR_NOT = 4  # like CHAR, inverted ([^...])
    CHAR_RNG_UPPER = 5  # makes the preceding char the lower end of an inclusive range
    CHAR_ALT = 6  # another char (or range start) of the same class
    CHAR_ANY = 7  # `.`: any code point
    TOKEN = 8  # value: a token id
    TOKEN_NOT = 9  # any token but this one


END: Final = int(GreType.END)
ALT: Final = int(GreType.ALT)
RULE_REF: Final = int(GreType.RULE_REF)
CHAR: Final = int(GreType.CHAR)
CHAR_NOT: Final = int(GreType.CHAR_NOT)
CHAR_RNG_UPPER: Final = int(GreType.CHAR_RNG_UPPER)
CHAR_ALT: Final = int(GreType.CHAR_ALT)
CHAR_ANY: Final = int(GreType.CHAR_ANY)
TOKEN: Final = int(GreType.TOKEN)
TOKEN_NOT: Final = int(GreType.TOKEN_NOT)
