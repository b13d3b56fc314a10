"""English text for synthetic training speech: Debian's ``fortunes`` plus templated sentences.

The fortune files give varied prose, quotes and dialogue; templates add what they lack in
quantity: numbers, dates, prices, times, names and places, which Whisper writes in
characteristic ways. Texts are split by a stable hash into train and validation so that a
validation text is never heard in training.
"""

from __future__ import annotations

import glob
import hashlib
import os
import random
import re
from typing import Iterator, List

FORTUNE_DIR = "/usr/share/games/fortunes"
# Files that are mostly ASCII art, code or non-English.
_SKIP_FILES = {"art", "ascii-art", "perl", "linux", "linuxcookie", "debian", "translate-me", "zippy"}

NAMES = [
    "Alice", "Mohammed", "Priya", "Jonathan", "Mei", "Carlos", "Fatima", "Oliver", "Sofia", "Kwame",
    "Hannah", "Dmitri", "Aisha", "Lucas", "Ingrid", "Rahul", "Chloe", "Tomasz", "Yuki", "Gabriel",
    "Doctor Patel", "Professor Okafor", "Mrs. Henderson", "Captain Reyes", "Judge Whitaker",
]
PLACES = [
    "Boston", "Nairobi", "Lisbon", "Toronto", "Singapore", "Manchester", "Denver", "Melbourne",
    "Cape Town", "Dublin", "Seattle", "Mumbai", "Edinburgh", "Buenos Aires", "Oslo", "Phoenix",
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
TEMPLATES = [
    "{name} arrived in {place} on {month} {day}, {year}, with {count} suitcases.",
    "The meeting with {name} moved to {hour}:{minute:02d} on {weekday}.",
    "Our budget for {place} is {amount} dollars, about {percent} percent more than last year.",
    "Please call {name} at {phone} before {hour} o'clock.",
    "Flight {flight} to {place} leaves from gate {gate} at {hour}:{minute:02d}.",
    "In {year}, {name} sold {count} thousand copies in {place} alone.",
    "The temperature in {place} dropped to {small} degrees on {month} {day}.",
    "{name} ran the {small} kilometre race in {minute} minutes and {second} seconds.",
    "Take {small} tablets every {hour} hours, {name} said, and rest until {weekday}.",
    "Invoice number {flight} for {amount} dollars is due on {month} {day}.",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def fortunes() -> Iterator[str]:
    """Prose fortunes, one string each, whitespace normalised."""
    for path in sorted(glob.glob(os.path.join(FORTUNE_DIR, "*.u8"))):
        if os.path.basename(path)[:-3] in _SKIP_FILES:
            continue
        with open(path, encoding="utf-8", errors="ignore") as stream:
            for entry in stream.read().split("\n%\n"):
                text = " ".join(entry.split())
                text = re.sub(r"\s+--\s*[A-Z].*$", "", text)  # drop attributions
                if _is_prose(text):
                    yield text


def _is_prose(text: str) -> bool:
    if not 40 <= len(text) <= 600:
        return False
    letters = sum(c.isalpha() or c in " ,.;:'?!-\"" for c in text)
    return letters / len(text) > 0.93 and not re.search(r"[{}<>|\\_=#@*~^]", text)


def templated(rng: random.Random) -> str:
    template = rng.choice(TEMPLATES)
    return template.format(
        name=rng.choice(NAMES), place=rng.choice(PLACES), month=rng.choice(MONTHS),
        day=rng.randint(1, 28), year=rng.randint(1950, 2030), count=rng.randint(2, 90),
        hour=rng.randint(1, 12), minute=rng.randint(0, 59), second=rng.randint(0, 59),
        weekday=rng.choice(WEEKDAYS), amount=f"{rng.randint(1, 999):,}{rng.choice(['', ',000', ',500'])}",
        percent=rng.randint(2, 60), phone=f"{rng.randint(200, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
        flight=f"{rng.choice('ABCDEFGKLU')}{rng.choice('ABCDEFGKLU')} {rng.randint(10, 9999)}",
        gate=f"{rng.choice('ABCDE')}{rng.randint(1, 40)}", small=rng.randint(2, 40),
    )


def is_validation(text: str, fraction: float = 0.05) -> bool:
    """Stable text-level split (a validation text never appears in training)."""
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def passages(seed: int, words_low: int = 25, words_high: int = 75) -> Iterator[str]:
    """Endless passages of words_low..words_high words: fortunes mixed with templates."""
    rng = random.Random(seed)
    pool: List[str] = list(fortunes())
    if not pool:
        raise RuntimeError(f"no fortunes found in {FORTUNE_DIR}: apt-get install fortunes")
    while True:
        target = rng.randint(words_low, words_high)
        parts, count = [], 0
        while count < target:
            text = templated(rng) if rng.random() < 0.25 else rng.choice(pool)
            parts.append(text)
            count += len(text.split())
        yield " ".join(parts)
