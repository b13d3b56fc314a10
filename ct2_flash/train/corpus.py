"""English text for synthetic training speech, from what Debian packages ship plus templates.

- Debian's ``fortunes``: varied prose, quotes and dialogue.
- Package descriptions (``/var/lib/dpkg/status``): technical prose.
- License texts (``/usr/share/common-licenses``): formal, legal prose.
- Templates for what those lack: numbers, dates, times, money, phone and account numbers,
  addresses, names and places, which Whisper writes in characteristic ways; conversational,
  spontaneous-style sentences with hesitations and repairs; instructions and dialogue.

Texts are split by a stable hash into train and validation so that a validation text is
never heard in training.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import random
import re
from typing import Dict, Iterator, List, Optional

FORTUNE_DIR = "/usr/share/games/fortunes"
# Files that are mostly ASCII art, code or non-English.
_SKIP_FILES = {"art", "ascii-art", "perl", "linux", "linuxcookie", "debian", "translate-me", "zippy"}

NAMES = [
    "Alice",
    "Mohammed",
    "Priya",
    "Jonathan",
    "Mei",
    "Carlos",
    "Fatima",
    "Oliver",
    "Sofia",
    "Kwame",
    "Hannah",
    "Dmitri",
    "Aisha",
    "Lucas",
    "Ingrid",
    "Rahul",
    "Chloe",
    "Tomasz",
    "Yuki",
    "Gabriel",
    "Doctor Patel",
    "Professor Okafor",
    "Mrs. Henderson",
    "Captain Reyes",
    "Judge Whitaker",
]
PLACES = [
    "Boston",
    "Nairobi",
    "Lisbon",
    "Toronto",
    "Singapore",
    "Manchester",
    "Denver",
    "Melbourne",
    "Cape Town",
    "Dublin",
    "Seattle",
    "Mumbai",
    "Edinburgh",
    "Buenos Aires",
    "Oslo",
    "Phoenix",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
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


STREETS = [
    "Maple Street",
    "Oak Avenue",
    "Harbour Road",
    "Kingsway",
    "Elm Drive",
    "Station Road",
    "Church Lane",
    "Sunset Boulevard",
    "Park Place",
    "Mill Road",
    "Highland Avenue",
    "Bridge Street",
]
FILLERS = ["um", "uh", "you know", "I mean", "like", "well", "so", "actually", "basically", "sort of", "right"]
CONVERSATION = [
    "{filler}, I was going to say that {name} already, {filler}, already sent the {thing}.",
    "So we, we tried the {thing} on {weekday} and it, uh, it didn't really work.",
    "Yeah, no, I think {name} is right, {filler}, we should wait until {month}.",
    "It's about, what, {small} minutes from {place}? Maybe {small2} if the traffic is bad.",
    "Okay so the first thing, sorry, the second thing is the {thing}.",
    "I don't know, I mean, {filler}, it depends on what {name} wants to do with the {thing}.",
    "Hold on, let me, let me just check. Yes, it's {hour}:{minute:02d}, not {hour2}.",
    "Right, right. And then what happened? Well, {name} called me back around {hour} and said no.",
    "We had, I think it was {count} people, maybe {count2}, at the {thing} last {weekday}.",
    "Honestly? {filler}, I'd rather take the train to {place} than drive.",
]
THINGS = [
    "report",
    "package",
    "invoice",
    "contract",
    "presentation",
    "budget",
    "prototype",
    "survey",
    "application",
    "proposal",
    "schedule",
    "delivery",
    "update",
    "recording",
    "spreadsheet",
]
NUMBERS = [
    "Your account number is {account}, and the sort code is {sort_code}.",
    "The total comes to ${amount}.{cents:02d}, including {percent}% tax.",
    "We live at {house} {street}, {place}, postcode {postcode}.",
    "Send it to {house} {street}, apartment {small}, {place}.",
    "The reference is {letters}-{account}, issued on {day}/{month_number}/{year}.",
    "Call us on {phone} between {hour} a.m. and {hour2} p.m., Monday to Friday.",
    "Revenue rose {percent}.{small}% to {amount} million dollars in the {ordinal} quarter of {year}.",
    "The train leaves at {hour}:{minute:02d} from platform {small} and arrives at {hour2}:{minute2:02d}.",
    "It weighs {small}.{digit} kilograms and measures {count} by {count2} centimetres.",
    "Version {digit}.{small}.{count} fixed {count2} bugs and was released on {month} {day}, {year}.",
    "Room {house}, floor {small}, extension {extension}.",
    "The score was {small} to {small2} after {count} minutes.",
]
INSTRUCTIONS = [
    "First, unplug the {thing}. Then hold the button for {small} seconds until the light turns {colour}.",
    "Preheat the oven to {temperature} degrees, then bake for {count} minutes, turning once.",
    "Turn left onto {street}, continue for {small} miles, and take the {ordinal} exit at the roundabout.",
    "Take {small} tablets twice a day with food, and call {name} if the symptoms last more than {small2} days.",
    "Please enter your {digit}-digit PIN, followed by the hash key.",
    "To reset your password, open settings, choose security, and follow the steps on the screen.",
]
DIALOGUE = [
    '"Where were you on {weekday} night?" asked {name}. "At home," said {name2}, "I swear."',
    "Hi, this is {name} calling from {place}. I'm returning your call about the {thing}.",
    "Good morning, everyone, and welcome to the {ordinal} annual meeting in {place}.",
    "Thank you for calling. Your call is important to us. Please hold.",
    "Can I get a large coffee and two, no, three croissants? Thanks.",
]
COLOURS = ["red", "green", "blue", "orange", "white", "amber"]
ORDINALS = ["first", "second", "third", "fourth", "fifth"]
ALL_TEMPLATES = {
    "numbers": TEMPLATES + NUMBERS,
    "conversation": CONVERSATION,
    "instructions": INSTRUCTIONS,
    "dialogue": DIALOGUE,
}


def templated(rng: random.Random, kind: str = "numbers") -> str:
    """One sentence from a template family of ``ALL_TEMPLATES``, with random fillers."""
    return fill(rng.choice(ALL_TEMPLATES[kind]), rng)


def fill(template: str, rng: random.Random) -> str:
    """``template`` with every field drawn from ``rng``."""
    return template.format(
        name=rng.choice(NAMES),
        name2=rng.choice(NAMES),
        place=rng.choice(PLACES),
        month=rng.choice(MONTHS),
        day=rng.randint(1, 28),
        year=rng.randint(1950, 2030),
        count=rng.randint(2, 90),
        count2=rng.randint(2, 90),
        hour=rng.randint(1, 12),
        hour2=rng.randint(1, 12),
        minute=rng.randint(0, 59),
        minute2=rng.randint(0, 59),
        second=rng.randint(0, 59),
        weekday=rng.choice(WEEKDAYS),
        amount=f"{rng.randint(1, 999):,}{rng.choice(['', ',000', ',500'])}",
        cents=rng.randint(0, 99),
        percent=rng.randint(2, 60),
        phone=f"{rng.randint(200, 999)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
        flight=f"{rng.choice('ABCDEFGKLU')}{rng.choice('ABCDEFGKLU')} {rng.randint(10, 9999)}",
        gate=f"{rng.choice('ABCDE')}{rng.randint(1, 40)}",
        small=rng.randint(2, 40),
        small2=rng.randint(2, 40),
        account=" ".join(str(rng.randint(1000, 9999)) for _ in range(rng.randint(2, 4))),
        sort_code=f"{rng.randint(10, 99)}-{rng.randint(10, 99)}-{rng.randint(10, 99)}",
        house=rng.randint(1, 2400),
        street=rng.choice(STREETS),
        postcode=f"{rng.randint(10000, 99999)}",
        letters="".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(3)),
        month_number=rng.randint(1, 12),
        ordinal=rng.choice(ORDINALS),
        digit=rng.randint(1, 9),
        extension=rng.randint(100, 9999),
        thing=rng.choice(THINGS),
        filler=rng.choice(FILLERS),
        colour=rng.choice(COLOURS),
        temperature=rng.choice([160, 180, 200, 220, 350, 375, 400]),
    )


def package_descriptions(status: str = "/var/lib/dpkg/status") -> Iterator[str]:
    """Technical prose: the long descriptions of the installed Debian packages."""
    if not os.path.exists(status):
        return
    with open(status, encoding="utf-8", errors="ignore") as stream:
        text = stream.read()
    for block in re.findall(r"^Description: .*\n((?: .*\n)+)", text, re.M):
        for paragraph in block.split("\n .\n"):
            prose = " ".join(line.strip() for line in paragraph.splitlines())
            prose = re.sub(r"^[*-] ", "", prose)
            if _is_prose(prose):
                yield prose


def license_prose(directory: str = "/usr/share/common-licenses") -> Iterator[str]:
    """Formal prose: paragraphs of the license texts Debian ships."""
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="ignore") as stream:
            for paragraph in re.split(r"\n\s*\n", stream.read()):
                prose = " ".join(paragraph.split())
                if _is_prose(prose) and not prose.isupper():
                    yield prose


def is_validation(text: str, fraction: float = 0.05) -> bool:
    """Stable text-level split (a validation text never appears in training)."""
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def passages(
    seed: int, words_low: int = 25, words_high: int = 75, mix: Optional[Dict[str, float]] = None
) -> Iterator[str]:
    """Endless passages of words_low..words_high words, each sentence drawn from a source.

    ``mix`` maps a source to its share: "fortunes", "packages", "licenses" (text Debian ships)
    or a template family of ``ALL_TEMPLATES``. The default is recipe 1's: fortunes with a quarter
    of numeric templates.
    """
    rng = random.Random(seed)
    mix = mix or {"fortunes": 0.75, "numbers": 0.25}
    pools: Dict[str, List[str]] = {}
    for source in mix:
        if source in ALL_TEMPLATES:
            continue
        pools[source] = list(
            {"fortunes": fortunes, "packages": package_descriptions, "licenses": license_prose}[source]()
        )
        if not pools[source]:
            if source == "fortunes":
                raise RuntimeError(f"no fortunes found in {FORTUNE_DIR}: apt-get install fortunes")
            logging.getLogger(__name__).warning("text source %s is empty on this machine; skipped", source)
    sources = [s for s in mix if s in ALL_TEMPLATES or pools[s]]
    weights = [mix[s] for s in sources]
    while True:
        target = rng.randint(words_low, words_high)
        parts, count = [], 0
        while count < target:
            source = rng.choices(sources, weights)[0]
            text = templated(rng, source) if source in ALL_TEMPLATES else rng.choice(pools[source])
            parts.append(text)
            count += len(text.split())
        yield " ".join(parts)
