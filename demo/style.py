"""Terminal colours, switched off when the output is not a terminal or ``NO_COLOR`` is set."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

RESET = "\033[0m"
ESCAPES = re.compile(r"\033\[[0-9;]*m")
BOLD = "1"
DIM = "2"
RED = "31"
GREEN = "32"
YELLOW = "33"
BLUE = "34"
MAGENTA = "35"
CYAN = "36"


@dataclass(frozen=True)
class Style:
    enabled: bool

    @classmethod
    def detect(cls) -> Style:
        # https://no-color.org: any non-empty NO_COLOR disables colour.
        return cls(enabled=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))

    def paint(self, text: str, *codes: str) -> str:
        codes = tuple(code for code in codes if code)
        if not self.enabled or not codes:
            return text
        return f"\033[{';'.join(codes)}m{text}{RESET}"

    @staticmethod
    def plain(text: str) -> str:
        return ESCAPES.sub("", text)

    def pad(self, text: str, width: int, *codes: str) -> str:
        """Pad before painting, so escape codes do not count towards the column width."""
        return self.paint(text.ljust(width), *codes)


STYLE = Style.detect()


def say(text: str, *codes: str) -> None:
    """One line of narration; flushed so it interleaves correctly with the live feed."""
    print(STYLE.paint(text, *codes), flush=True)


def heading(text: str) -> None:
    say("")
    say(f"── {text} " + "─" * max(0, 72 - len(text)), BOLD)


def subheading(text: str) -> None:
    say("")
    say(f"▸ {text}", BOLD)


def note(text: str) -> None:
    say(f"   {text}", DIM)
